"""LTX-Video VAE (diffusers' `AutoencoderKLLTXVideo`: LTX-Video 0.9.0, 0.9.1, 0.9.5-0.9.8) in Flax NNX,
channels-last: videos are (B, T, H, W, C).

Read it beside diffusers' `autoencoder_kl_ltx.py`: modules carry the same names (nnx's `kernel`/`scale` where PyTorch
says `weight`). The model is convolutions only, with no causal cache: the encoder and the decoder each take a whole
clip (or one of diffusers' overlapping temporal tiles) in one step. Extra decode inputs, as diffusers names them:
`temb`, the per-batch timestep of a timestep-conditioned decoder, and `noise`, the maps 0.9.1's decoder adds
(models/ltx/noise.py). Kernels start at zero, not random: the model exists to be filled from a checkpoint.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..common.conv import cpu_conv, prepadded_conv
from ..common.inputs import expect_video
from ..common.layers_flax import Buffer, Conv, Linear, silu
from ..common.sharding import whole_where_width_uneven
from ..common.steps_flax import run_clip
from ..common.tiling import TilingMixin
from .config import STRIDES, ConvStyle, DownLevel, LTXVideoTiling, LTXVideoVAEConfig, UpLevel
from .noise import noise_maps


def rms_norm(x, eps=1e-8):
    """diffusers' RMSNorm without weights over the channels, in float32."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def space_to_depth(x, stride):
    """(B, T, H, W, C) -> (B, T/st, H/sh, W/sw, C*st*sh*sw), channel index ((c*st + t)*sh + h)*sw + w as diffusers'
    permute(0, 1, 3, 5, 7, 2, 4, 6) makes it."""
    b, t, h, w, c = x.shape
    st, sh, sw = stride
    x = whole_where_width_uneven(x, w // sw)
    x = x.reshape(b, t // st, st, h // sh, sh, w // sw, sw, c).transpose(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, t // st, h // sh, w // sw, c * st * sh * sw)


def depth_to_space(x, stride):
    """The inverse of space_to_depth: channel ((c*st + t)*sh + h)*sw + w goes to frame t, row h, column w."""
    b, t, h, w, c = x.shape
    st, sh, sw = stride
    x = x.reshape(b, t, h, w, c // (st * sh * sw), st, sh, sw).transpose(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, t * st, h * sh, w * sw, c // (st * sh * sw))


class LTXVideoCausalConv3d(nnx.Module):
    """Conv3d padded in time by repeating edge frames and in space with zeros (the conv's own padding) or by
    reflection, as `style` says (config.ConvStyle)."""

    def __init__(
        self, in_channels, out_channels, kernel_size, stride=(1, 1, 1), *, style: ConvStyle, rngs, param_dtype
    ):
        self.kernel_size = kernel_size
        self.causal = style.causal
        self.reflect = style.padding == "reflect" and kernel_size > 1
        pad = 0 if self.reflect else kernel_size // 2
        self.conv = Conv(
            in_channels,
            out_channels,
            (kernel_size,) * 3,
            strides=stride,
            padding=((0, 0), (pad, pad), (pad, pad)),
            kernel_init=nnx.initializers.zeros,
            rngs=rngs,
            param_dtype=param_dtype,
            conv_general_dilated=prepadded_conv if self.reflect else cpu_conv,
        )

    def __call__(self, x):
        k = self.kernel_size
        front, back = (k - 1, 0) if self.causal else ((k - 1) // 2, (k - 1) // 2)
        if front or back:
            x = jnp.concatenate([jnp.repeat(x[:, :1], front, axis=1), x, jnp.repeat(x[:, -1:], back, axis=1)], axis=1)
        if self.reflect:
            x = jnp.pad(x, ((0, 0), (0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)), mode="reflect")
        return self.conv(x)


class PixArtAlphaCombinedTimestepSizeEmbeddings(nnx.Module):
    """diffusers' timestep embedder without size conditions: 256 sinusoids (cos first) -> Linear -> SiLU -> Linear."""

    def __init__(self, embedding_dim, *, rngs, param_dtype):
        self.timestep_embedder = TimestepEmbedding(256, embedding_dim, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, timestep, dtype):
        half = 128
        frequencies = jnp.exp(-math.log(10000) * jnp.arange(half, dtype=jnp.float32) / half)
        angles = timestep.astype(jnp.float32)[:, None] * frequencies[None]
        return self.timestep_embedder(jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1).astype(dtype))


class TimestepEmbedding(nnx.Module):
    def __init__(self, in_channels, embedding_dim, *, rngs, param_dtype):
        kw = dict(kernel_init=nnx.initializers.zeros, rngs=rngs, param_dtype=param_dtype)
        self.linear_1 = Linear(in_channels, embedding_dim, **kw)
        self.linear_2 = Linear(embedding_dim, embedding_dim, **kw)

    def __call__(self, x):
        return self.linear_2(silu(self.linear_1(x)))


class LTXVideoResnetBlock3d(nnx.Module):
    def __init__(
        self,
        in_channels,
        out_channels,
        eps,
        style,
        inject_noise=False,
        timestep_conditioning=False,
        *,
        rngs,
        param_dtype,
    ):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.conv1 = LTXVideoCausalConv3d(in_channels, out_channels, 3, style=style, **kw)
        self.conv2 = LTXVideoCausalConv3d(out_channels, out_channels, 3, style=style, **kw)
        shortcut = in_channels != out_channels
        self.norm3 = nnx.LayerNorm(in_channels, epsilon=eps, **kw) if shortcut else None
        if not shortcut:
            self.conv_shortcut = None
        elif style.plain_shortcut:
            self.conv_shortcut = Conv(
                in_channels,
                out_channels,
                (1, 1, 1),
                kernel_init=nnx.initializers.zeros,
                conv_general_dilated=cpu_conv,
                **kw,
            )
        else:
            self.conv_shortcut = LTXVideoCausalConv3d(in_channels, out_channels, 1, style=style, **kw)
        self.per_channel_scale1 = nnx.Param(jnp.zeros((in_channels, 1, 1), param_dtype)) if inject_noise else None
        self.per_channel_scale2 = nnx.Param(jnp.zeros((in_channels, 1, 1), param_dtype)) if inject_noise else None
        self.scale_shift_table = nnx.Param(jnp.zeros((4, in_channels), param_dtype)) if timestep_conditioning else None

    @staticmethod
    def _add_noise(x, scale, noise):
        """diffusers adds one (H, W) map to every frame, scaled per channel."""
        if scale is None:
            return x
        return x + next(noise)[None, None, :, :, None].astype(x.dtype) * scale[...].reshape(-1)

    def __call__(self, inputs, temb=None, noise=None):
        h = rms_norm(inputs)
        if self.scale_shift_table is not None:
            b = temb.shape[0]
            table = temb.reshape(b, 4, -1) + self.scale_shift_table[...][None]
            shift_1, scale_1, shift_2, scale_2 = (table[:, i, None, None, None, :] for i in range(4))
            h = h * (1 + scale_1) + shift_1
        h = self._add_noise(self.conv1(silu(h)), self.per_channel_scale1, noise)
        h = rms_norm(h)
        if self.scale_shift_table is not None:
            h = h * (1 + scale_2) + shift_2
        h = self._add_noise(self.conv2(silu(h)), self.per_channel_scale2, noise)
        if self.norm3 is not None:
            inputs = self.norm3(inputs)
        if self.conv_shortcut is not None:
            inputs = self.conv_shortcut(inputs)
        return h + inputs


class LTXVideoDownsampler3d(nnx.Module):
    """A convolution to out/(st*sh*sw) channels, space-to-depth, plus the input space-to-depthed and averaged over
    channel groups; the first st-1 frames are repeated in front."""

    def __init__(self, in_channels, out_channels, stride, style, *, rngs, param_dtype):
        self.stride = stride
        product = math.prod(stride)
        self.group_size = in_channels * product // out_channels
        self.conv = LTXVideoCausalConv3d(
            in_channels, out_channels // product, 3, style=style, rngs=rngs, param_dtype=param_dtype
        )

    def __call__(self, x):
        x = jnp.concatenate([x[:, : self.stride[0] - 1], x], axis=1)
        residual = space_to_depth(x, self.stride)
        residual = residual.reshape(*residual.shape[:-1], -1, self.group_size).mean(axis=-1)
        return space_to_depth(self.conv(x), self.stride) + residual


class LTXVideoUpsampler3d(nnx.Module):
    """A convolution to in*(st*sh*sw)/upscale_factor channels, depth-to-space, the first st-1 frames dropped; with
    `residual`, plus the input depth-to-spaced and tiled along channels (torch's `repeat`, not an interleave)."""

    def __init__(self, in_channels, stride, style, residual, upscale_factor, *, rngs, param_dtype):
        self.stride = stride
        self.residual = residual
        self.repeats = math.prod(stride) // upscale_factor
        self.conv = LTXVideoCausalConv3d(
            in_channels,
            in_channels * math.prod(stride) // upscale_factor,
            3,
            style=style,
            rngs=rngs,
            param_dtype=param_dtype,
        )

    def __call__(self, x):
        drop = self.stride[0] - 1
        out = depth_to_space(self.conv(x), self.stride)[:, drop:]
        if self.residual:
            out = out + jnp.tile(depth_to_space(x, self.stride), (1, 1, 1, 1, self.repeats))[:, drop:]
        return out


def _resnets(channels, count, eps, style, inject_noise=False, timestep_conditioning=False, **kw):
    return nnx.List(
        [
            LTXVideoResnetBlock3d(channels, channels, eps, style, inject_noise, timestep_conditioning, **kw)
            for _ in range(count)
        ]
    )


class LTXVideoDownBlock3D(nnx.Module):
    """0.9.0's down block (also LTXVideo095DownBlock3D, which has no conv_out and other downsamplers)."""

    def __init__(self, level: DownLevel, eps, style, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.resnets = _resnets(level.in_channels, level.num_layers, eps, style, **kw)
        if level.downsample == "conv":
            downsampler = LTXVideoCausalConv3d(level.in_channels, level.in_channels, 3, (2, 2, 2), style=style, **kw)
        elif level.downsample is not None:
            downsampler = LTXVideoDownsampler3d(
                level.in_channels, level.out_channels, STRIDES[level.downsample], style, **kw
            )
        self.downsamplers = nnx.List([downsampler]) if level.downsample else None
        width_changes = level.block_type == "LTXVideoDownBlock3D" and level.in_channels != level.out_channels
        self.conv_out = (
            LTXVideoResnetBlock3d(level.in_channels, level.out_channels, eps, style, **kw) if width_changes else None
        )

    def __call__(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for downsampler in self.downsamplers or ():
            x = downsampler(x)
        return self.conv_out(x) if self.conv_out is not None else x


class LTXVideoMidBlock3d(nnx.Module):
    def __init__(self, channels, num_layers, eps, style, inject_noise, timestep_conditioning, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.time_embedder = (
            PixArtAlphaCombinedTimestepSizeEmbeddings(4 * channels, **kw) if timestep_conditioning else None
        )
        self.resnets = _resnets(channels, num_layers, eps, style, inject_noise, timestep_conditioning, **kw)

    def __call__(self, x, temb=None, noise=None):
        if self.time_embedder is not None:
            temb = self.time_embedder(temb, x.dtype)
        for resnet in self.resnets:
            x = resnet(x, temb, noise)
        return x


class LTXVideoUpBlock3d(nnx.Module):
    def __init__(self, level: UpLevel, eps, style, timestep_conditioning, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.time_embedder = (
            PixArtAlphaCombinedTimestepSizeEmbeddings(4 * level.in_channels, **kw) if timestep_conditioning else None
        )
        # never timestep-conditioned nor noisy where the width changes (config.ensure_supported)
        self.conv_in = (
            LTXVideoResnetBlock3d(level.in_channels, level.out_channels, eps, style, **kw)
            if level.in_channels != level.out_channels
            else None
        )
        self.upsamplers = (
            nnx.List(
                [
                    LTXVideoUpsampler3d(
                        level.out_channels * level.upscale_factor,
                        level.upsample,
                        style,
                        level.residual,
                        level.upscale_factor,
                        **kw,
                    )
                ]
            )
            if level.upsample
            else None
        )
        self.resnets = _resnets(
            level.out_channels, level.num_layers, eps, style, level.inject_noise, timestep_conditioning, **kw
        )

    def __call__(self, x, temb=None, noise=None):
        if self.conv_in is not None:
            x = self.conv_in(x)
        if self.time_embedder is not None:
            temb = self.time_embedder(temb, x.dtype)
        for upsampler in self.upsamplers or ():
            x = upsampler(x)
        for resnet in self.resnets:
            x = resnet(x, temb, noise)
        return x


class LTXVideoEncoder3d(nnx.Module):
    def __init__(self, config: LTXVideoVAEConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        style, eps = config.conv_style("encoder"), config.resnet_norm_eps
        self.patch = (config.patch_size_t, config.patch_size, config.patch_size)
        levels = config.down_levels()
        self.conv_in = LTXVideoCausalConv3d(
            config.in_channels * config.patch_size**2, config.encoder_in_width, 3, style=style, **kw
        )
        self.down_blocks = nnx.List([LTXVideoDownBlock3D(level, eps, style, **kw) for level in levels])
        width = levels[-1].out_channels
        self.mid_block = LTXVideoMidBlock3d(width, config.layers_per_block[-1], eps, style, False, False, **kw)
        self.conv_out = LTXVideoCausalConv3d(width, config.latent_channels + 1, 3, style=style, **kw)

    def __call__(self, x, cache=None):
        """A whole clip (no cache) -> moments: the means, then the one log-variance channel repeated."""
        pt, p, _ = self.patch
        b, t, h, w, c = x.shape
        # diffusers' patch order puts the width's sub-index before the height's
        x = x.reshape(b, t // pt, pt, h // p, p, w // p, p, c).transpose(0, 1, 3, 5, 7, 2, 6, 4)
        x = self.conv_in(x.reshape(b, t // pt, h // p, w // p, c * pt * p * p))
        for block in self.down_blocks:
            x = block(x)
        x = self.conv_out(silu(rms_norm(self.mid_block(x))))
        logvar = x[..., -1:]
        return jnp.concatenate([x, jnp.repeat(logvar, x.shape[-1] - 2, axis=-1)], axis=-1), None


class LTXVideoDecoder3d(nnx.Module):
    def __init__(self, config: LTXVideoVAEConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        style, eps, conditioned = config.conv_style("decoder"), config.resnet_norm_eps, config.timestep_conditioning
        self.patch = (config.patch_size_t, config.patch_size, config.patch_size)
        width = config.decoder_width
        self.conv_in = LTXVideoCausalConv3d(config.latent_channels, width, 3, style=style, **kw)
        self.mid_block = LTXVideoMidBlock3d(
            width, config.mid_layers, eps, style, config.mid_inject_noise, conditioned, **kw
        )
        levels = config.up_levels()
        self.up_blocks = nnx.List([LTXVideoUpBlock3d(level, eps, style, conditioned, **kw) for level in levels])
        out_width = levels[-1].out_channels
        self.conv_out = LTXVideoCausalConv3d(
            out_width, config.out_channels * config.patch_size_t * config.patch_size**2, 3, style=style, **kw
        )
        self.timestep_scale_multiplier = nnx.Param(jnp.zeros((), param_dtype)) if conditioned else None
        self.time_embedder = PixArtAlphaCombinedTimestepSizeEmbeddings(2 * out_width, **kw) if conditioned else None
        self.scale_shift_table = nnx.Param(jnp.zeros((2, out_width), param_dtype)) if conditioned else None

    def __call__(self, x, cache=None, temb=None, noise=()):
        """A whole clip (no cache); temb: (B,) timesteps where the decoder is timestep-conditioned; noise: the maps
        its noise-injecting resnets add, in order."""
        noise = iter(noise)
        x = self.conv_in(x)
        if self.timestep_scale_multiplier is not None:
            temb = temb * self.timestep_scale_multiplier[...]
        x = self.mid_block(x, temb, noise)
        for block in self.up_blocks:
            x = block(x, temb, noise)
        x = rms_norm(x)
        if self.time_embedder is not None:
            b = x.shape[0]
            table = self.time_embedder(temb, x.dtype).reshape(b, 2, -1) + self.scale_shift_table[...][None]
            shift, scale = table[:, 0, None, None, None, :], table[:, 1, None, None, None, :]
            x = x * (1 + scale) + shift
        x = self.conv_out(silu(x))
        pt, p, _ = self.patch
        b, t, h, w, c = x.shape
        x = x.reshape(b, t, h, w, c // (pt * p * p), pt, p, p).transpose(0, 1, 5, 2, 7, 3, 6, 4)
        return x.reshape(b, t * pt, h * p, w * p, c // (pt * p * p)), None


def _as_jax(value):
    return jnp.asarray(np.asarray(value) if not isinstance(value, jax.Array) else value)


class AutoencoderKLLTXVideo(TilingMixin, nnx.Module):
    tiling_class = LTXVideoTiling

    def __init__(self, config: LTXVideoVAEConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.config = config
        self.encoder = LTXVideoEncoder3d(config, **kw)
        self.decoder = LTXVideoDecoder3d(config, **kw)
        self.quant_conv = None
        self.post_quant_conv = None
        self.latents_mean = Buffer(jnp.zeros((config.latent_channels,), param_dtype))
        self.latents_std = Buffer(jnp.ones((config.latent_channels,), param_dtype))
        # diffusers' defaults: off (and its encode tests the decoding switch, as here)
        self.use_framewise_encoding = False
        self.use_framewise_decoding = False

    def encode(self, x, *, mesh=None):
        """(B, T, H, W, C) video -> (mean, logvar), each (B, 1 + (T-1)/8, H/32, W/32, latent_channels) at 0.9.x's
        ratios."""
        expect_video(x, self.config.in_channels, channels_last=True, what="encode", **self.config.encode_input_limits)
        frames = (x.shape[1] - 1) // self.config.temporal_ratio + 1
        # diffusers' _encode tests the decoding switch for framewise tiles
        moments = run_clip(self, "encoder", x, frames, self.use_framewise_decoding, mesh)
        mean, logvar = jnp.split(moments, 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, z, temb=None, *, mesh=None, noise=None):
        """(B, T, H, W, latent_channels) latents -> (B, 1 + 8*(T-1), 32H, 32W, C) video at 0.9.x's ratios
        (unclamped, as diffusers).

        temb: the timestep of a timestep-conditioned decoder, one per batch entry (or one for all). noise, for a
        noise-injecting decoder: a JAX key, an integer seed (NumPy draws, the same on every target), or the maps of
        one untiled decode (models/ltx/noise.py); None draws from NumPy's global generator, as diffusers draws from
        torch's."""
        expect_video(
            z, self.config.latent_channels, channels_last=True, what="decode", **self.config.decode_input_limits
        )
        frames = (z.shape[1] - 1) * self.config.temporal_ratio + 1
        fixed = {}
        if self.config.timestep_conditioning:
            if temb is None:
                raise ValueError("decode: this decoder is timestep-conditioned; pass temb (a timestep per batch entry)")
            fixed["temb"] = jnp.broadcast_to(jnp.asarray(temb, z.dtype).reshape(-1), (z.shape[0],))
        draws = None
        if self.config.injects_noise:
            draws = noise_maps(self.config, _noise_source(noise), _key_draws(noise), _as_jax)

        def inputs(window):
            return fixed if draws is None else {**fixed, "noise": draws(window.shape[2], window.shape[3])}

        return run_clip(self, "decoder", z, frames, self.use_framewise_decoding, mesh, inputs, drop_last=True)


def _noise_source(noise):
    return np.random.default_rng(np.random.randint(2**31)) if noise is None else noise  # seeded by np.random.seed


def _key_draws(key):
    """Maps from a JAX key: the `call`-th decoder call's n-th map from fold_in(fold_in(key, call), n)."""

    def draw(shapes, call):
        key_call = jax.random.fold_in(key, call)
        return [jax.random.normal(jax.random.fold_in(key_call, n), shape) for n, shape in enumerate(shapes)]

    return draw


class AutoencoderKLLTX2Video(AutoencoderKLLTXVideo):
    """diffusers' `AutoencoderKLLTX2Video`: the same model, built from an LTX2VideoVAEConfig (what differs is in the
    config: encoder widths, upsampler strides, padding, shortcuts)."""
