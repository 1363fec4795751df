"""MiniMax-H3's audio VAE (diffusers' `AutoencoderKLMiniMaxH3Audio`) in Flax NNX, channels-last: mono waveforms
(B, samples, 1) at 32 kHz, latents (B, samples / 800, 32) at the released sizes.

Read it beside diffusers' `autoencoder_kl_minimax_h3_audio.py`: modules carry the same names (nnx's `kernel`/`scale`
where PyTorch says `weight`). The encoder is DAC's (Snake activations, strided weight-normed convolutions), then a
causal-attention block narrows its trunk to the latent width (`pre_block`) before the mean and log-std heads; the
decoder is BigVGAN's (transposed convolutions, anti-aliased SnakeBeta resblocks, a clamp). The weight-normed
convolutions carry `weight_g` and `weight_v` as the checkpoint holds them and make their kernel from both at each
call, so an export gives back diffusers' tensors. The anti-aliasing filters are buffers loaded from the checkpoint.
Both parts run whole, in one step. Kernels start at zero: the model exists to be filled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ..common.attention import attention
from ..common.inputs import expect_sequence
from ..common.layers_flax import Buffer, Linear
from ..common.sine import sin
from ..common.steps_flax import run_image
from ..common.tiling import TilingMixin
from ..ltx2vocoder.modeling_flax import DIMENSIONS, AntiAliasAct1d, SnakeBeta, conv1d
from .config import AutoencoderKLMiniMaxH3AudioConfig, adaptive_pool_matrix

ANTIALIAS_RATIO, ANTIALIAS_KERNEL = 2, 12  # diffusers' Activation1d defaults, which the released model uses


def weight_norm(weight_g, weight_v, dtype):
    """PyTorch's weight_norm (dim 0): v scaled to norm g along the kept axis, the one g does not have length 1 on
    (v's norm over every other axis, computed in float32)."""
    v = weight_v[...].astype(jnp.float32)
    g = weight_g[...].astype(jnp.float32)
    others = tuple(i for i, n in enumerate(g.shape) if n == 1)  # all: a kept axis of one, whose norm is v's whole
    return (v * (g / jnp.sqrt(jnp.sum(v * v, axis=others, keepdims=True)))).astype(dtype)


class WeightNormConv1d(nnx.Module):
    """weight_norm(Conv1d): `weight_v` (k, I, O), `weight_g` (1, 1, O), PyTorch's zero padding and stride."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, dilation=1, padding=0, bias=True,
                 *, param_dtype):  # fmt: skip
        self.stride, self.dilation, self.padding = stride, dilation, padding
        self.weight_v = nnx.Param(jnp.zeros((kernel_size, in_channels, out_channels), param_dtype))
        self.weight_g = nnx.Param(jnp.zeros((1, 1, out_channels), param_dtype))
        self.bias = nnx.Param(jnp.zeros((out_channels,), param_dtype)) if bias else None

    def __call__(self, x):
        y = jax.lax.conv_general_dilated(
            x, weight_norm(self.weight_g, self.weight_v, x.dtype), (self.stride,), [(self.padding,) * 2],
            rhs_dilation=(self.dilation,), dimension_numbers=DIMENSIONS,
        )  # fmt: skip
        return y if self.bias is None else y + self.bias[...].astype(x.dtype)


class WeightNormConvTranspose1d(nnx.Module):
    """weight_norm(ConvTranspose1d): PyTorch's (I, O, k) `weight_v` kept as (k, I, O) and its `weight_g` (I, 1, 1)
    as (1, I, 1) (dim 0 is the input's there), run as a convolution of the zero-stuffed input with the kernel
    reversed; (L - 1) x stride - 2 x padding + k samples."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, *, param_dtype):
        self.stride, self.edge = stride, kernel_size - 1 - padding
        self.weight_v = nnx.Param(jnp.zeros((kernel_size, in_channels, out_channels), param_dtype))
        self.weight_g = nnx.Param(jnp.zeros((1, in_channels, 1), param_dtype))
        self.bias = nnx.Param(jnp.zeros((out_channels,), param_dtype))

    def __call__(self, x):
        kernel = weight_norm(self.weight_g, self.weight_v, x.dtype)[::-1]
        y = jax.lax.conv_general_dilated(
            x, kernel, (1,), [(self.edge, self.edge)], lhs_dilation=(self.stride,), dimension_numbers=DIMENSIONS
        )
        return y + self.bias[...].astype(x.dtype)


class MiniMaxH3AudioSnake1d(nnx.Module):
    """DAC's Snake: x + sin²(αx)/α per channel, α as stored (1, 1, C) (not a logarithm)."""

    def __init__(self, channels, *, param_dtype):
        self.alpha = nnx.Param(jnp.zeros((1, 1, channels), param_dtype))

    def __call__(self, x):
        alpha = self.alpha[...].astype(x.dtype)
        return x + (1.0 / (alpha + 1e-9)) * sin(alpha * x) ** 2


def antialiased_snake_beta(channels, param_dtype):
    return AntiAliasAct1d(SnakeBeta(channels, param_dtype=param_dtype), ANTIALIAS_RATIO, ANTIALIAS_KERNEL,
                          param_dtype=param_dtype)  # fmt: skip


def sequential(x, layers):
    for layer in layers:
        x = layer(x)
    return x


class MiniMaxH3AudioResidualUnit(nnx.Module):
    """Snake, a dilated 7-tap convolution, Snake, a 1-tap convolution; added to the input (the lengths agree)."""

    def __init__(self, dim, dilation, *, param_dtype):
        kw = dict(param_dtype=param_dtype)
        self.block = nnx.List([
            MiniMaxH3AudioSnake1d(dim, **kw),
            WeightNormConv1d(dim, dim, 7, dilation=dilation, padding=3 * dilation, **kw),
            MiniMaxH3AudioSnake1d(dim, **kw),
            WeightNormConv1d(dim, dim, 1, **kw),
        ])  # fmt: skip

    def __call__(self, x):
        return x + sequential(x, self.block)


class MiniMaxH3AudioEncoderBlock(nnx.Module):
    """Residual units at dilations 1, 3 and 9, Snake, then a strided convolution doubling the width."""

    def __init__(self, dim, stride, *, param_dtype):
        kw = dict(param_dtype=param_dtype)
        self.block = nnx.List([
            *(MiniMaxH3AudioResidualUnit(dim // 2, d, **kw) for d in (1, 3, 9)),
            MiniMaxH3AudioSnake1d(dim // 2, **kw),
            WeightNormConv1d(dim // 2, dim, 2 * stride, stride=stride, padding=-(-stride // 2), **kw),
        ])  # fmt: skip

    def __call__(self, x):
        return sequential(x, self.block)


class MiniMaxH3AudioEncoder(nnx.Module):
    """DAC's waveform encoder: (B, samples, 1) -> (B, samples / hop, latent_dim)."""

    def __init__(self, config: AutoencoderKLMiniMaxH3AudioConfig, *, param_dtype):
        kw = dict(param_dtype=param_dtype)
        widths = config.encoder_widths()
        self.block = nnx.List([
            WeightNormConv1d(1, widths[0], 7, padding=3, **kw),
            *(MiniMaxH3AudioEncoderBlock(w, s, **kw) for w, s in zip(widths[1:], config.encoder_rates)),
            MiniMaxH3AudioSnake1d(widths[-1], **kw),
            WeightNormConv1d(widths[-1], config.latent_dim, 3, padding=1, **kw),
        ])  # fmt: skip

    def __call__(self, x, cache=None):
        return sequential(x, self.block), None


def linear(in_features, out_features, *, rngs, param_dtype, bias=True):
    return Linear(in_features, out_features, use_bias=bias, kernel_init=nnx.initializers.zeros, rngs=rngs,
                      param_dtype=param_dtype)  # fmt: skip


def layer_norm(features, *, rngs, param_dtype):
    return nnx.LayerNorm(features, epsilon=1e-5, rngs=rngs, param_dtype=param_dtype)


class MiniMaxH3AudioCausalAttention(nnx.Module):
    """Causal self-attention whose heads are averaged, not concatenated, and whose head width is then pooled down
    to `out_dim` (PyTorch's adaptive average pooling) before `proj`. The key bias is a stored zero buffer."""

    def __init__(self, in_dim, out_dim, num_heads, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.num_heads, self.out_dim = num_heads, out_dim
        self.qkv = linear(in_dim, 3 * in_dim, bias=False, **kw)
        self.q_bias = nnx.Param(jnp.zeros((in_dim,), param_dtype))
        self.v_bias = nnx.Param(jnp.zeros((in_dim,), param_dtype))
        self.zero_k_bias = Buffer(jnp.zeros((in_dim,), param_dtype))
        self.proj = linear(out_dim, out_dim, **kw)

    def __call__(self, x):
        b, t, width = x.shape
        bias = jnp.concatenate([self.q_bias[...], self.zero_k_bias[...], self.v_bias[...]]).astype(x.dtype)
        qkv = (self.qkv(x) + bias).reshape(b, t, 3, self.num_heads, width // self.num_heads)
        # heads into the batch: (B x heads, T, head width); the tokens are frames of one token each, seen causally
        q, k, v = (jnp.swapaxes(a, 1, 2).reshape(b * self.num_heads, t, -1) for a in jnp.moveaxis(qkv, 2, 0))
        out = attention(q, k, v, frames=t).astype(x.dtype)
        out = out.reshape(b, self.num_heads, t, -1).mean(axis=1)
        pooled = out @ jnp.asarray(adaptive_pool_matrix(out.shape[-1], self.out_dim), x.dtype)
        return self.proj(pooled)


class MiniMaxH3AudioGeGluMlp(nnx.Module):
    def __init__(self, in_features, hidden_features, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm = layer_norm(in_features, **kw)
        self.w0 = linear(in_features, hidden_features, **kw)
        self.w1 = linear(in_features, hidden_features, **kw)
        self.w2 = linear(hidden_features, in_features, **kw)

    def __call__(self, x):
        x = self.norm(x)
        return self.w2(jax.nn.gelu(self.w0(x), approximate=True) * self.w1(x))


class MiniMaxH3AudioAttnProjection(nnx.Module):
    """`pre_block`: latent_dim -> latent_channels as proj(norm3(x)) + attn(norm1(x)), then a GeGLU feed-forward
    added."""

    def __init__(self, in_dim, out_dim, num_heads, mlp_ratio=2, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm1 = layer_norm(in_dim, **kw)
        self.attn = MiniMaxH3AudioCausalAttention(in_dim, out_dim, num_heads, **kw)
        self.proj = linear(in_dim, out_dim, **kw)
        self.norm3 = layer_norm(in_dim, **kw)
        self.norm2 = layer_norm(out_dim, **kw)
        self.mlp = MiniMaxH3AudioGeGluMlp(out_dim, out_dim * mlp_ratio, **kw)

    def __call__(self, x):
        x = self.proj(self.norm3(x)) + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MiniMaxH3AudioAMPBlock(nnx.Module):
    """BigVGAN's AMP block: per dilation, (anti-aliased SnakeBeta, dilated convolution, anti-aliased SnakeBeta,
    convolution), added to its input; `activations` interleaves the two activations of each pair."""

    def __init__(self, channels, kernel_size, dilations, *, param_dtype):
        kw = dict(param_dtype=param_dtype)
        self.convs1 = nnx.List([
            WeightNormConv1d(channels, channels, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2, **kw)
            for d in dilations
        ])  # fmt: skip
        self.convs2 = nnx.List([
            WeightNormConv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2, **kw) for _ in dilations
        ])  # fmt: skip
        self.activations = nnx.List([antialiased_snake_beta(channels, param_dtype) for _ in range(2 * len(dilations))])

    def __call__(self, x):
        acts = self.activations
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, acts[::2], acts[1::2]):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class MiniMaxH3AudioBigVGANDecoder(nnx.Module):
    """BigVGAN: (B, T, latent_dim) -> (B, T x hop, 1) in [-1, 1]: conv_pre, per upsampler a transposed convolution
    and the mean of its AMP blocks, then an anti-aliased SnakeBeta, conv_post and the clamp."""

    def __init__(self, config: AutoencoderKLMiniMaxH3AudioConfig, *, param_dtype):
        kw = dict(param_dtype=param_dtype)
        widths = config.decoder_widths()
        self.conv_pre = WeightNormConv1d(config.latent_dim, widths[0], 7, padding=3, **kw)
        self.ups = nnx.List([
            nnx.List([WeightNormConvTranspose1d(widths[i], widths[i + 1], k, r, (k - r) // 2, **kw)])
            for i, (r, k) in enumerate(zip(config.decoder_rates, config.decoder_kernel_sizes))
        ])  # fmt: skip
        self.resblocks = nnx.List([
            MiniMaxH3AudioAMPBlock(width, k, dilations, **kw)
            for width in widths[1:]
            for k, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)
        ])  # fmt: skip
        self.activation_post = antialiased_snake_beta(widths[-1], param_dtype)
        self.conv_post = WeightNormConv1d(widths[-1], 1, 7, padding=3, bias=False, **kw)
        self.per_level = len(config.resblock_kernel_sizes)

    def __call__(self, x, cache=None):
        x = self.conv_pre(x)
        for i, (up,) in enumerate(self.ups):
            x = up(x)
            blocks = self.resblocks[i * self.per_level : (i + 1) * self.per_level]
            x = sum(block(x) for block in blocks) / self.per_level
        return jnp.clip(self.conv_post(self.activation_post(x)), -1.0, 1.0), None


class AutoencoderKLMiniMaxH3Audio(TilingMixin, nnx.Module):
    """A mono waveform to latents (the posterior's mean and log standard deviation) and back. The encoder part is
    DAC's encoder, its `pre_block` and the two heads standing where other families' quant_conv does; the decoder
    part is dec_in_proj (their post_quant_conv) then BigVGAN."""

    tiling_class = None  # diffusers' class does not tile

    def __init__(self, config: AutoencoderKLMiniMaxH3AudioConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.config = config
        latent = config.latent_channels
        self.encoder = MiniMaxH3AudioEncoder(config, param_dtype=param_dtype)
        self.pre_block = MiniMaxH3AudioAttnProjection(config.latent_dim, latent, config.num_attention_heads, **kw)
        self.mean_proj = conv1d(latent, latent, 1, **kw)
        self.logs_proj = conv1d(latent, latent, 1, **kw)
        self.dec_in_proj = conv1d(latent, config.latent_dim, 1, **kw)
        self.decoder = MiniMaxH3AudioBigVGANDecoder(config, param_dtype=param_dtype)

    def posterior(self, x):
        """The encoder's trunk -> mean and log standard deviation, concatenated on the channels."""
        x = self.pre_block(x)
        return jnp.concatenate([self.mean_proj(x), self.logs_proj(x)], axis=-1)

    @property
    def quant_conv(self):
        return self.posterior

    @property
    def post_quant_conv(self):
        return self.dec_in_proj

    def encode(self, x, *, mesh=None):
        """(B, samples, 1) waveforms, zero-padded on the right to whole latent frames -> (mean, log standard
        deviation), each (B, ceil(samples / hop), latent_channels)."""
        expect_sequence(x, 1, channels_last=True, what="encode")
        x = jnp.pad(x, ((0, 0), (0, -x.shape[1] % self.config.hop), (0, 0)))
        return tuple(jnp.split(run_image(self, "encoder", x, mesh), 2, axis=-1))

    def decode(self, z, *, mesh=None):
        """(B, T, latent_channels) latents -> (B, T x hop, 1) waveforms in [-1, 1]."""
        expect_sequence(z, self.config.latent_channels, channels_last=True, what="decode")
        return run_image(self, "decoder", z, mesh)
