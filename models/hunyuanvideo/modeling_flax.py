"""HunyuanVideo video VAE (diffusers' `AutoencoderKLHunyuanVideo`) in Flax NNX, channels-last: videos are
(B, T, H, W, C).

Read it beside diffusers' `autoencoder_kl_hunyuan_video.py`: modules carry the same names (nnx's `kernel`/`scale`
where PyTorch says `weight`). Unlike Wan and CogVideoX, the model has no causal cache: its mid blocks attend over every
frame, so the encoder and the decoder each run a whole clip in one step, and long clips go in diffusers' overlapping
temporal tiles (framewise encoding and decoding, on by default as in diffusers). Convolutions pad by repeating the
edge (replicate) in time, height and width. The mid-block attention is computed in blocks with a running softmax, so
its T*H*W x T*H*W score matrix is never held whole.
Kernels start at zero, not random: the model exists to be filled from a checkpoint.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ..common.blocks_flax import DownBlock, MidBlock, UpBlock
from ..common.conv import prepadded_conv
from ..common.inputs import expect_video
from ..common.layers_flax import Conv, GroupNorm, silu
from ..common.steps_flax import run_clip
from ..common.tiling import TilingMixin
from .config import HunyuanVideoTiling, HunyuanVideoVAEConfig


class HunyuanVideoCausalConv3d(nnx.Module):
    """Conv3d after replicate padding: k-1 copies of the first frame in front, k//2 edge rows and columns around."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=(1, 1, 1), *, rngs, param_dtype):
        self.kernel_size = kernel_size
        self.conv = Conv(
            in_channels,
            out_channels,
            (kernel_size,) * 3,
            strides=stride,
            padding=((0, 0),) * 3,
            kernel_init=nnx.initializers.zeros,
            rngs=rngs,
            param_dtype=param_dtype,
            conv_general_dilated=prepadded_conv,
        )

    def __call__(self, x):
        k = self.kernel_size
        if k > 1:
            x = jnp.pad(x, ((0, 0), (k - 1, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)), mode="edge")
        return self.conv(x)


class HunyuanVideoUpsampleCausal3D(nnx.Module):
    """Nearest upsampling by (time, space) factors, the first frame in space only, then a causal conv; upsampled in
    space, the conv takes the input before it (models/common/conv.py, upsampled_conv: off the CPU by output phase)."""

    def __init__(self, in_channels, out_channels, factors, *, rngs, param_dtype):
        self.factors = factors
        self.conv = HunyuanVideoCausalConv3d(in_channels, out_channels, 3, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, x):
        time, space = self.factors
        if x.shape[1] > 1:
            x = jnp.concatenate([x[:, :1], jnp.repeat(x[:, 1:], time, axis=1)], axis=1)
        if space == 1:
            return self.conv(x)
        first_frames = (self.conv.kernel_size - 1, 0)  # the causal conv's, in front
        x = jnp.pad(x, ((0, 0), first_frames, (0, 0), (0, 0), (0, 0)), mode="edge")
        return self.conv.conv.upsampled(x, edge=True)


class HunyuanVideoDownsampleCausal3D(nnx.Module):
    def __init__(self, channels, strides, *, rngs, param_dtype):
        time, space = strides
        self.conv = HunyuanVideoCausalConv3d(
            channels, channels, 3, (time, space, space), rngs=rngs, param_dtype=param_dtype
        )

    def __call__(self, x):
        return self.conv(x)


class HunyuanVideoEncoder3D(nnx.Module):
    def __init__(self, config: HunyuanVideoVAEConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        channels, groups = config.block_out_channels, config.norm_num_groups
        conv = HunyuanVideoCausalConv3d
        self.conv_in = conv(config.in_channels, channels[0], 3, **kw)
        self.down_blocks = nnx.List(
            [
                DownBlock(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block,
                    groups,
                    conv,
                    HunyuanVideoDownsampleCausal3D(channels[i], s, **kw) if s else None,
                    **kw,
                )  # fmt: skip
                for i, s in enumerate(config.down_strides())
            ]
        )
        self.mid_block = MidBlock(channels[-1], groups, config.mid_block_add_attention, conv, **kw)
        self.conv_norm_out = GroupNorm(groups, channels[-1], 1e-6, param_dtype=param_dtype)
        self.conv_out = HunyuanVideoCausalConv3d(channels[-1], 2 * config.latent_channels, 3, **kw)

    def __call__(self, x, cache=None):
        """A whole clip (no cache: the attention sees every frame)."""
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(silu(self.conv_norm_out(x))), None


class HunyuanVideoDecoder3D(nnx.Module):
    def __init__(self, config: HunyuanVideoVAEConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        groups = config.norm_num_groups
        channels = list(reversed(config.block_out_channels))
        conv = HunyuanVideoCausalConv3d
        self.conv_in = conv(config.latent_channels, channels[0], 3, **kw)
        self.mid_block = MidBlock(channels[0], groups, config.mid_block_add_attention, conv, **kw)
        self.up_blocks = nnx.List(
            [
                UpBlock(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block + 1,
                    groups,
                    conv,
                    HunyuanVideoUpsampleCausal3D(channels[i], channels[i], f, **kw) if f else None,
                    **kw,
                )  # fmt: skip
                for i, f in enumerate(config.up_factors())
            ]
        )
        self.conv_norm_out = GroupNorm(groups, channels[-1], 1e-6, param_dtype=param_dtype)
        self.conv_out = HunyuanVideoCausalConv3d(channels[-1], config.out_channels, 3, **kw)

    def __call__(self, x, cache=None):
        """A whole clip (no cache: the attention sees every frame)."""
        x = self.mid_block(self.conv_in(x))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(silu(self.conv_norm_out(x))), None


class AutoencoderKLHunyuanVideo(TilingMixin, nnx.Module):
    tiling_class = HunyuanVideoTiling

    def __init__(self, config: HunyuanVideoVAEConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        latent = config.latent_channels
        self.config = config
        self.encoder = HunyuanVideoEncoder3D(config, **kw)
        self.decoder = HunyuanVideoDecoder3D(config, **kw)
        conv = dict(kernel_init=nnx.initializers.zeros, conv_general_dilated=prepadded_conv, **kw)
        self.quant_conv = Conv(2 * latent, 2 * latent, (1, 1, 1), **conv)
        self.post_quant_conv = Conv(latent, latent, (1, 1, 1), **conv)
        # diffusers' defaults: clips longer than one temporal tile go in overlapping temporal tiles
        self.use_framewise_encoding = True
        self.use_framewise_decoding = True

    def encode(self, x, *, mesh=None):
        """(B, T, H, W, C) video -> (mean, logvar), each (B, 1 + (T-1)//4, H/8, W/8, latent_channels)."""
        expect_video(x, self.config.in_channels, channels_last=True, what="encode")
        frames = (x.shape[1] - 1) // self.config.temporal_compression_ratio + 1
        moments = run_clip(self, "encoder", x, frames, self.use_framewise_encoding, mesh)
        mean, logvar = jnp.split(moments, 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, z, *, mesh=None):
        """(B, T, H, W, latent_channels) latents -> (B, 1 + 4*(T-1), 8H, 8W, C) video (unclamped, as diffusers)."""
        expect_video(z, self.config.latent_channels, channels_last=True, what="decode")
        frames = (z.shape[1] - 1) * self.config.temporal_compression_ratio + 1
        return run_clip(self, "decoder", z, frames, self.use_framewise_decoding, mesh)
