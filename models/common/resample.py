"""Resampling a signal (B, L, C) along its time axis, and the anti-aliased SnakeBeta of BigVGAN-style vocoders (LTX-2's
vocoders, MiniMax-H3's audio decoder), in JAX: what the Flax models run and what the torchax runtime lowers the
PyTorch models' `vae_convert::anti_aliased_snake` to (models/common/layers_torch.py), so both compute it alike."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .anti_alias import edges
from .conv import depthwise_1d
from .sine import sin


def fir(x, taps, *, stride=1):
    """Every channel of x (B, L, C) through one filter `taps` (K,), as PyTorch's depthwise Conv1d (a correlation,
    no padding) with `stride`, summed in float32 and rounded once."""
    return depthwise_1d(x, taps, stride).astype(x.dtype)


def transposed_fir(x, taps, ratio):
    """PyTorch's depthwise ConvTranspose1d of x (B, L, C) with `taps` (K,) and stride `ratio`, (L - 1) x ratio + K
    samples: each of the `ratio` phases a full convolution of x with every `ratio`-th tap, interleaved."""
    (batch, length, channels), k = x.shape, taps.shape[0]
    per_phase = -(-k // ratio)
    taps = jnp.pad(taps, (0, per_phase * ratio - k))
    x = jnp.pad(x, ((0, 0), (per_phase - 1, per_phase - 1), (0, 0)))
    phases = jnp.stack([fir(x, taps[p::ratio][::-1]) for p in range(ratio)], axis=2)
    return phases.reshape(batch, -1, channels)[:, : (length - 1) * ratio + k]


def replicate(x, left, right):
    return jnp.pad(x, ((0, 0), (left, right), (0, 0)), mode="edge")


def upsample(x, taps, ratio, pad, crop):
    """Zero-stuffing by `ratio` through the low-pass filter `taps` (PyTorch's depthwise transposed convolution),
    edges replicated by `pad` first and `crop` (start, end) samples dropped after."""
    y = ratio * transposed_fir(replicate(x, pad, pad), taps, ratio)
    return y[:, crop[0] : y.shape[1] - crop[1]]


def snake_beta(x, log_alpha, log_beta):
    """x + sin²(αx)/β per channel (the last axis), α and β given as logarithms (no β: β = α, plain Snake), in the
    dtype x and the parameters promote to, as PyTorch computes it."""
    alpha = jnp.exp(log_alpha)
    amplitude = alpha if log_beta is None else jnp.exp(log_beta)
    return x + (1.0 / (amplitude + 1e-9)) * sin(x * alpha) ** 2


@functools.partial(jax.jit, static_argnames="ratio")
def anti_aliased_snake(x, up_taps, down_taps, log_alpha, log_beta, ratio):
    """snake_beta at `ratio` times the rate of x (B, L, C): upsampled in x's dtype through `up_taps` (K,), activated,
    low-passed through `down_taps` (K,) and decimated back to L samples, each filter's edges replicated as BigVGAN's
    are. Jitted on its own: a vocoder runs hundreds of these, a few shapes among them, and JAX traces and lowers each
    shape once, not once a call (XLA inlines the calls)."""
    pad, crop, down_pad = edges(up_taps.shape[0], down_taps.shape[0], ratio)
    y = snake_beta(upsample(x, up_taps.astype(x.dtype), ratio, pad, crop), log_alpha, log_beta)
    return fir(replicate(y, *down_pad), down_taps.astype(y.dtype), stride=ratio)
