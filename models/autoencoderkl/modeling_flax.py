"""The image VAEs of SD, SDXL, SD3, Flux.1 (diffusers' `AutoencoderKL`) and Flux.2 (`AutoencoderKLFlux2`) in Flax NNX,
channels-last: images are (B, H, W, C), latents (B, H/8, W/8, latent_channels) at the published widths.

Read it beside diffusers' `autoencoder_kl.py`, `vae.py` (Encoder, Decoder) and the 2-D blocks it builds from
(`DownEncoderBlock2D`, `UpDecoderBlock2D`, `UNetMidBlock2D`, `ResnetBlock2D`: models/common/blocks_flax.py, which
HunyuanVideo's VAE builds from too, with its own convolution; `Downsample2D`, `Upsample2D` here): modules carry the
same names (nnx's `kernel`/`scale` where PyTorch says `weight`). An image has no time axis and no cache:
each part runs in one step (models/common/steps_flax.py), tile by tile when tiling is on. The mid-block attention is
computed in blocks with a running softmax, so its (H*W)^2 score matrix is never held whole.
Kernels start at zero, not random: the model exists to be filled from a checkpoint.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ..common.blocks_flax import EPS, DownBlock, MidBlock, UpBlock
from ..common.conv import cpu_conv
from ..common.inputs import expect_image
from ..common.layers_flax import BatchNorm2d, Conv, GroupNorm, UpsampledConv, silu
from ..common.steps_flax import run_image
from ..common.tiling import TilingMixin
from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config, AutoencoderKLTiling


def conv2d(in_channels, out_channels, kernel_size, *, strides=1, padding=None, rngs, param_dtype):
    """nnx.Conv as diffusers' nn.Conv2d: `padding` (top, bottom), (left, right) zeros, by default k // 2 around."""
    k = kernel_size
    return Conv(
        in_channels,
        out_channels,
        (k, k),
        strides=strides,
        padding=padding or ((k // 2, k // 2),) * 2,
        kernel_init=nnx.initializers.zeros,
        rngs=rngs,
        param_dtype=param_dtype,
        conv_general_dilated=cpu_conv,
    )


class Downsample2D(nnx.Module):
    """A stride-2 3x3 convolution after one row and one column of zeros on the bottom and right only (diffusers pads
    (0, 1, 0, 1) and convolves with no padding of its own): not a centred padding."""

    def __init__(self, channels, *, rngs, param_dtype):
        self.conv = conv2d(
            channels, channels, 3, strides=2, padding=((0, 1), (0, 1)), rngs=rngs, param_dtype=param_dtype
        )

    def __call__(self, x):
        return self.conv(x)


class Upsample2D(nnx.Module):
    """Nearest-neighbour upsampling by 2, then a 3x3 convolution."""

    def __init__(self, channels, *, rngs, param_dtype):
        self.conv = UpsampledConv(channels, channels, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, x):
        return self.conv(x)


class Encoder(nnx.Module):
    def __init__(self, config: AutoencoderKLConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        channels, groups, levels = config.block_out_channels, config.norm_num_groups, len(config.block_out_channels)
        self.conv_in = conv2d(config.in_channels, channels[0], 3, **kw)
        self.down_blocks = nnx.List(
            [
                DownBlock(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block,
                    groups,
                    conv2d,
                    Downsample2D(channels[i], **kw) if i < levels - 1 else None,
                    **kw,
                )  # fmt: skip
                for i in range(levels)
            ]
        )
        self.mid_block = MidBlock(channels[-1], groups, config.mid_block_add_attention, conv2d, **kw)
        self.conv_norm_out = GroupNorm(groups, channels[-1], EPS, param_dtype=param_dtype)
        self.conv_out = conv2d(channels[-1], 2 * config.latent_channels, 3, **kw)

    def __call__(self, x, cache=None):
        """A whole image (no cache: an image has no earlier frames)."""
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(silu(self.conv_norm_out(x))), None


class Decoder(nnx.Module):
    def __init__(self, config: AutoencoderKLConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        groups = config.norm_num_groups
        channels = list(reversed(config.decoder_widths))
        self.conv_in = conv2d(config.latent_channels, channels[0], 3, **kw)
        self.mid_block = MidBlock(channels[0], groups, config.mid_block_add_attention, conv2d, **kw)
        self.up_blocks = nnx.List(
            [
                UpBlock(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block + 1,
                    groups,
                    conv2d,
                    Upsample2D(channels[i], **kw) if i < len(channels) - 1 else None,
                    **kw,
                )  # fmt: skip
                for i in range(len(channels))
            ]
        )
        self.conv_norm_out = GroupNorm(groups, channels[-1], EPS, param_dtype=param_dtype)
        self.conv_out = conv2d(channels[-1], config.out_channels, 3, **kw)

    def __call__(self, x, cache=None):
        """A whole latent (no cache)."""
        x = self.mid_block(self.conv_in(x))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(silu(self.conv_norm_out(x))), None


class AutoencoderKL(TilingMixin, nnx.Module):
    tiling_class = AutoencoderKLTiling

    def __init__(self, config: AutoencoderKLConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        latent = config.latent_channels
        self.config = config
        self.encoder = Encoder(config, **kw)
        self.decoder = Decoder(config, **kw)
        self.quant_conv = conv2d(2 * latent, 2 * latent, 1, **kw) if config.use_quant_conv else None
        self.post_quant_conv = conv2d(latent, latent, 1, **kw) if config.use_post_quant_conv else None

    def encode(self, x, *, mesh=None):
        """(B, H, W, C) images in [-1, 1] -> (mean, logvar), each (B, ceil(H/r), ceil(W/r), latent_channels), r the
        config's spatial ratio (any size, as diffusers: each downsampler pads odd sizes at the bottom and right)."""
        expect_image(x, self.config.in_channels, channels_last=True, what="encode", **self.config.encode_input_limits)
        mean, logvar = jnp.split(run_image(self, "encoder", x, mesh), 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, z, *, mesh=None):
        """(B, h, w, latent_channels) latents -> (B, h*r, w*r, C) images (unclamped, as diffusers)."""
        expect_image(z, self.config.latent_channels, channels_last=True, what="decode")
        return run_image(self, "decoder", z, mesh)


class AutoencoderKLFlux2(AutoencoderKL):
    """AutoencoderKL with Flux.2's BatchNorm `bn`, which the model never applies: Flux.2's pipelines patchify a
    latent (B, h, w, C) into (B, h/2, w/2, 4C), channel-major as diffusers does, and normalise it with `bn`."""

    def __init__(self, config: AutoencoderKLFlux2Config, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        super().__init__(config, rngs=rngs, param_dtype=param_dtype)
        self.bn = BatchNorm2d(config.batch_norm_channels, config.batch_norm_eps, param_dtype=param_dtype)
