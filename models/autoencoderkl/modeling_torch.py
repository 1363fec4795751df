"""The image VAEs of SD, SDXL, SD3, Flux.1 (diffusers' `AutoencoderKL`) and Flux.2 (`AutoencoderKLFlux2`) in PyTorch,
channels-first, written to run under torchax.

Parameter names and shapes are diffusers' own, so diffusers' `from_pretrained` reads what these models save, and
`encode(x).latent_dist` / `decode(z).sample` take and return (B, C, H, W) as diffusers'. Differences from diffusers:
GroupNorm statistics are taken in float32 whatever the input dtype; the encoder and the decoder take and return a
(always empty) cache, as the chunk runner's step expects, so torchax can jit them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.blocks_torch import EPS, DownBlock, MidBlock, UpBlock
from ..common.inputs import expect_image
from ..common.layers_torch import GroupNorm, UpsampledConv2d
from ..common.outputs import DecoderOutput, DiagonalGaussianDistribution, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config, AutoencoderKLTiling


class Downsample2D(nn.Module):
    """A stride-2 3x3 convolution after one row and one column of zeros on the bottom and right only."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample2D(nn.Module):
    """Nearest-neighbour upsampling by 2, then a 3x3 convolution."""

    def __init__(self, channels):
        super().__init__()
        self.conv = UpsampledConv2d(channels, channels)

    def forward(self, x):
        return self.conv(x)


def conv2d(in_channels, out_channels, kernel_size):
    """diffusers' nn.Conv2d with `kernel_size // 2` zeros around."""
    return nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)


class Encoder(nn.Module):
    def __init__(self, config: AutoencoderKLConfig):
        super().__init__()
        channels, groups, levels = config.block_out_channels, config.norm_num_groups, len(config.block_out_channels)
        self.conv_in = conv2d(config.in_channels, channels[0], 3)
        self.down_blocks = nn.ModuleList(
            [
                DownBlock(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block,
                    groups,
                    conv2d,
                    Downsample2D(channels[i]) if i < levels - 1 else None,
                )  # fmt: skip
                for i in range(levels)
            ]
        )
        self.mid_block = MidBlock(channels[-1], groups, config.mid_block_add_attention, conv2d)
        self.conv_norm_out = GroupNorm(groups, channels[-1], eps=EPS)
        self.conv_out = nn.Conv2d(channels[-1], 2 * config.latent_channels, 3, padding=1)

    def forward(self, x, cache=None):
        """A whole image (no cache: an image has no earlier frames)."""
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x))), None


class Decoder(nn.Module):
    def __init__(self, config: AutoencoderKLConfig):
        super().__init__()
        groups = config.norm_num_groups
        channels = list(reversed(config.decoder_widths))
        self.conv_in = conv2d(config.latent_channels, channels[0], 3)
        self.mid_block = MidBlock(channels[0], groups, config.mid_block_add_attention, conv2d)
        self.up_blocks = nn.ModuleList(
            [
                UpBlock(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block + 1,
                    groups,
                    conv2d,
                    Upsample2D(channels[i]) if i < len(channels) - 1 else None,
                )  # fmt: skip
                for i in range(len(channels))
            ]
        )
        self.conv_norm_out = GroupNorm(groups, channels[-1], eps=EPS)
        self.conv_out = nn.Conv2d(channels[-1], config.out_channels, 3, padding=1)

    def forward(self, x, cache=None):
        """A whole latent (no cache)."""
        x = self.mid_block(self.conv_in(x))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x))), None


class AutoencoderKL(ChunkedAutoencoder):
    tiling_class = AutoencoderKLTiling

    def __init__(self, config: AutoencoderKLConfig):
        super().__init__()
        latent = config.latent_channels
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quant_conv = nn.Conv2d(2 * latent, 2 * latent, 1) if config.use_quant_conv else None
        self.post_quant_conv = nn.Conv2d(latent, latent, 1) if config.use_post_quant_conv else None

    def encode(self, x: torch.Tensor, *, step=None) -> EncoderOutput:
        """(B, C, H, W) images; `step` runs the encoder (see ChunkedAutoencoder.run_image)."""
        expect_image(x, self.config.in_channels, channels_last=False, what="encode", **self.config.encode_input_limits)
        return EncoderOutput(DiagonalGaussianDistribution(self.run_image("encoder", x, step)))

    def decode(self, z: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, latent_channels, h, w) latents; not clamped, as in diffusers."""
        expect_image(z, self.config.latent_channels, channels_last=False, what="decode")
        return DecoderOutput(self.run_image("decoder", z, step))


class AutoencoderKLFlux2(AutoencoderKL):
    """AutoencoderKL with Flux.2's BatchNorm `bn`, which the model never applies: Flux.2's pipelines normalise the
    patchified latents with its running statistics."""

    def __init__(self, config: AutoencoderKLFlux2Config):
        super().__init__(config)
        self.bn = nn.BatchNorm2d(
            config.batch_norm_channels,
            eps=config.batch_norm_eps,
            momentum=config.batch_norm_momentum,
            affine=False,
            track_running_stats=True,
        )
