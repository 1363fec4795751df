"""CogVideoX video VAE (diffusers' `AutoencoderKLCogVideoX`) in Flax NNX, channels-last: videos are (B, T, H, W, C).

Read it beside diffusers' `autoencoder_kl_cogvideox.py`: modules carry the same names (nnx's `kernel`/`scale` where
PyTorch says `weight`). As in diffusers, every encoder/decoder step takes the conv cache and returns the new one, so
a step is a pure function `jax.jit` compiles once per frame-batch shape (the first batch may hold the remainder).
GroupNorm statistics span the frames of one batch, exactly as diffusers computes them, so batching is part of the
numerics, not only of memory use.
Kernels start at zero, not random: the model exists to be filled from a checkpoint, and zeros keep tracing its
abstract state (`nnx.eval_shape`, as `converter.load` does) cheap.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..common.cache import run_cached
from ..common.conv import cpu_conv
from ..common.inputs import expect_video
from ..common.layers_flax import Conv, GroupNorm, UpsampledConv, silu
from ..common.steps_flax import run_chunks
from ..common.tiling import TilingMixin
from .config import CogVideoXTiling, CogVideoXVAEConfig, frame_batches


class CogVideoXCausalConv3d(nnx.Module):
    """Conv3d padded causally in time: the cached last k-1 input frames, or the first frame repeated on the first
    chunk; spatial padding is zeros. Returns (output, new cache)."""

    def __init__(self, in_channels, out_channels, kernel_size, *, rngs, param_dtype):
        kernel_size = (kernel_size,) * 3 if isinstance(kernel_size, int) else tuple(kernel_size)
        self.time_kernel_size = kernel_size[0]
        pad_h, pad_w = (kernel_size[1] - 1) // 2, (kernel_size[2] - 1) // 2
        self.conv = Conv(
            in_channels,
            out_channels,
            kernel_size,
            padding=((0, 0), (pad_h, pad_h), (pad_w, pad_w)),
            kernel_init=nnx.initializers.zeros,
            rngs=rngs,
            param_dtype=param_dtype,
            conv_general_dilated=cpu_conv,
        )

    def __call__(self, x, cache=None):
        if self.time_kernel_size == 1:
            return self.conv(x), None
        history = cache if cache is not None else jnp.repeat(x[:, :1], self.time_kernel_size - 1, axis=1)
        x = jnp.concatenate([history, x], axis=1)
        return self.conv(x), x[:, -self.time_kernel_size + 1 :]


def _nearest_indices(in_size: int, out_size: int) -> np.ndarray:
    """Source indices of PyTorch's 'nearest' resize: floor(dst * in/out) computed in float32, clamped."""
    scale = np.float32(in_size / out_size)
    return np.minimum(np.floor(np.arange(out_size, dtype=np.float32) * scale).astype(np.int32), in_size - 1)


def _resize_nearest(x, size):
    """F.interpolate(mode='nearest') over (T, H, W) of a (B, T, H, W, C) tensor: each pixel repeated where that is
    what the source indices say (a layout that sharding propagates through), else static gathers."""
    for axis, out_size in zip((1, 2, 3), size):
        in_size = x.shape[axis]
        if in_size == out_size:
            continue
        indices, factor = _nearest_indices(in_size, out_size), out_size // in_size
        if np.array_equal(indices, np.arange(out_size) // max(factor, 1)):
            x = jnp.repeat(x, factor, axis=axis)
        else:
            x = jnp.take(x, indices, axis=axis)
    return x


class CogVideoXSpatialNorm3D(nnx.Module):
    def __init__(self, f_channels, zq_channels, groups, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm_layer = GroupNorm(groups, f_channels, 1e-6, param_dtype=param_dtype)
        self.conv_y = CogVideoXCausalConv3d(zq_channels, f_channels, 1, **kw)
        self.conv_b = CogVideoXCausalConv3d(zq_channels, f_channels, 1, **kw)

    def __call__(self, f, zq):
        # conv_y and conv_b act on each pixel alone, so they commute with the nearest resize: applied to zq before
        # it is resized, they cost its pixels rather than f's, and no step holds their outputs at f's size
        size = f.shape[1:4]
        return self.norm_layer(f) * _resize_like_f(self.conv_y(zq)[0], size) + _resize_like_f(self.conv_b(zq)[0], size)


def _resize_like_f(zq, size):
    """zq (B, T, H, W, C) resized to f's (T, H, W) as diffusers resizes it: the first frame on its own when f has an
    odd number of frames > 1. Frames first, at zq's own size, so that only the spatial repeat is done at f's, where
    XLA fuses it into the layer that reads it."""
    t = size[0]
    if t > 1 and t % 2 == 1:
        zq = jnp.concatenate([zq[:, :1], _resize_nearest(zq[:, 1:], (t - 1, *zq.shape[2:4]))], axis=1)
    return _resize_nearest(zq, size)


class CogVideoXResnetBlock3D(nnx.Module):
    def __init__(self, in_channels, out_channels, groups, eps, spatial_norm_dim=None, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        if spatial_norm_dim is None:
            self.norm1 = GroupNorm(groups, in_channels, eps, param_dtype=param_dtype)
            self.norm2 = GroupNorm(groups, out_channels, eps, param_dtype=param_dtype)
        else:
            self.norm1 = CogVideoXSpatialNorm3D(in_channels, spatial_norm_dim, groups, **kw)
            self.norm2 = CogVideoXSpatialNorm3D(out_channels, spatial_norm_dim, groups, **kw)
        self.conv1 = CogVideoXCausalConv3d(in_channels, out_channels, 3, **kw)
        self.conv2 = CogVideoXCausalConv3d(out_channels, out_channels, 3, **kw)
        self.conv_shortcut = (
            Conv(in_channels, out_channels, (1, 1, 1), kernel_init=nnx.initializers.zeros, **kw)
            if in_channels != out_channels
            else None
        )

    def __call__(self, x, zq=None, cache=None):
        cache = cache or {}
        new = {}
        norm = (lambda layer, h: layer(h)) if zq is None else (lambda layer, h: layer(h, zq))
        h, new["conv1"] = self.conv1(silu(norm(self.norm1, x)), cache.get("conv1"))
        h, new["conv2"] = self.conv2(silu(norm(self.norm2, h)), cache.get("conv2"))
        return h + (x if self.conv_shortcut is None else self.conv_shortcut(x)), new


def _compress_time_pool(x):
    """Average pairs of frames; with an odd count the first frame stays as it is. (B, T, H, W, C)."""
    b, t, h, w, c = x.shape
    first, rest = (x[:, :1], x[:, 1:]) if t % 2 == 1 else (x[:, :0], x)
    pooled = rest.reshape(b, rest.shape[1] // 2, 2, h, w, c).mean(axis=2)
    return jnp.concatenate([first, pooled], axis=1)


class CogVideoXDownsample3D(nnx.Module):
    def __init__(self, in_channels, out_channels, compress_time, *, rngs, param_dtype):
        # diffusers pads (0, 1, 0, 1) with zeros, then a 3x3 stride-2 conv applied frame by frame
        self.conv = Conv(
            in_channels,
            out_channels,
            (3, 3),
            strides=(2, 2),
            padding=((0, 1), (0, 1)),
            kernel_init=nnx.initializers.zeros,
            rngs=rngs,
            param_dtype=param_dtype,
        )
        self.compress_time = compress_time

    def __call__(self, x):
        if self.compress_time and x.shape[1] > 1:
            x = _compress_time_pool(x)
        return self.conv(x)


class CogVideoXUpsample3D(nnx.Module):
    def __init__(self, in_channels, out_channels, compress_time, *, rngs, param_dtype):
        # nearest x2 in H, W, then the convolution
        self.conv = UpsampledConv(in_channels, out_channels, rngs=rngs, param_dtype=param_dtype)
        self.compress_time = compress_time

    def __call__(self, x):
        t = x.shape[1]
        if self.compress_time and t > 1:  # nearest x2 in time; with an odd count the first frame is not doubled
            first, rest = (x[:, :1], x[:, 1:]) if t % 2 == 1 else (x[:, :0], x)
            x = jnp.concatenate([first, jnp.repeat(rest, 2, axis=1)], axis=1)
        return self.conv(x)


class CogVideoXDownBlock3D(nnx.Module):
    def __init__(
        self, in_channels, out_channels, num_layers, groups, eps, add_downsample, compress_time, *, rngs, param_dtype
    ):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.resnets = nnx.List(
            [
                CogVideoXResnetBlock3D(in_channels if i == 0 else out_channels, out_channels, groups, eps, **kw)
                for i in range(num_layers)
            ]
        )
        self.downsamplers = nnx.List(
            [CogVideoXDownsample3D(out_channels, out_channels, compress_time, **kw)] if add_downsample else []
        )

    def __call__(self, x, cache=None):
        x, resnets = run_cached(self.resnets, x, (cache or {}).get("resnets"))
        for downsampler in self.downsamplers:
            x = downsampler(x)
        return x, {"resnets": resnets}


class CogVideoXMidBlock3D(nnx.Module):
    def __init__(self, channels, num_layers, groups, eps, spatial_norm_dim=None, *, rngs, param_dtype):
        self.resnets = nnx.List(
            [
                CogVideoXResnetBlock3D(
                    channels, channels, groups, eps, spatial_norm_dim, rngs=rngs, param_dtype=param_dtype
                )
                for _ in range(num_layers)
            ]
        )

    def __call__(self, x, zq=None, cache=None):
        x, resnets = run_cached(self.resnets, x, (cache or {}).get("resnets"), zq)
        return x, {"resnets": resnets}


class CogVideoXUpBlock3D(nnx.Module):
    def __init__(
        self,
        in_channels,
        out_channels,
        num_layers,
        groups,
        eps,
        spatial_norm_dim,
        add_upsample,
        compress_time,
        *,
        rngs,
        param_dtype,
    ):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.resnets = nnx.List(
            [
                CogVideoXResnetBlock3D(
                    in_channels if i == 0 else out_channels, out_channels, groups, eps, spatial_norm_dim, **kw
                )
                for i in range(num_layers)
            ]
        )
        self.upsamplers = nnx.List(
            [CogVideoXUpsample3D(out_channels, out_channels, compress_time, **kw)] if add_upsample else []
        )

    def __call__(self, x, zq, cache=None):
        x, resnets = run_cached(self.resnets, x, (cache or {}).get("resnets"), zq)
        for upsampler in self.upsamplers:
            x = upsampler(x)
        return x, {"resnets": resnets}


class CogVideoXEncoder3D(nnx.Module):
    def __init__(self, config: CogVideoXVAEConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        channels, groups, eps = config.block_out_channels, config.norm_num_groups, config.norm_eps
        self.conv_in = CogVideoXCausalConv3d(config.in_channels, channels[0], 3, **kw)
        self.down_blocks = nnx.List(
            [
                CogVideoXDownBlock3D(
                    level.in_channels,
                    level.out_channels,
                    config.layers_per_block,
                    groups,
                    eps,
                    add_downsample=level.resample,
                    compress_time=level.temporal,
                    **kw,
                )  # fmt: skip
                for level in config.down_levels()
            ]
        )
        self.mid_block = CogVideoXMidBlock3D(channels[-1], 2, groups, eps, **kw)
        self.norm_out = GroupNorm(groups, channels[-1], 1e-6, param_dtype=param_dtype)
        self.conv_out = CogVideoXCausalConv3d(channels[-1], 2 * config.latent_channels, 3, **kw)

    def __call__(self, x, cache=None):
        cache = cache or {}
        new = {}
        x, new["conv_in"] = self.conv_in(x, cache.get("conv_in"))
        x, new["down_blocks"] = run_cached(self.down_blocks, x, cache.get("down_blocks"))
        x, new["mid_block"] = self.mid_block(x, None, cache.get("mid_block"))
        x, new["conv_out"] = self.conv_out(silu(self.norm_out(x)), cache.get("conv_out"))
        return x, new


class CogVideoXDecoder3D(nnx.Module):
    def __init__(self, config: CogVideoXVAEConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        channels = list(reversed(config.block_out_channels))
        groups, eps, z = config.norm_num_groups, config.norm_eps, config.latent_channels
        self.conv_in = CogVideoXCausalConv3d(z, channels[0], 3, **kw)
        self.mid_block = CogVideoXMidBlock3D(channels[0], 2, groups, eps, spatial_norm_dim=z, **kw)
        self.up_blocks = nnx.List(
            [
                CogVideoXUpBlock3D(
                    level.in_channels,
                    level.out_channels,
                    config.layers_per_block + 1,
                    groups,
                    eps,
                    z,
                    add_upsample=level.resample,
                    compress_time=level.temporal,
                    **kw,
                )  # fmt: skip
                for level in config.up_levels()
            ]
        )
        self.norm_out = CogVideoXSpatialNorm3D(channels[-1], z, groups, **kw)
        self.conv_out = CogVideoXCausalConv3d(channels[-1], config.out_channels, 3, **kw)

    def __call__(self, z, cache=None):
        cache = cache or {}
        new = {}
        x, new["conv_in"] = self.conv_in(z, cache.get("conv_in"))
        x, new["mid_block"] = self.mid_block(x, z, cache.get("mid_block"))
        x, new["up_blocks"] = run_cached(self.up_blocks, x, cache.get("up_blocks"), z)
        x, new["conv_out"] = self.conv_out(silu(self.norm_out(x, z)), cache.get("conv_out"))
        return x, new


class AutoencoderKLCogVideoX(TilingMixin, nnx.Module):
    num_latent_frames_batch_size = 2
    num_sample_frames_batch_size = 8
    tiling_class = CogVideoXTiling

    def __init__(self, config: CogVideoXVAEConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.config = config
        self.encoder = CogVideoXEncoder3D(config, **kw)
        self.decoder = CogVideoXDecoder3D(config, **kw)
        # diffusers sizes these from out_channels (not latent_channels); kept so its checkpoints convert as they are.
        quant, out = 2 * config.out_channels, config.out_channels
        self.quant_conv = (
            Conv(quant, quant, (1, 1, 1), kernel_init=nnx.initializers.zeros, **kw) if config.use_quant_conv else None
        )
        self.post_quant_conv = (
            Conv(out, out, (1, 1, 1), kernel_init=nnx.initializers.zeros, **kw) if config.use_post_quant_conv else None
        )

    def encode(self, x, *, mesh=None):
        """(B, T, H, W, C) video -> (mean, logvar), in batches of 8 frames (the remainder joins the first).
        With a mesh ("dp", "tp"), batch and width are split over it (models/common/sharding.py)."""
        expect_video(x, self.config.in_channels, channels_last=True, what="encode", **self.config.encode_input_limits)
        bounds = frame_batches(x.shape[1], self.num_sample_frames_batch_size)
        mean, logvar = jnp.split(run_chunks(self, "encoder", x, bounds, mesh), 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, z, *, mesh=None):
        """(B, T, H, W, latent_channels) -> video, in batches of 2 latent frames (the remainder joins the first).
        Not clipped: diffusers does not clip CogVideoX's output. With a mesh, sharded as in encode."""
        expect_video(z, self.config.latent_channels, channels_last=True, what="decode")
        return run_chunks(self, "decoder", z, frame_batches(z.shape[1], self.num_latent_frames_batch_size), mesh)
