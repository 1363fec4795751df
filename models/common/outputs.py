"""The return types of diffusers' VAEs, shared by the PyTorch models: `encode(x).latent_dist`, `decode(z).sample`."""

from __future__ import annotations

import dataclasses

import torch


class DiagonalGaussianDistribution:
    """The posterior: mean and clamped log-variance, the two halves of the channels."""

    def __init__(self, parameters: torch.Tensor):
        self.mean, logvar = parameters.chunk(2, dim=1)
        self.logvar = logvar.clamp(-30.0, 20.0)
        self.std = torch.exp(0.5 * self.logvar)

    def mode(self):
        return self.mean

    def sample(self, generator=None):
        noise = torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype).to(self.mean.device)
        return self.mean + self.std * noise


@dataclasses.dataclass
class EncoderOutput:
    latent_dist: DiagonalGaussianDistribution


@dataclasses.dataclass
class DecoderOutput:
    sample: torch.Tensor
