"""Flax NNX layers several families share."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from .group_norm import group_norm


class GroupNorm(nnx.Module):
    """PyTorch's GroupNorm on channels-last input: groups are contiguous channel ranges; statistics over
    (T, H, W, C/G) in float32."""

    def __init__(self, num_groups, num_channels, eps, *, param_dtype):
        self.num_groups, self.eps = num_groups, eps
        self.scale = nnx.Param(jnp.ones((num_channels,), param_dtype))
        self.bias = nnx.Param(jnp.zeros((num_channels,), param_dtype))

    def __call__(self, x):
        return group_norm(x, self.num_groups, self.eps, self.scale[...], self.bias[...])[0]
