"""LTX-2's audio VAE (diffusers' `AutoencoderKLLTX2Audio`) in Flax NNX, channels-last: mel spectrograms are
(B, T, mel bins, 2), latents (B, T/4, mel/4, 8), diffusers' arrays with the channel axis moved last.

Read it beside diffusers' `autoencoder_kl_ltx2_audio.py`: modules carry its names (nnx's `kernel`/`scale` where
PyTorch says `weight`). Causal convolutions pad the start of the causal axis (time, by default) only; the decoder
crops or pads its output to 4T - 3 frames and the configured mel bins. A spectrogram runs whole, as in diffusers, in
one step (models/common/steps_flax.py). Kernels start at zero: the model exists to be filled from a checkpoint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ..common.attention import attention
from ..common.conv import cpu_conv
from ..common.inputs import expect_image
from ..common.layers_flax import Buffer, Conv, GroupNorm, silu
from ..common.steps_flax import run_image
from ..common.tiling import TilingMixin
from .config import AutoencoderKLLTX2AudioConfig, causal_padding, decoded_size, downsample_padding, upsample_crop


def conv(in_channels, out_channels, kernel_size, *, padding=((0, 0), (0, 0)), strides=1, rngs, param_dtype):
    return Conv(
        in_channels,
        out_channels,
        (kernel_size, kernel_size),
        strides=strides,
        padding=padding,
        kernel_init=nnx.initializers.zeros,
        rngs=rngs,
        param_dtype=param_dtype,
        conv_general_dilated=cpu_conv,
    )


class LTX2AudioCausalConv2d(nnx.Module):
    """A 2-D convolution after zeros on the causal axis's start only."""

    def __init__(self, in_channels, out_channels, kernel_size, axis, *, rngs, param_dtype):
        padding = causal_padding(axis, kernel_size)
        self.conv = conv(in_channels, out_channels, kernel_size, padding=padding, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, x):
        return self.conv(x)


class LTX2AudioPixelNorm(nnx.Module):
    """x over the root mean square of its channels at each position (no parameters), in float32."""

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def norm(config: AutoencoderKLLTX2AudioConfig, channels: int, param_dtype):
    return (
        LTX2AudioPixelNorm() if config.norm_type == "pixel" else GroupNorm(32, channels, 1e-6, param_dtype=param_dtype)
    )


class LTX2AudioResnetBlock(nnx.Module):
    def __init__(self, config, in_channels, out_channels, *, rngs, param_dtype):
        kw, axis = dict(rngs=rngs, param_dtype=param_dtype), config.causality_axis
        self.norm1 = norm(config, in_channels, param_dtype)
        self.conv1 = LTX2AudioCausalConv2d(in_channels, out_channels, 3, axis, **kw)
        self.norm2 = norm(config, out_channels, param_dtype)
        self.conv2 = LTX2AudioCausalConv2d(out_channels, out_channels, 3, axis, **kw)
        self.nin_shortcut = (
            LTX2AudioCausalConv2d(in_channels, out_channels, 1, axis, **kw) if in_channels != out_channels else None
        )

    def __call__(self, x):
        h = self.conv1(silu(self.norm1(x)))
        h = self.conv2(silu(self.norm2(h)))
        return h + (self.nin_shortcut(x) if self.nin_shortcut is not None else x)


class LTX2AudioAttnBlock(nnx.Module):
    """One head over every (time, mel) position, 1x1 convolutions for its projections, the input added back; in
    blocks with a running softmax (models/common/attention.py), no score matrix held whole."""

    def __init__(self, config, channels, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm = norm(config, channels, param_dtype)
        self.q, self.k, self.v, self.proj_out = (conv(channels, channels, 1, **kw) for _ in range(4))

    def __call__(self, x):
        h = self.norm(x)
        b, t, f, c = x.shape
        q, k, v = (proj(h).reshape(b, t * f, c) for proj in (self.q, self.k, self.v))
        return x + self.proj_out(attention(q, k, v).reshape(b, t, f, c))


class LTX2AudioDownsample(nnx.Module):
    def __init__(self, channels, axis, *, rngs, param_dtype):
        padding = downsample_padding(axis)
        self.conv = conv(channels, channels, 3, padding=padding, strides=2, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, x):
        return self.conv(x)


class LTX2AudioUpsample(nnx.Module):
    def __init__(self, channels, axis, *, rngs, param_dtype):
        self.crop = upsample_crop(axis)
        self.conv = LTX2AudioCausalConv2d(channels, channels, 3, axis, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, x):
        x = self.conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2))
        return x[:, self.crop[0] :, self.crop[1] :]


class Level(nnx.Module):
    """A level's resnets, each followed by attention where the level has it, then its sampler (or none)."""

    def __init__(self, config, in_channels, out_channels, blocks, attention, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        widths = [in_channels] + [out_channels] * blocks
        self.block = nnx.List([LTX2AudioResnetBlock(config, i, o, **kw) for i, o in zip(widths[:-1], widths[1:])])
        self.attn = nnx.List(
            [LTX2AudioAttnBlock(config, out_channels, **kw) for _ in range(blocks)] if attention else []
        )

    def __call__(self, x):
        for n, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[n](x)
        return x


class Mid(nnx.Module):
    def __init__(self, config, channels, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.block_1 = LTX2AudioResnetBlock(config, channels, channels, **kw)
        self.attn_1 = LTX2AudioAttnBlock(config, channels, **kw) if config.mid_block_add_attention else None
        self.block_2 = LTX2AudioResnetBlock(config, channels, channels, **kw)

    def __call__(self, x):
        x = self.block_1(x)
        return self.block_2(self.attn_1(x) if self.attn_1 is not None else x)


class LTX2AudioEncoder(nnx.Module):
    def __init__(self, config: AutoencoderKLLTX2AudioConfig, *, rngs, param_dtype):
        kw, axis = dict(rngs=rngs, param_dtype=param_dtype), config.causality_axis
        widths, last = config.widths, len(config.widths) - 1
        self.conv_in = LTX2AudioCausalConv2d(config.in_channels, config.base_channels, 3, axis, **kw)
        inputs = [config.base_channels, *widths[:-1]]
        levels = []
        for i in range(len(widths)):
            level = Level(config, inputs[i], widths[i], config.num_res_blocks, config.attention_at(i), **kw)
            level.downsample = LTX2AudioDownsample(widths[i], axis, **kw) if i < last else None
            levels.append(level)
        self.down = nnx.List(levels)
        self.mid = Mid(config, widths[-1], **kw)
        self.norm_out = norm(config, widths[-1], param_dtype)
        self.conv_out = LTX2AudioCausalConv2d(widths[-1], 2 * config.latent_channels, 3, axis, **kw)

    def __call__(self, x, cache=None):
        """A whole spectrogram (no cache)."""
        x = self.conv_in(x)
        for level in self.down:
            x = level(x)
            if level.downsample is not None:
                x = level.downsample(x)
        return self.conv_out(silu(self.norm_out(self.mid(x)))), None


class LTX2AudioDecoder(nnx.Module):
    def __init__(self, config: AutoencoderKLLTX2AudioConfig, *, rngs, param_dtype):
        kw, axis, widths = dict(rngs=rngs, param_dtype=param_dtype), config.causality_axis, config.widths
        self.config = config
        self.conv_in = LTX2AudioCausalConv2d(config.latent_channels, widths[-1], 3, axis, **kw)
        self.mid = Mid(config, widths[-1], **kw)
        inputs = [*widths[1:], widths[-1]]  # up.{i}'s input is the level below's output
        levels = []
        for i in range(len(widths)):
            level = Level(config, inputs[i], widths[i], config.num_res_blocks + 1, config.attention_at(i), **kw)
            level.upsample = LTX2AudioUpsample(widths[i], axis, **kw) if i > 0 else None
            levels.append(level)
        self.up = nnx.List(levels)
        self.norm_out = norm(config, widths[0], param_dtype)
        self.conv_out = LTX2AudioCausalConv2d(widths[0], config.output_channels, 3, axis, **kw)

    def __call__(self, z, cache=None):
        """A whole latent (no cache), cropped or zero-padded to 4T - 3 mel frames and the configured mel bins."""
        frames, bins = decoded_size(self.config, z.shape[1], z.shape[2])
        x = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            x = level(x)
            if level.upsample is not None:
                x = level.upsample(x)
        x = self.conv_out(silu(self.norm_out(x)))[:, :frames, :bins]
        return jnp.pad(x, ((0, 0), (0, frames - x.shape[1]), (0, bins - x.shape[2]), (0, 0))), None


class AutoencoderKLLTX2Audio(TilingMixin, nnx.Module):
    tiling_class = None  # diffusers' class does not tile

    def __init__(self, config: AutoencoderKLLTX2AudioConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.config = config
        self.encoder = LTX2AudioEncoder(config, **kw)
        self.decoder = LTX2AudioDecoder(config, **kw)
        self.quant_conv = self.post_quant_conv = None
        self.latents_mean = Buffer(jnp.zeros((config.base_channels,), param_dtype))
        self.latents_std = Buffer(jnp.ones((config.base_channels,), param_dtype))

    def encode(self, x, *, mesh=None):
        """(B, T, mel bins, in_channels) spectrograms -> (mean, logvar), each (B, ceil(T/4), mel/4, latent_channels)."""
        expect_image(x, self.config.in_channels, channels_last=True, what="encode", **self.config.encode_input_limits)
        mean, logvar = jnp.split(run_image(self, "encoder", x, mesh), 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, z, *, mesh=None):
        """(B, T, bins, latent_channels) latents -> (B, 4T - 3, mel_bins, output_channels) spectrograms."""
        expect_image(z, self.config.latent_channels, channels_last=True, what="decode")
        return run_image(self, "decoder", z, mesh)
