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

from ..common.inputs import expect_image
from ..common.layers_torch import Attention, GroupNorm
from ..common.outputs import DecoderOutput, DiagonalGaussianDistribution, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config, AutoencoderKLTiling

EPS = 1e-6  # every GroupNorm's, as diffusers' Encoder and Decoder build them


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
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3))


class ResnetBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, groups):
        super().__init__()
        self.norm1 = GroupNorm(groups, in_channels, eps=EPS)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = GroupNorm(groups, out_channels, eps=EPS)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (self.conv_shortcut(x) if self.conv_shortcut is not None else x)


class UNetMidBlock2D(nn.Module):
    def __init__(self, channels, groups, add_attention):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(channels, channels, groups) for _ in range(2)])
        self.attentions = nn.ModuleList([Attention(channels, groups)]) if add_attention else [None]

    def forward(self, x):
        x = self.resnets[0](x)
        for attention, resnet in zip(self.attentions, self.resnets[1:]):
            if attention is not None:
                x = attention(x)
            x = resnet(x)
        return x


def _resnets(in_channels, out_channels, num_layers, groups):
    """A block's resnets: the first changes the width, the others keep it."""
    return nn.ModuleList(
        [ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, groups) for i in range(num_layers)]
    )


class DownEncoderBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, num_layers, groups, add_downsample):
        super().__init__()
        self.resnets = _resnets(in_channels, out_channels, num_layers, groups)
        self.downsamplers = nn.ModuleList([Downsample2D(out_channels)]) if add_downsample else None

    def forward(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for downsampler in self.downsamplers or ():
            x = downsampler(x)
        return x


class UpDecoderBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, num_layers, groups, add_upsample):
        super().__init__()
        self.resnets = _resnets(in_channels, out_channels, num_layers, groups)
        self.upsamplers = nn.ModuleList([Upsample2D(out_channels)]) if add_upsample else None

    def forward(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for upsampler in self.upsamplers or ():
            x = upsampler(x)
        return x


class Encoder(nn.Module):
    def __init__(self, config: AutoencoderKLConfig):
        super().__init__()
        channels, groups, levels = config.block_out_channels, config.norm_num_groups, len(config.block_out_channels)
        self.conv_in = nn.Conv2d(config.in_channels, channels[0], 3, padding=1)
        self.down_blocks = nn.ModuleList(
            [
                DownEncoderBlock2D(
                    channels[max(i - 1, 0)], channels[i], config.layers_per_block, groups, i < levels - 1
                )
                for i in range(levels)
            ]
        )
        self.mid_block = UNetMidBlock2D(channels[-1], groups, config.mid_block_add_attention)
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
        self.conv_in = nn.Conv2d(config.latent_channels, channels[0], 3, padding=1)
        self.mid_block = UNetMidBlock2D(channels[0], groups, config.mid_block_add_attention)
        self.up_blocks = nn.ModuleList(
            [
                UpDecoderBlock2D(
                    channels[max(i - 1, 0)], channels[i], config.layers_per_block + 1, groups, i < len(channels) - 1
                )
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
        expect_image(x, self.config.in_channels, channels_last=False, what="encode")
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
