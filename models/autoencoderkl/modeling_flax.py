"""The image VAEs of SD, SDXL, SD3, Flux.1 (diffusers' `AutoencoderKL`) and Flux.2 (`AutoencoderKLFlux2`) in Flax NNX,
channels-last: images are (B, H, W, C), latents (B, H/8, W/8, latent_channels) at the published widths.

Read it beside diffusers' `autoencoder_kl.py`, `vae.py` (Encoder, Decoder) and the 2-D blocks it builds from
(`DownEncoderBlock2D`, `UpDecoderBlock2D`, `UNetMidBlock2D`, `ResnetBlock2D`, `Downsample2D`, `Upsample2D`): modules
carry the same names (nnx's `kernel`/`scale` where PyTorch says `weight`). An image has no time axis and no cache:
each part runs in one step (models/common/steps_flax.py), tile by tile when tiling is on. The mid-block attention is
computed in blocks with a running softmax, so its (H*W)^2 score matrix is never held whole.
Kernels start at zero, not random: the model exists to be filled from a checkpoint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ..common.conv import cpu_conv
from ..common.inputs import expect_image
from ..common.layers_flax import Attention, BatchNorm2d, GroupNorm
from ..common.steps_flax import run_image
from ..common.tiling import TilingMixin
from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config, AutoencoderKLTiling

EPS = 1e-6  # every GroupNorm's, as diffusers' Encoder and Decoder build them


def conv2d(in_channels, out_channels, kernel_size, *, strides=1, padding=None, rngs, param_dtype):
    """nnx.Conv as diffusers' nn.Conv2d: `padding` (top, bottom), (left, right) zeros, by default k // 2 around."""
    k = kernel_size
    return nnx.Conv(
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
        self.conv = conv2d(channels, channels, 3, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, x):
        return self.conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2))


class ResnetBlock2D(nnx.Module):
    def __init__(self, in_channels, out_channels, groups, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm1 = GroupNorm(groups, in_channels, EPS, param_dtype=param_dtype)
        self.conv1 = conv2d(in_channels, out_channels, 3, **kw)
        self.norm2 = GroupNorm(groups, out_channels, EPS, param_dtype=param_dtype)
        self.conv2 = conv2d(out_channels, out_channels, 3, **kw)
        self.conv_shortcut = conv2d(in_channels, out_channels, 1, **kw) if in_channels != out_channels else None

    def __call__(self, x):
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        h = self.conv2(jax.nn.silu(self.norm2(h)))
        return h + (self.conv_shortcut(x) if self.conv_shortcut is not None else x)


class UNetMidBlock2D(nnx.Module):
    def __init__(self, channels, groups, add_attention, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.resnets = nnx.List([ResnetBlock2D(channels, channels, groups, **kw) for _ in range(2)])
        self.attentions = nnx.List([Attention(channels, groups, **kw) if add_attention else None])

    def __call__(self, x):
        x = self.resnets[0](x)
        for attention, resnet in zip(self.attentions, self.resnets[1:]):
            if attention is not None:
                x = attention(x)
            x = resnet(x)
        return x


def _resnets(in_channels, out_channels, num_layers, groups, **kw):
    """A block's resnets: the first changes the width, the others keep it."""
    return nnx.List(
        [ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, groups, **kw) for i in range(num_layers)]
    )


class DownEncoderBlock2D(nnx.Module):
    def __init__(self, in_channels, out_channels, num_layers, groups, add_downsample, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.resnets = _resnets(in_channels, out_channels, num_layers, groups, **kw)
        self.downsamplers = nnx.List([Downsample2D(out_channels, **kw)]) if add_downsample else None

    def __call__(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for downsampler in self.downsamplers or ():
            x = downsampler(x)
        return x


class UpDecoderBlock2D(nnx.Module):
    def __init__(self, in_channels, out_channels, num_layers, groups, add_upsample, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.resnets = _resnets(in_channels, out_channels, num_layers, groups, **kw)
        self.upsamplers = nnx.List([Upsample2D(out_channels, **kw)]) if add_upsample else None

    def __call__(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for upsampler in self.upsamplers or ():
            x = upsampler(x)
        return x


class Encoder(nnx.Module):
    def __init__(self, config: AutoencoderKLConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        channels, groups, levels = config.block_out_channels, config.norm_num_groups, len(config.block_out_channels)
        self.conv_in = conv2d(config.in_channels, channels[0], 3, **kw)
        self.down_blocks = nnx.List(
            [
                DownEncoderBlock2D(
                    channels[max(i - 1, 0)], channels[i], config.layers_per_block, groups, i < levels - 1, **kw
                )
                for i in range(levels)
            ]
        )
        self.mid_block = UNetMidBlock2D(channels[-1], groups, config.mid_block_add_attention, **kw)
        self.conv_norm_out = GroupNorm(groups, channels[-1], EPS, param_dtype=param_dtype)
        self.conv_out = conv2d(channels[-1], 2 * config.latent_channels, 3, **kw)

    def __call__(self, x, cache=None):
        """A whole image (no cache: an image has no earlier frames)."""
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(jax.nn.silu(self.conv_norm_out(x))), None


class Decoder(nnx.Module):
    def __init__(self, config: AutoencoderKLConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        groups = config.norm_num_groups
        channels = list(reversed(config.decoder_widths))
        self.conv_in = conv2d(config.latent_channels, channels[0], 3, **kw)
        self.mid_block = UNetMidBlock2D(channels[0], groups, config.mid_block_add_attention, **kw)
        self.up_blocks = nnx.List(
            [
                UpDecoderBlock2D(
                    channels[max(i - 1, 0)],
                    channels[i],
                    config.layers_per_block + 1,
                    groups,
                    i < len(channels) - 1,
                    **kw,
                )
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
        return self.conv_out(jax.nn.silu(self.conv_norm_out(x))), None


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
        expect_image(x, self.config.in_channels, channels_last=True, what="encode")
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
