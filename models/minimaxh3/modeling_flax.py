"""MiniMax-H3's video VAE (diffusers' `AutoencoderKLMiniMaxH3`) in Flax NNX, channels-last: videos are
(B, T, H, W, C), latents (B, T, H/16, W/16, 24) at the released sizes.

Read it beside diffusers' `autoencoder_kl_minimax_h3.py`: modules carry the same names (nnx's `kernel`/`scale` where
PyTorch says `weight`). The encoder is a causal Conv3d network (reflect-padded in space, zero frames in front,
GroupNorm per frame) run on each 17-frame clip alone; the decoder a ViT run on each chunk of latent frames alone:
every latent voxel a token, register tokens and a zero token after them, a rotary embedding over (t, h, w) on a
share of each head's channels, q/k RMS norms and the residual stream in float32, layer scales, a SwiGLU
feed-forward. Clips, chunks, their cross-fades and the tiles (on by default, as released) are models/minimaxh3/
clips.py's, shared with the PyTorch model. The attention is computed in blocks with a running softmax, so a tile's
(or, untiled, a chunk's) score matrix is never held whole. On a mesh ("dp", "tp"), the encoder's activations split
by batch and width as every family's; the decoder's tokens split by batch over "dp" and by token over "tp": a
device holds its share of the residual stream and computes the per-token layers and its queries' attention for it,
taking every key and value (the parameters are replicated).
Kernels start at zero, not random: the model exists to be filled from a checkpoint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ..common.attention import query_split_attention
from ..common.conv import prepadded_conv
from ..common.inputs import expect_video
from ..common.layers_flax import Conv, GroupNorm, Linear, silu
from ..common.sharding import constrain_tokens
from ..common.steps_flax import run_chunks
from ..common.tiling import TilingMixin
from .clips import MiniMaxH3Tiling, decode_in_chunks, encode_in_clips, rope_angles
from .config import AutoencoderKLMiniMaxH3Config

PADDING_MODES = {"reflect": "reflect", "replicate": "edge", "zeros": "constant", "circular": "wrap"}


def _zeros(*shape, param_dtype):
    return nnx.Param(jnp.zeros(shape, param_dtype))


class MiniMaxH3VideoCausalConv3d(nnx.Module):
    """Conv3d after padding: `spatial_padding` rows and columns around in the config's mode, `temporal_padding`
    zero frames in front."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, spatial_padding=0, temporal_padding=0,
                 spatial_padding_mode="reflect", *, rngs, param_dtype):  # fmt: skip
        self.spatial_padding, self.temporal_padding = spatial_padding, temporal_padding
        self.mode = PADDING_MODES[spatial_padding_mode]
        stride = stride if isinstance(stride, tuple) else (stride,) * 3
        self.conv = Conv(in_channels, out_channels, (kernel_size,) * 3, strides=stride, padding=((0, 0),) * 3,
                             kernel_init=nnx.initializers.zeros, rngs=rngs, param_dtype=param_dtype,
                             conv_general_dilated=prepadded_conv)  # fmt: skip

    def __call__(self, x):
        p = self.spatial_padding
        if p:
            x = jnp.pad(x, ((0, 0), (0, 0), (p, p), (p, p), (0, 0)), mode=self.mode)
        if self.temporal_padding:
            x = jnp.pad(x, ((0, 0), (self.temporal_padding, 0), (0, 0), (0, 0), (0, 0)))
        return self.conv(x)


class MiniMaxH3VideoGroupNorm(GroupNorm):
    """GroupNorm of each frame alone: time folded into the batch."""

    def __call__(self, x):
        b, t = x.shape[:2]
        return super().__call__(x.reshape(b * t, *x.shape[2:])).reshape(x.shape)


class MiniMaxH3VideoResnetBlock3d(nnx.Module):
    def __init__(self, in_channels, out_channels, groups, eps, mode, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm1 = MiniMaxH3VideoGroupNorm(groups, in_channels, eps, param_dtype=param_dtype)
        self.conv1 = MiniMaxH3VideoCausalConv3d(in_channels, out_channels, 3, 1, 1, 2, mode, **kw)
        self.norm2 = MiniMaxH3VideoGroupNorm(groups, out_channels, eps, param_dtype=param_dtype)
        self.conv2 = MiniMaxH3VideoCausalConv3d(out_channels, out_channels, 3, 1, 1, 2, mode, **kw)
        shortcut = in_channels != out_channels
        self.conv_shortcut = MiniMaxH3VideoCausalConv3d(in_channels, out_channels, 1, **kw) if shortcut else None

    def __call__(self, x):
        h = self.conv1(silu(self.norm1(x)))
        h = self.conv2(silu(self.norm2(h)))
        return (x if self.conv_shortcut is None else self.conv_shortcut(x)) + h


class MiniMaxH3VideoDownsample3d(nnx.Module):
    """A strided 3x3x3 convolution; a spatial stride of 2 pads one row and column after, in the config's mode."""

    def __init__(self, channels, temporal_stride, spatial_stride, mode, *, rngs, param_dtype):
        self.spatial_stride, self.mode = spatial_stride, PADDING_MODES[mode]
        stride = (temporal_stride, spatial_stride, spatial_stride)
        self.conv = MiniMaxH3VideoCausalConv3d(channels, channels, 3, stride, 0, 2, mode, rngs=rngs,
                                               param_dtype=param_dtype)  # fmt: skip

    def __call__(self, x):
        if self.spatial_stride == 2:
            x = jnp.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1), (0, 0)), mode=self.mode)
        return self.conv(x)


class MiniMaxH3VideoDownBlock3d(nnx.Module):
    def __init__(self, in_channels, out_channels, config: AutoencoderKLMiniMaxH3Config, level: int, *, rngs,
                 param_dtype):  # fmt: skip
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        groups, eps, mode = config.norm_num_groups, config.norm_eps, config.spatial_padding_mode
        self.resnets = nnx.List(
            [
                MiniMaxH3VideoResnetBlock3d(
                    in_channels if i == 0 else out_channels, out_channels, groups, eps, mode, **kw
                )  # fmt: skip
                for i in range(config.layers_per_block)
            ]
        )
        time, space = config.temporal_downsample_factors[level], config.spatial_downsample_factors[level]
        downsampler = MiniMaxH3VideoDownsample3d(out_channels, time, space, mode, **kw) if time * space > 1 else None
        self.downsamplers = nnx.List([downsampler]) if downsampler is not None else None

    def __call__(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.downsamplers is None else self.downsamplers[0](x)


class MiniMaxH3VideoEncoder3d(nnx.Module):
    def __init__(self, config: AutoencoderKLMiniMaxH3Config, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        channels, mode = config.block_out_channels, config.spatial_padding_mode
        self.conv_in = MiniMaxH3VideoCausalConv3d(config.in_channels, channels[0], 3, 1, 1, 2, mode, **kw)
        ins = (channels[0],) + tuple(channels[:-1])
        self.down_blocks = nnx.List(
            [MiniMaxH3VideoDownBlock3d(ins[i], channels[i], config, i, **kw) for i in range(len(channels))]
        )
        self.norm_out = MiniMaxH3VideoGroupNorm(config.norm_num_groups, channels[-1], config.norm_eps,
                                                param_dtype=param_dtype)  # fmt: skip
        self.conv_out = MiniMaxH3VideoCausalConv3d(channels[-1], 2 * config.latent_channels, 3, 1, 1, 2, mode, **kw)

    def __call__(self, x, cache=None):
        """One clip (no cache: clips are encoded apart)."""
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        return self.conv_out(silu(self.norm_out(x))), None


def rms_norm(x, eps, scale=None):
    """nn.RMSNorm's computation, in float32."""
    x = x.astype(jnp.float32)
    out = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)
    return out if scale is None else out * scale.astype(jnp.float32)


class RMSNorm(nnx.Module):
    def __init__(self, dim, eps, *, param_dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))

    def __call__(self, x):
        return rms_norm(x, self.eps, self.scale[...])


class LayerNorm(nnx.Module):
    """nn.LayerNorm with its affine, computed in float32."""

    def __init__(self, dim, eps, *, param_dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.bias = nnx.Param(jnp.zeros((dim,), param_dtype))

    def __call__(self, x):
        x = x.astype(jnp.float32)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        out = (x - mean) * jax.lax.rsqrt(var + self.eps)
        return out * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)


def rotate(x, cos, sin):
    """The rotary embedding on the first cos.shape[-1] channels of each head (rotate-half), the rest passed."""
    d = cos.shape[-1]
    turned, passed = x[..., :d], x[..., d:]
    first, second = jnp.split(turned, 2, axis=-1)
    return jnp.concatenate([turned * cos + jnp.concatenate([-second, first], axis=-1) * sin, passed], axis=-1)


def linear(dim_in, dim_out, *, rngs, param_dtype):
    return Linear(dim_in, dim_out, kernel_init=nnx.initializers.zeros, rngs=rngs, param_dtype=param_dtype)


class MiniMaxH3VideoAttention(nnx.Module):
    def __init__(self, dim, heads, head_dim, eps, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.heads, self.eps = heads, eps
        self.to_q = linear(dim, heads * head_dim, **kw)
        self.to_k = linear(dim, heads * head_dim, **kw)
        self.to_v = linear(dim, heads * head_dim, **kw)
        self.to_out = nnx.List([linear(heads * head_dim, dim, **kw)])

    def __call__(self, x, cos, sin):
        b, n, _ = x.shape
        q, k, v = (proj(x).reshape(b, n, self.heads, -1) for proj in (self.to_q, self.to_k, self.to_v))
        # q and k normalised in float32 whatever the compute dtype, as diffusers does
        q = rotate(rms_norm(q, self.eps).astype(x.dtype), cos, sin)
        k = rotate(rms_norm(k, self.eps).astype(x.dtype), cos, sin)

        def heads_as_batch(t):  # (B, N, heads, D) -> (B * heads, N, D)
            return t.transpose(0, 2, 1, 3).reshape(b * self.heads, n, -1)

        out = query_split_attention(heads_as_batch(q), heads_as_batch(k), heads_as_batch(v))
        return self.to_out[0](out.reshape(b, self.heads, n, -1).transpose(0, 2, 1, 3).reshape(b, n, -1))


class SwiGLU(nnx.Module):
    def __init__(self, dim, inner, *, rngs, param_dtype):
        self.proj = linear(dim, 2 * inner, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, x):
        up, gate = jnp.split(self.proj(x), 2, axis=-1)  # diffusers' order: [up; gate]
        return up * silu(gate)


class Dropout(nnx.Module):
    """diffusers' `ff.net.1`, a dropout of 0: nothing in eval, but it takes the index."""

    def __call__(self, x):
        return x


class FeedForward(nnx.Module):
    def __init__(self, dim, mult, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.net = nnx.List([SwiGLU(dim, dim * mult, **kw), Dropout(), linear(dim * mult, dim, **kw)])

    def __call__(self, x):
        return self.net[2](self.net[0](x))


class MiniMaxH3VideoTransformerBlock(nnx.Module):
    def __init__(self, config: AutoencoderKLMiniMaxH3Config, *, rngs, param_dtype):
        dim, eps = config.dim, config.decoder_norm_eps
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm1 = RMSNorm(dim, eps, param_dtype=param_dtype)
        self.attn = MiniMaxH3VideoAttention(dim, config.decoder_num_attention_heads,
                                            config.decoder_attention_head_dim, eps, **kw)  # fmt: skip
        self.scale1 = _zeros(dim, param_dtype=param_dtype)
        self.norm2 = RMSNorm(dim, eps, param_dtype=param_dtype)
        self.ff = FeedForward(dim, config.decoder_ffn_mult, **kw)
        self.scale2 = _zeros(dim, param_dtype=param_dtype)

    def __call__(self, x, cos, sin):
        """x the float32 residual stream; the normed activations in the compute dtype (the rotary tables')."""
        dtype = cos.dtype
        x = x + self.attn(self.norm1(x).astype(dtype), cos, sin).astype(jnp.float32) * self.scale1[...].astype(
            jnp.float32
        )
        return x + self.ff(self.norm2(x).astype(dtype)).astype(jnp.float32) * self.scale2[...].astype(jnp.float32)


class MiniMaxH3VideoViTDecoder3d(nnx.Module):
    def __init__(self, config: AutoencoderKLMiniMaxH3Config, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.config = config
        dim = config.dim
        self.proj_in = linear(config.latent_channels, dim, **kw)
        self.register_tokens = _zeros(1, config.decoder_num_register_tokens, dim, param_dtype=param_dtype)
        self.transformer_blocks = nnx.List(
            [MiniMaxH3VideoTransformerBlock(config, **kw) for _ in range(config.decoder_num_layers)]
        )
        self.norm_out = LayerNorm(dim, config.decoder_norm_eps, param_dtype=param_dtype)
        patch = config.temporal_ratio * config.spatial_ratio**2
        self.proj_out = linear(dim, config.out_channels * patch, **kw)

    def __call__(self, x, cache=None):
        """One chunk of latent frames (no cache: chunks are decoded apart)."""
        c = self.config
        b, t, h, w, _ = x.shape
        tokens = self.proj_in(x.reshape(b, t * h * w, -1)).astype(jnp.float32)
        registers = jnp.broadcast_to(
            self.register_tokens[...].astype(jnp.float32), (b, *self.register_tokens.shape[1:])
        )
        tokens = jnp.concatenate([tokens, registers, jnp.zeros((b, 1, tokens.shape[-1]), jnp.float32)], axis=1)
        tokens = constrain_tokens(tokens)  # on a mesh: each device a share of the tokens (all of their channels)
        angles = jnp.asarray(rope_angles(c, t, h, w))[None, :, None]  # (1, N, 1, rope_dim)
        dtype = x.dtype  # the latent's: the output's dtype, or float32 where validation runs the model so
        cos, sin = jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)
        for block in self.transformer_blocks:
            tokens = block(tokens, cos, sin)
        out = self.proj_out(self.norm_out(tokens[:, : t * h * w]).astype(dtype))
        pt, p = c.temporal_ratio, c.spatial_ratio
        out = out.reshape(b, t, h, w, c.out_channels, pt, p, p).transpose(0, 1, 5, 2, 6, 3, 7, 4)
        return out.reshape(b, t * pt, h * p, w * p, c.out_channels), None


class AutoencoderKLMiniMaxH3(TilingMixin, nnx.Module):
    tiling_class = MiniMaxH3Tiling

    def __init__(self, config: AutoencoderKLMiniMaxH3Config, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        latent = config.latent_channels
        self.config = config
        self.encoder = MiniMaxH3VideoEncoder3d(config, **kw)
        conv = dict(kernel_init=nnx.initializers.zeros, conv_general_dilated=prepadded_conv, **kw)
        self.quant_conv = Conv(2 * latent, 2 * latent, (1, 1, 1), **conv)
        self.post_quant_conv = Conv(latent, latent, (1, 1, 1), **conv)
        self.decoder = MiniMaxH3VideoViTDecoder3d(config, **kw)
        self.enable_tiling()  # as the model was released, and diffusers' class starts

    def encode(self, x, *, mesh=None):
        """(B, T, H, W, C) video, ImageNet-normalised -> (mean, logvar), each (B, 5n + 2 latent frames for 17n + 5
        frames, or 1 for one image, H/16, W/16, latent_channels)."""
        expect_video(x, self.config.in_channels, channels_last=True, what="encode", **self.config.encode_input_limits)
        moments = encode_in_clips(
            lambda x, bounds: run_chunks(self, "encoder", x, bounds, mesh), x, self.config, t_axis=1,
            concat=jnp.concatenate,
        )  # fmt: skip
        mean, logvar = jnp.split(moments, 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, z, *, mesh=None):
        """(B, T, H, W, latent_channels) latents, T at least 3 -> (B, frames, 16H, 16W, C) video (unclamped, as
        diffusers)."""
        expect_video(z, self.config.latent_channels, channels_last=True, what="decode")
        return decode_in_chunks(
            lambda chunk: run_chunks(self, "decoder", chunk, [(0, chunk.shape[1])], mesh),
            z,
            self.config,
            t_axis=1,
            concat=jnp.concatenate,
            as_array=lambda values, like: jnp.asarray(values, like.dtype),
        )
