"""PyTorch's GroupNorm on channels-last activations, one function for the Flax models and the torchax runtime's
lowering of `aten.native_group_norm` (which moves channels last around it, so that the transposes cancel against
the convolutions' and XLA reads every activation in order)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def group_norm(x, num_groups: int, eps: float, scale=None, bias=None):
    """x (B, ..., C); groups are contiguous channel ranges, statistics over (..., C/G) in float32. Returns
    (output in x's dtype, mean (B, G), rstd (B, G))."""
    x32 = x.astype(jnp.float32)
    statistics = _two_pass if jax.default_backend() == "cpu" else _one_pass
    mean, var = statistics(x32, num_groups)
    rstd = jax.lax.rsqrt(var + eps)
    out = (x32 - _per_channel(mean, x)) * _per_channel(rstd, x)
    if scale is not None:
        out = out * scale.astype(jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(x.dtype), mean, rstd


def _two_pass(x, num_groups: int):
    """Each group's mean, then its variance from the centred squares: x read twice. On a CPU each channel's sum is a
    product with ones, then each group's channels are added: XLA:CPU runs this product (ones on the left, rows of
    (W*C)) at memory speed, where its reductions that keep the channel axis, and the same product over separate axes,
    are several times slower (docs/performance.md, Design decisions). The width stays an axis of its own or the major
    part of a merged one, so a width split over devices stays split."""
    b, c = x.shape[0], x.shape[-1]
    count = math.prod(x.shape[1:-1]) * (c // num_groups)

    def group_sums(v):
        rows = v.reshape(b, -1, (v.shape[-2] if v.ndim > 2 else 1) * c)  # (B, ..., W, C) -> (B, T*H, W*C)
        ones = jnp.ones(rows.shape[1], v.dtype)
        per_position = jax.lax.dot_general(ones, rows, (((0,), (1,)), ((), ())))  # (B, W*C)
        return per_position.reshape(b, -1, c).sum(axis=1).reshape(b, num_groups, -1).sum(axis=-1)

    mean = group_sums(x) / count
    return mean, group_sums(jnp.square(x - _per_channel(mean, x))) / count


def _one_pass(x, num_groups: int):
    """Each group's mean and variance from one read of x, as XLA's GPU and TPU compilers fuse it: every channel's
    sum and sum of squares over the positions (one reduction with two results), then the groups from their channels
    (Chan et al.'s pairwise update). Each channel is first shifted by its value at the first position, which lies
    within its spread: E[x^2] - E[x]^2 of the raw values loses the digits of the variance where the mean is large
    against the spread. Reducing the positions first, not each group's positions and channels together, spares XLA
    a partial sum per position (for Flux.2's decode at 1024x1024, 40.2 -> 3x.x GB moved in all)."""
    b, c = x.shape[0], x.shape[-1]
    positions, axes = math.prod(x.shape[1:-1]), tuple(range(1, x.ndim - 1))
    shift = jax.lax.stop_gradient(x[(slice(None), *(0,) * (x.ndim - 2))])  # (B, C)
    shifted = x - shift.reshape(b, *(1,) * (x.ndim - 2), c)
    sums, squares = shifted.sum(axes), jnp.square(shifted).sum(axes)  # (B, C) each
    channel_mean = (shift + sums / positions).reshape(b, num_groups, -1)
    channel_m2 = (squares - sums * sums / positions).reshape(b, num_groups, -1)
    mean = channel_mean.mean(axis=-1)
    m2 = channel_m2.sum(axis=-1) + positions * jnp.square(channel_mean - mean[..., None]).sum(axis=-1)
    return mean, m2 / (positions * (c // num_groups))


def _per_channel(stat, x):
    """(B, G) -> (B, 1, ..., 1, C), each group's value for each of its channels."""
    b, g = stat.shape
    per_channel = jax.lax.broadcast_in_dim(stat, (b, g, x.shape[-1] // g), (0, 1))  # (B, G, C/G)
    return per_channel.reshape(b, *(1,) * (x.ndim - 2), x.shape[-1])
