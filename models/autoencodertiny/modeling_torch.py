"""The tiny VAEs (diffusers' `AutoencoderTiny`: TAESD, TAESDXL, TAESD3, TAEF1) in PyTorch, channels-first, written to
run under torchax.

Parameter names and shapes are diffusers' own (`encoder.layers.N`, `decoder.layers.N`: one Sequential each, whose
activations and upsamplers hold indices too), so diffusers' `from_pretrained` reads what this model saves, and
`encode(x).latents` / `decode(z).sample` take and return (B, C, H, W) as diffusers'. The encoder takes images in
[-1, 1] to TAESD's [0, 1]; the decoder soft-clamps latents to (-3, 3) and returns images in [-1, 1]. The parts take
and return an (always empty) cache, as the chunk runner's step expects.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..common.inputs import expect_image
from ..common.outputs import DecoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import AutoencoderTinyConfig, AutoencoderTinyTiling

ACTIVATIONS = {"relu": nn.ReLU, "silu": nn.SiLU, "swish": nn.SiLU, "mish": nn.Mish, "gelu": nn.GELU}


@dataclasses.dataclass
class AutoencoderTinyOutput:
    latents: torch.Tensor


class Upsample(nn.Module):
    """diffusers' `nn.Upsample(mode="nearest")` by an integer factor, as repeats (torchax lowers nn.Upsample through
    64-bit indices, which JAX without x64 truncates, with a warning on every trace)."""

    def __init__(self, factor: int):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x.repeat_interleave(self.factor, dim=2).repeat_interleave(self.factor, dim=3)


def conv(in_channels, out_channels, bias=True, stride=1):
    return nn.Conv2d(in_channels, out_channels, 3, padding=1, stride=stride, bias=bias)


class AutoencoderTinyBlock(nn.Module):
    """Three 3x3 convolutions with the activation between them, added to the input, then a ReLU whatever the
    activation (diffusers' `fuse`). diffusers' block would project a change of width with a 1x1 `skip`; no block of
    this class changes it."""

    def __init__(self, channels, act_fn):
        super().__init__()
        act = ACTIVATIONS[act_fn]
        self.conv = nn.Sequential(
            conv(channels, channels), act(), conv(channels, channels), act(), conv(channels, channels)
        )
        self.fuse = nn.ReLU()

    def forward(self, x):
        return self.fuse(self.conv(x) + x)


class EncoderTiny(nn.Module):
    def __init__(self, config: AutoencoderTinyConfig):
        super().__init__()
        widths, act = config.encoder_block_out_channels, config.act_fn
        layers = []
        for i, (width, blocks) in enumerate(zip(widths, config.num_encoder_blocks)):
            layers.append(conv(config.in_channels, width) if i == 0 else conv(width, width, bias=False, stride=2))
            layers += [AutoencoderTinyBlock(width, act) for _ in range(blocks)]
        layers.append(conv(widths[-1], config.latent_channels))
        self.layers = nn.Sequential(*layers)

    def forward(self, x, cache=None):
        """A whole image in [-1, 1], taken to TAESD's [0, 1] (no cache: an image has no earlier frames)."""
        return self.layers(x.add(1).div(2)), None


class DecoderTiny(nn.Module):
    def __init__(self, config: AutoencoderTinyConfig):
        super().__init__()
        widths, act, last = config.decoder_block_out_channels, config.act_fn, len(config.decoder_block_out_channels) - 1
        layers = [conv(config.latent_channels, widths[0]), ACTIVATIONS[act]()]
        for i, (width, blocks) in enumerate(zip(widths, config.num_decoder_blocks)):
            layers += [AutoencoderTinyBlock(width, act) for _ in range(blocks)]
            if i < last:
                layers.append(Upsample(config.upsampling_scaling_factor))
            layers.append(conv(width, config.out_channels if i == last else width, bias=i == last))
        self.layers = nn.Sequential(*layers)

    def forward(self, x, cache=None):
        """A whole latent, soft-clamped to (-3, 3) (the original release's `Clamp`), to an image in [-1, 1]."""
        return self.layers(torch.tanh(x / 3) * 3).mul(2).sub(1), None


class AutoencoderTiny(ChunkedAutoencoder):
    tiling_class = AutoencoderTinyTiling

    def __init__(self, config: AutoencoderTinyConfig):
        super().__init__()
        self.config = config
        self.encoder = EncoderTiny(config)
        self.decoder = DecoderTiny(config)
        self.quant_conv = self.post_quant_conv = None

    def scale_latents(self, x: torch.Tensor) -> torch.Tensor:
        """Raw latents -> [0, 1], as TAESD stores them in 8 bits."""
        return x.div(2 * self.config.latent_magnitude).add(self.config.latent_shift).clamp(0, 1)

    def unscale_latents(self, x: torch.Tensor) -> torch.Tensor:
        """[0, 1] -> raw latents."""
        return x.sub(self.config.latent_shift).mul(2 * self.config.latent_magnitude)

    def encode(self, x: torch.Tensor, *, step=None) -> AutoencoderTinyOutput:
        """(B, C, H, W) images in [-1, 1] -> latents (B, latent_channels, ceil(H/r), ceil(W/r)), deterministic."""
        expect_image(x, self.config.in_channels, channels_last=False, what="encode")
        return AutoencoderTinyOutput(self.run_image("encoder", x, step))

    def decode(self, z: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, latent_channels, h, w) latents -> (B, C, h*r, w*r) images in [-1, 1]."""
        expect_image(z, self.config.latent_channels, channels_last=False, what="decode")
        return DecoderOutput(self.run_image("decoder", z, step))
