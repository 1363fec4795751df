"""PyTorch's GroupNorm on channels-last activations, one function for the Flax models and the torchax runtime's
lowering of `aten.native_group_norm` (which moves channels last around it, so that the transposes cancel against
the convolutions' and XLA reads every activation in order)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def group_norm(x, num_groups: int, eps: float, scale=None, bias=None):
    """x (B, ..., C); groups are contiguous channel ranges, statistics over (..., C/G) in float32. Returns
    (output in x's dtype, mean (B, G), rstd (B, G))."""
    # (B, ..., C) -> (B, ..., G, C/G): the other axes stay apart, so a width split over devices stays split
    grouped = x.reshape(*x.shape[:-1], num_groups, x.shape[-1] // num_groups).astype(jnp.float32)
    axes = (*range(1, x.ndim - 1), x.ndim)
    mean = grouped.mean(axis=axes, keepdims=True)
    var = jnp.square(grouped - mean).mean(axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    out = ((grouped - mean) * rstd).reshape(x.shape)
    if scale is not None:
        out = out * scale.astype(jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(x.dtype), mean.reshape(x.shape[0], num_groups), rstd.reshape(x.shape[0], num_groups)
