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
    count = math.prod(x.shape[1:-1]) * (x.shape[-1] // num_groups)
    x32 = x.astype(jnp.float32)
    mean = _group_sums(x32, num_groups) / count  # (B, G)
    centered = x32 - _per_channel(mean, x)
    var = _group_sums(jnp.square(centered), num_groups) / count
    rstd = jax.lax.rsqrt(var + eps)
    out = centered * _per_channel(rstd, x)
    if scale is not None:
        out = out * scale.astype(jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(x.dtype), mean, rstd


def _group_sums(x, num_groups: int):
    """(B, ..., C) -> (B, G), each group's sum over the middle axes and its channels. Elsewhere than on a CPU, a
    reduction, which XLA fuses with the cast and the square that make x (a product stays a product, its operand
    materialised). On a CPU, each channel's sum as a product with ones, then each group's channels added: XLA:CPU runs
    this product (ones on the left, rows of (W*C)) at memory speed, where its reductions that keep the channel axis,
    and the same product over separate axes, are several times slower (docs/performance.md, Design decisions). Both
    keep the width an axis of its own or the major part of a merged one, so a width split over devices stays split."""
    b, c = x.shape[0], x.shape[-1]
    if jax.default_backend() != "cpu":
        grouped = x.reshape(*x.shape[:-1], num_groups, c // num_groups)
        return grouped.sum(axis=(*range(1, x.ndim - 1), x.ndim))
    w = x.shape[-2] if x.ndim > 2 else 1
    rows = x.reshape(b, -1, w * c)  # (B, ..., W, C) -> (B, T*H, W*C)
    ones = jnp.ones(rows.shape[1], x.dtype)
    per_position = jax.lax.dot_general(ones, rows, (((0,), (1,)), ((), ())))  # (B, W*C)
    return per_position.reshape(b, w, c).sum(axis=1).reshape(b, num_groups, -1).sum(axis=-1)


def _per_channel(stat, x):
    """(B, G) -> (B, 1, ..., 1, C), each group's value for each of its channels."""
    b, g = stat.shape
    per_channel = jax.lax.broadcast_in_dim(stat, (b, g, x.shape[-1] // g), (0, 1))  # (B, G, C/G)
    return per_channel.reshape(b, *(1,) * (x.ndim - 2), x.shape[-1])
