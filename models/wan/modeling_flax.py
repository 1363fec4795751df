"""Wan 2.1 and 2.2 video VAEs (diffusers' `AutoencoderKLWan`) in Flax NNX, channels-last: videos are (B, T, H, W, C).

Read it beside diffusers' `autoencoder_kl_wan.py`: modules and parameters carry the same names. Three things differ:
- The causal feature cache is explicit. Every cached block takes `cache` (None on the first chunk) and returns
  `(x, new_cache)`, so a whole encoder/decoder step is a pure function that `jax.jit` compiles once per chunk shape.
- diffusers' 1-frame or missing history is the same as a zero history (its causal padding is zeros), so every
  cache holds exactly CACHE_T frames and its shape never changes after the first step.
- Kernels start at zero, not random: the model exists to be filled from a checkpoint, and zeros keep tracing its
  abstract state (`nnx.eval_shape`, as `converter.load` does) cheap.

Extension points (models/common/protocol.py), which Qwen-Image 2.1 uses (models/qwenimage21/):
- `AutoencoderKLWan.causal_conv`: the convolution class every layer is built with, constructed as
  `WanCausalConv3d` is, with a `history` attribute; called `conv(x)` -> y when it has none (`history == 0`), and
  `conv(x, cache)` -> (y, cache) when it has some, the cache it returns passed back with the next chunk (None: a
  convolution with nothing to keep, such as an image's).
- `WanVAEConfig.frames`: the frames every input has (1: an image class), checked by encode and decode; None: any.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ..common.attention import attention
from ..common.cache import run_cached
from ..common.conv import cpu_conv
from ..common.inputs import expect_video
from ..common.layers_flax import Conv, Linear, UpsampledConv, silu
from ..common.precision import plus_bias
from ..common.steps_flax import run_chunks
from ..common.tiling import TilingMixin
from .config import WanTiling, WanVAEConfig, decode_chunks, encode_chunks

CACHE_T = 2


def triple(value) -> tuple[int, int, int]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * 3


class WanCausalConv3d(Conv):
    """Conv3d padded causally in time (2*p frames of history in front) and symmetrically in space. With history it
    takes and returns the cache; without (p = 0: the 1x1x1 and strided temporal convs) it is a plain convolution."""

    def __init__(self, in_channels, out_channels, kernel_size, *, padding=0, strides=1, rngs, param_dtype):
        pt, ph, pw = triple(padding)
        super().__init__(
            in_channels,
            out_channels,
            triple(kernel_size),
            strides=triple(strides),
            padding=((0, 0), (ph, ph), (pw, pw)),
            kernel_init=nnx.initializers.zeros,
            rngs=rngs,
            param_dtype=param_dtype,
            conv_general_dilated=cpu_conv,
        )
        self.history = 2 * pt

    def __call__(self, x, cache=None):
        # x: (B, T, H, W, C); cache: (B, CACHE_T, H, W, C) of earlier frames, or None for none (zeros).
        if self.history == 0:
            return super().__call__(x)
        if cache is None:
            zeros = jnp.zeros((x.shape[0], CACHE_T, *x.shape[2:]), x.dtype)
            return self._after_zeros(x), jnp.concatenate([zeros, x], axis=1)[:, -CACHE_T:]
        x = jnp.concatenate([cache, x], axis=1)
        return super().__call__(x[:, CACHE_T - self.history :]), x[:, -CACHE_T:]

    def _after_zeros(self, x):
        """The convolution of x after `history` zero frames, without their products: an output frame whose window
        starts among the zeros is taken with only the kernel's taps that reach x (a video's first chunk, an image,
        costs a third of the products)."""
        taps, zeros = self.kernel_size[0], self.history
        frames = x.shape[1] + zeros - taps + 1
        head = [self._conv(x[:, : j + taps - zeros], self.kernel[zeros - j :]) for j in range(min(zeros, frames))]
        return jnp.concatenate([*head, super().__call__(x)] if x.shape[1] >= taps else head, axis=1)

    def _conv(self, x, kernel):
        """This layer's convolution of x by `kernel`, some of its time taps, rounded once as its whole one (Conv)."""
        x, kernel, bias = self.promote_dtype((x, kernel, self.bias[...]), dtype=self.dtype)
        y = self.conv_general_dilated(
            x, kernel, (1, 1, 1), self.padding, dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
            preferred_element_type=jnp.float32,
        )  # fmt: skip
        return plus_bias(y, bias, x.dtype)


def _conv(in_channels, out_channels, kernel_size, *, rngs, param_dtype, **kwargs):
    return Conv(
        in_channels,
        out_channels,
        kernel_size,
        kernel_init=nnx.initializers.zeros,
        rngs=rngs,
        param_dtype=param_dtype,
        conv_general_dilated=cpu_conv,
        **kwargs,
    )


class WanRMS_norm(nnx.Module):
    """x / ||x||_2 over channels * sqrt(C) * gamma, as `F.normalize`; the norm is taken in float32."""

    def __init__(self, dim, *, param_dtype):
        self.scale = dim**0.5
        self.gamma = nnx.Param(jnp.ones((dim,), param_dtype))

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        norm = jnp.sqrt(jnp.sum(xf * xf, axis=-1, keepdims=True))
        normalized = (xf / jnp.maximum(norm, 1e-12)).astype(x.dtype)
        return normalized * self.scale * self.gamma[...]


class AvgDown3D(nnx.Module):
    """Parameter-free shortcut of a Wan 2.2 down block: folds factor_t frames and factor_s x factor_s pixels into
    channels and averages consecutive groups of them down to out_channels. A chunk whose frame count is not a
    multiple of factor_t gets zero frames in front."""

    def __init__(self, in_channels, out_channels, factor_t, factor_s=1):
        self.out_channels, self.factor_t, self.factor_s = out_channels, factor_t, factor_s
        self.group_size = in_channels * factor_t * factor_s * factor_s // out_channels

    def __call__(self, x):
        ft, fs = self.factor_t, self.factor_s
        x = jnp.pad(x, ((0, 0), ((-x.shape[1]) % ft, 0), (0, 0), (0, 0), (0, 0)))
        b, t, h, w, c = x.shape
        x = x.reshape(b, t // ft, ft, h // fs, fs, w // fs, fs, c).transpose(0, 1, 3, 5, 7, 2, 4, 6)
        # (B, T/ft, H/fs, W/fs, C, ft, fs, fs): channels in diffusers' fold order -> mean over each group
        return x.reshape(b, t // ft, h // fs, w // fs, self.out_channels, self.group_size).mean(axis=-1)


class DupUp3D(nnx.Module):
    """Parameter-free shortcut of a Wan 2.2 up block, the inverse regrouping of AvgDown3D: repeats channels, then
    unfolds them into factor_t frames and factor_s x factor_s pixels. The first chunk keeps only its last frame."""

    def __init__(self, in_channels, out_channels, factor_t, factor_s=1):
        self.out_channels, self.factor_t, self.factor_s = out_channels, factor_t, factor_s
        self.repeats = out_channels * factor_t * factor_s * factor_s // in_channels

    def __call__(self, x, first_chunk=False):
        ft, fs = self.factor_t, self.factor_s
        b, t, h, w, _ = x.shape
        x = jnp.repeat(x, self.repeats, axis=-1).reshape(b, t, h, w, self.out_channels, ft, fs, fs)
        # (B, T, H, W, out, ft, fs, fs) -> (B, T, ft, H, fs, W, fs, out)
        x = x.transpose(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, t * ft, h * fs, w * fs, self.out_channels)
        return x[:, ft - 1 :] if first_chunk else x


class WanResample(nnx.Module):
    def __init__(self, dim, mode, *, conv, rngs, param_dtype, upsample_out_dim=None):
        self.mode = mode
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        if mode in ("upsample2d", "upsample3d"):
            # nearest-exact at scale 2 repeats each pixel: the convolution of the upsampled frames
            self.resample = UpsampledConv(dim, upsample_out_dim or dim // 2, **kw)
        else:  # diffusers: ZeroPad2d((0, 1, 0, 1)) then a 3x3 stride-2 conv
            self.resample = _conv(dim, dim, (3, 3), strides=(2, 2), padding=((0, 1), (0, 1)), **kw)
        if mode == "upsample3d":
            self.time_conv = conv(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0), **kw)
        elif mode == "downsample3d":
            self.time_conv = conv(dim, dim, (3, 1, 1), strides=(2, 1, 1), **kw)

    def __call__(self, x, cache=None):
        b, t, h, w, c = x.shape
        new_cache = None
        if self.mode == "upsample3d":
            if cache is None:  # first chunk: no temporal upsampling, and the next chunk starts from zeros
                new_cache = jnp.zeros((b, CACHE_T, h, w, c), x.dtype)
            else:
                x, new_cache = self.time_conv(x, cache)  # (B, T, H, W, 2C): channel halves are frames 2t, 2t+1
                x = x.reshape(b, t, h, w, 2, c).transpose(0, 1, 4, 2, 3, 5).reshape(b, 2 * t, h, w, c)
        x = self.resample(x)
        if self.mode == "downsample3d":
            if cache is not None:  # the first chunk keeps its single frame
                x, cache_frame = self.time_conv(jnp.concatenate([cache, x], axis=1)), x[:, -1:]
                return x, cache_frame
            new_cache = x[:, -1:]
        return x, new_cache


class WanResidualBlock(nnx.Module):
    def __init__(self, in_dim, out_dim, *, conv, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm1 = WanRMS_norm(in_dim, param_dtype=param_dtype)
        self.conv1 = conv(in_dim, out_dim, 3, padding=1, **kw)
        self.norm2 = WanRMS_norm(out_dim, param_dtype=param_dtype)
        self.conv2 = conv(out_dim, out_dim, 3, padding=1, **kw)
        self.conv_shortcut = conv(in_dim, out_dim, 1, **kw) if in_dim != out_dim else None

    def __call__(self, x, cache=None):
        cache = cache or {}
        new = {}
        h = x if self.conv_shortcut is None else self.conv_shortcut(x)
        x, new["conv1"] = self.conv1(silu(self.norm1(x)), cache.get("conv1"))
        x, new["conv2"] = self.conv2(silu(self.norm2(x)), cache.get("conv2"))
        return x + h, new


class WanAttentionBlock(nnx.Module):
    """Single-head self-attention over the pixels of each frame, computed in blocks (models/common/attention.py: a
    1280x1280 frame's score matrix alone would be 2 GB); diffusers' 1x1 convs are Linear layers here."""

    def __init__(self, dim, *, rngs, param_dtype):
        self.norm = WanRMS_norm(dim, param_dtype=param_dtype)
        kw = dict(kernel_init=nnx.initializers.zeros, rngs=rngs, param_dtype=param_dtype)
        self.to_qkv = Linear(dim, dim * 3, **kw)
        self.proj = Linear(dim, dim, **kw)

    def __call__(self, x, cache=None):
        b, t, h, w, c = x.shape
        tokens = self.norm(x.reshape(b * t, h * w, c))
        q, k, v = jnp.split(self.to_qkv(tokens), 3, axis=-1)  # each (B*T, H*W, C)
        out = self.proj(attention(q, k, v))
        return x + out.reshape(b, t, h, w, c), None


class WanMidBlock(nnx.Module):
    def __init__(self, dim, *, conv, rngs, param_dtype, num_layers=1):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.attentions = nnx.List([WanAttentionBlock(dim, **kw) for _ in range(num_layers)])
        self.resnets = nnx.List([WanResidualBlock(dim, dim, conv=conv, **kw) for _ in range(num_layers + 1)])

    def __call__(self, x, cache=None):
        cache = (cache or {}).get("resnets", {})
        x, first = self.resnets[0](x, cache=cache.get("0"))
        new = {"0": first}
        for i, (attn, resnet) in enumerate(zip(self.attentions, self.resnets[1:]), start=1):
            x, _ = attn(x)
            x, new[str(i)] = resnet(x, cache=cache.get(str(i)))
        return x, {"resnets": new}


class WanResidualDownBlock(nnx.Module):
    """Wan 2.2: residual blocks and an optional downsampler, plus the parameter-free AvgDown3D shortcut."""

    def __init__(self, in_dim, out_dim, num_res_blocks, temperal_downsample, down_flag, *, conv, rngs, param_dtype):
        kw = dict(conv=conv, rngs=rngs, param_dtype=param_dtype)
        self.avg_shortcut = AvgDown3D(in_dim, out_dim, 2 if temperal_downsample else 1, 2 if down_flag else 1)
        self.resnets = nnx.List(
            [WanResidualBlock(in_dim if i == 0 else out_dim, out_dim, **kw) for i in range(num_res_blocks)]
        )
        mode = "downsample3d" if temperal_downsample else "downsample2d"
        self.downsampler = WanResample(out_dim, mode, **kw) if down_flag else None

    def __call__(self, x, cache=None):
        cache = cache or {}
        new = {}
        shortcut = self.avg_shortcut(x)
        x, new["resnets"] = run_cached(self.resnets, x, cache.get("resnets"))
        if self.downsampler is not None:
            x, new["downsampler"] = self.downsampler(x, cache.get("downsampler"))
        return x + shortcut, new


class WanEncoder3d(nnx.Module):
    def __init__(self, config: WanVAEConfig, *, conv, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        levels, blocks = config.down_levels(), config.num_res_blocks
        self.conv_in = conv(config.in_channels, levels[0].in_channels, 3, padding=1, **kw)
        down_blocks = []
        for level in levels:
            in_dim, out_dim = level.in_channels, level.out_channels
            if config.is_residual:
                down_blocks.append(
                    WanResidualDownBlock(in_dim, out_dim, blocks, level.temporal, level.resample, conv=conv, **kw)
                )
                continue
            for _ in range(blocks):
                down_blocks.append(WanResidualBlock(in_dim, out_dim, conv=conv, **kw))
                if level.attention:
                    down_blocks.append(WanAttentionBlock(out_dim, **kw))
                in_dim = out_dim
            if level.resample:
                mode = "downsample3d" if level.temporal else "downsample2d"
                down_blocks.append(WanResample(out_dim, mode, conv=conv, **kw))
        self.down_blocks = nnx.List(down_blocks)
        self.mid_block = WanMidBlock(out_dim, conv=conv, **kw)
        self.norm_out = WanRMS_norm(out_dim, param_dtype=param_dtype)
        self.conv_out = conv(out_dim, config.z_dim * 2, 3, padding=1, **kw)

    def __call__(self, x, cache=None):
        cache = cache or {}
        new = {}
        x, new["conv_in"] = self.conv_in(x, cache.get("conv_in"))
        x, new["down_blocks"] = run_cached(self.down_blocks, x, cache.get("down_blocks"))
        x, new["mid_block"] = self.mid_block(x, cache.get("mid_block"))
        x, new["conv_out"] = self.conv_out(silu(self.norm_out(x)), cache.get("conv_out"))
        return x, new


class WanUpBlock(nnx.Module):
    def __init__(self, in_dim, out_dim, num_res_blocks, upsample_mode, *, conv, rngs, param_dtype):
        kw = dict(conv=conv, rngs=rngs, param_dtype=param_dtype)
        self.resnets = nnx.List(
            [WanResidualBlock(in_dim if i == 0 else out_dim, out_dim, **kw) for i in range(num_res_blocks + 1)]
        )
        self.upsamplers = nnx.List([WanResample(out_dim, upsample_mode, **kw)] if upsample_mode else [])

    def __call__(self, x, cache=None):
        cache = cache or {}
        new = {}
        x, new["resnets"] = run_cached(self.resnets, x, cache.get("resnets"))
        x, new["upsamplers"] = run_cached(self.upsamplers, x, cache.get("upsamplers"))
        return x, new


class WanResidualUpBlock(nnx.Module):
    """Wan 2.2: residual blocks and an optional upsampler that keeps the width, plus the parameter-free DupUp3D
    shortcut (only where it upsamples)."""

    def __init__(self, in_dim, out_dim, num_res_blocks, temperal_upsample, up_flag, *, conv, rngs, param_dtype):
        kw = dict(conv=conv, rngs=rngs, param_dtype=param_dtype)
        self.avg_shortcut = DupUp3D(in_dim, out_dim, 2 if temperal_upsample else 1, 2) if up_flag else None
        self.resnets = nnx.List(
            [WanResidualBlock(in_dim if i == 0 else out_dim, out_dim, **kw) for i in range(num_res_blocks + 1)]
        )
        mode = "upsample3d" if temperal_upsample else "upsample2d"
        self.upsampler = WanResample(out_dim, mode, upsample_out_dim=out_dim, **kw) if up_flag else None

    def __call__(self, x, cache=None):
        first_chunk = cache is None
        cache = cache or {}
        new = {}
        shortcut = x
        x, new["resnets"] = run_cached(self.resnets, x, cache.get("resnets"))
        if self.upsampler is not None:
            x, new["upsampler"] = self.upsampler(x, cache.get("upsampler"))
            x = x + self.avg_shortcut(shortcut, first_chunk)
        return x, new


class WanDecoder3d(nnx.Module):
    def __init__(self, config: WanVAEConfig, *, conv, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        levels, blocks = config.up_levels(), config.num_res_blocks
        self.conv_in = conv(config.z_dim, levels[0].in_channels, 3, padding=1, **kw)
        self.mid_block = WanMidBlock(levels[0].in_channels, conv=conv, **kw)
        up_blocks = []
        for level in levels:
            in_dim, out_dim = level.in_channels, level.out_channels
            if config.is_residual:
                up_blocks.append(
                    WanResidualUpBlock(in_dim, out_dim, blocks, level.temporal, level.resample, conv=conv, **kw)
                )
            else:
                mode = ("upsample3d" if level.temporal else "upsample2d") if level.resample else None
                up_blocks.append(WanUpBlock(in_dim, out_dim, blocks, mode, conv=conv, **kw))
        self.up_blocks = nnx.List(up_blocks)
        self.norm_out = WanRMS_norm(out_dim, param_dtype=param_dtype)
        self.conv_out = conv(out_dim, config.out_channels, 3, padding=1, **kw)

    def __call__(self, x, cache=None):
        cache = cache or {}
        new = {}
        x, new["conv_in"] = self.conv_in(x, cache.get("conv_in"))
        x, new["mid_block"] = self.mid_block(x, cache.get("mid_block"))
        x, new["up_blocks"] = run_cached(self.up_blocks, x, cache.get("up_blocks"))
        x, new["conv_out"] = self.conv_out(silu(self.norm_out(x)), cache.get("conv_out"))
        return x, new


def patchify(x, patch):
    """(B, T, H, W, C) -> (B, T, H/p, W/p, C*p*p). Channel c*p*p + j*p + i holds pixel (i, j) of each patch: the
    pinned diffusers' order, width offset first."""
    if patch == 1:
        return x
    b, t, h, w, c = x.shape
    x = x.reshape(b, t, h // patch, patch, w // patch, patch, c)  # (B, T, H/p, i, W/p, j, C)
    return x.transpose(0, 1, 2, 4, 6, 5, 3).reshape(b, t, h // patch, w // patch, c * patch * patch)


def unpatchify(x, patch):
    """The inverse of `patchify`: (B, T, H, W, C*p*p) -> (B, T, H*p, W*p, C)."""
    if patch == 1:
        return x
    b, t, h, w, c = x.shape
    c //= patch * patch
    x = x.reshape(b, t, h, w, c, patch, patch)  # (B, T, H, W, C, j, i)
    return x.transpose(0, 1, 2, 6, 3, 5, 4).reshape(b, t, h * patch, w * patch, c)


class AutoencoderKLWan(TilingMixin, nnx.Module):
    tiling_class = WanTiling
    # every convolution but the resamplers' spatial ones, built from Wan's 3D arguments (a class that specialises
    # the architecture to images puts its own here: models/qwenimage21/)
    causal_conv = WanCausalConv3d

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(conv=self.causal_conv, rngs=rngs, param_dtype=param_dtype)
        self.config = config
        self.encoder = WanEncoder3d(config, **kw)
        self.quant_conv = self.causal_conv(config.z_dim * 2, config.z_dim * 2, 1, rngs=rngs, param_dtype=param_dtype)
        self.post_quant_conv = self.causal_conv(config.z_dim, config.z_dim, 1, rngs=rngs, param_dtype=param_dtype)
        self.decoder = WanDecoder3d(config, **kw)

    def encode(self, x, *, mesh=None):
        """(B, T, H, W, C) video -> (mean, logvar), each (B, 1 + (T-1)//4, H/s, W/s, z_dim), s the spatial factor.

        Like diffusers: the first frame alone, then chunks of 4; frames past the last full chunk are dropped; Wan 2.2
        folds 2x2 pixel patches into channels first. With a mesh ("dp", "tp"), batch and width are split over it
        (models/common/sharding.py).
        """
        config = self.config
        expect_video(
            x,
            config.video_channels,
            channels_last=True,
            what="encode",
            frames=config.frames,
            **config.encode_input_limits,
        )
        x = patchify(x, config.patch)
        mean, logvar = jnp.split(run_chunks(self, "encoder", x, encode_chunks(x.shape[1]), mesh), 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, z, *, mesh=None):
        """(B, T, H, W, z_dim) latents -> (B, 1 + 4*(T-1), sH, sW, C) video in [-1, 1] (s: scale_factor_spatial), one
        latent frame a step. With a mesh ("dp", "tp"), batch and width are split over it (models/common/sharding.py)."""
        expect_video(z, self.config.z_dim, channels_last=True, what="decode", frames=self.config.frames)
        out = run_chunks(self, "decoder", z, decode_chunks(z.shape[1]), mesh)
        return jnp.clip(unpatchify(out, self.config.patch), -1.0, 1.0)
