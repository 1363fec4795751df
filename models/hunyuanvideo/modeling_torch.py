"""HunyuanVideo video VAE (diffusers' `AutoencoderKLHunyuanVideo`) in PyTorch, channels-first, written to run under
torchax.

Parameter names and shapes are diffusers' own, so `AutoencoderKLHunyuanVideo.from_pretrained` reads what this model
saves, and `encode(x).latent_dist` / `decode(z).sample` behave the same, framewise tiling on by default included.
Differences from diffusers: GroupNorm statistics are taken in float32 whatever the input dtype; the encoder and the
decoder take and return a (always empty) cache, as the chunk runner's step expects, so torchax can jit them; the
attention mask is built from frame indices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.blocks_torch import DownBlock, MidBlock, UpBlock
from ..common.inputs import expect_video
from ..common.layers_torch import GroupNorm, pad_edges, upsampled_conv
from ..common.outputs import DecoderOutput, DiagonalGaussianDistribution, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import HunyuanVideoTiling, HunyuanVideoVAEConfig


class HunyuanVideoCausalConv3d(nn.Module):
    """Conv3d after replicate padding: k-1 copies of the first frame in front, k//2 edge rows and columns around."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1):
        super().__init__()
        k = kernel_size
        self.padding = ((k - 1, 0), (k // 2, k // 2), (k // 2, k // 2))
        self.conv = nn.Conv3d(in_channels, out_channels, k, stride)

    def forward(self, x):
        return self.conv(pad_edges(x, self.padding))


class HunyuanVideoUpsampleCausal3D(nn.Module):
    """Nearest upsampling by (time, space) factors, the first frame in space only, then a causal conv; upsampled in
    space, the conv takes the input before it (models/common/layers_torch.py, upsampled_conv)."""

    def __init__(self, in_channels, out_channels, factors):
        super().__init__()
        self.factors = factors
        self.conv = HunyuanVideoCausalConv3d(in_channels, out_channels, 3)

    def forward(self, x):
        time, space = self.factors
        if x.shape[2] > 1:
            x = torch.cat([x[:, :, :1], x[:, :, 1:].repeat_interleave(time, dim=2)], dim=2)
        if space == 1:
            return self.conv(x)
        x = pad_edges(x, (self.conv.padding[0], (0, 0), (0, 0)))  # the causal conv's frames in front
        return upsampled_conv(x, self.conv.conv.weight, self.conv.conv.bias, True)


class HunyuanVideoDownsampleCausal3D(nn.Module):
    def __init__(self, channels, strides):
        super().__init__()
        time, space = strides
        self.conv = HunyuanVideoCausalConv3d(channels, channels, 3, (time, space, space))

    def forward(self, x):
        return self.conv(x)


class HunyuanVideoEncoder3D(nn.Module):
    def __init__(self, config: HunyuanVideoVAEConfig):
        super().__init__()
        channels, groups = config.block_out_channels, config.norm_num_groups
        conv = HunyuanVideoCausalConv3d
        self.conv_in = conv(config.in_channels, channels[0], 3)
        self.down_blocks = nn.ModuleList(
            [
                DownBlock(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block,
                    groups,
                    conv,
                    HunyuanVideoDownsampleCausal3D(channels[i], s) if s else None,
                )  # fmt: skip
                for i, s in enumerate(config.down_strides())
            ]
        )
        self.mid_block = MidBlock(channels[-1], groups, config.mid_block_add_attention, conv)
        self.conv_norm_out = GroupNorm(groups, channels[-1], eps=1e-6)
        self.conv_out = HunyuanVideoCausalConv3d(channels[-1], 2 * config.latent_channels, 3)

    def forward(self, x, cache=None):
        """A whole clip (no cache: the attention sees every frame)."""
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x))), None


class HunyuanVideoDecoder3D(nn.Module):
    def __init__(self, config: HunyuanVideoVAEConfig):
        super().__init__()
        groups = config.norm_num_groups
        channels = list(reversed(config.block_out_channels))
        conv = HunyuanVideoCausalConv3d
        self.conv_in = conv(config.latent_channels, channels[0], 3)
        self.mid_block = MidBlock(channels[0], groups, config.mid_block_add_attention, conv)
        self.up_blocks = nn.ModuleList(
            [
                UpBlock(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block + 1,
                    groups,
                    conv,
                    HunyuanVideoUpsampleCausal3D(channels[i], channels[i], f) if f else None,
                )  # fmt: skip
                for i, f in enumerate(config.up_factors())
            ]
        )
        self.conv_norm_out = GroupNorm(groups, channels[-1], eps=1e-6)
        self.conv_out = HunyuanVideoCausalConv3d(channels[-1], config.out_channels, 3)

    def forward(self, x, cache=None):
        """A whole clip (no cache: the attention sees every frame)."""
        x = self.mid_block(self.conv_in(x))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x))), None


class AutoencoderKLHunyuanVideo(ChunkedAutoencoder):
    tiling_class = HunyuanVideoTiling

    def __init__(self, config: HunyuanVideoVAEConfig):
        super().__init__()
        latent = config.latent_channels
        self.config = config
        self.encoder = HunyuanVideoEncoder3D(config)
        self.decoder = HunyuanVideoDecoder3D(config)
        self.quant_conv = nn.Conv3d(2 * latent, 2 * latent, 1)
        self.post_quant_conv = nn.Conv3d(latent, latent, 1)
        # diffusers' defaults: clips longer than one temporal tile go in overlapping temporal tiles
        self.use_framewise_encoding = True
        self.use_framewise_decoding = True

    def encode(self, x: torch.Tensor, *, step=None) -> EncoderOutput:
        """(B, C, T, H, W) video; `step` runs one clip or temporal tile (see ChunkedAutoencoder.run_chunks)."""
        expect_video(x, self.config.in_channels, channels_last=False, what="encode")
        frames = (x.shape[2] - 1) // self.config.temporal_compression_ratio + 1
        moments = self.run_clip("encoder", x, frames, self.use_framewise_encoding, step)
        return EncoderOutput(DiagonalGaussianDistribution(moments))

    def decode(self, z: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, latent_channels, T, H, W) latents; not clamped, as in diffusers."""
        expect_video(z, self.config.latent_channels, channels_last=False, what="decode")
        frames = (z.shape[2] - 1) * self.config.temporal_compression_ratio + 1
        return DecoderOutput(self.run_clip("decoder", z, frames, self.use_framewise_decoding, step))
