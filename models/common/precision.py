"""Low-precision arithmetic rounded as PyTorch rounds it, shared by the Flax models and the torchax lowerings."""

from __future__ import annotations

import jax.numpy as jnp


def in_float32(activation):
    """`activation` computed in float32 and rounded once to its input's dtype, as PyTorch computes its activations
    on low-precision tensors: SiLU as x * sigmoid(x) in bfloat16 rounds twice, which alone puts a bfloat16 decode
    about a seventh further from float32 than diffusers' bfloat16 (docs/performance.md, Design decisions)."""

    def rounded_once(x):
        return activation(x.astype(jnp.float32)).astype(x.dtype)

    return rounded_once


def plus_bias(y, bias, dtype):
    """A product accumulated in float32 (`preferred_element_type`) plus its bias, rounded once to `dtype`, as
    PyTorch's convolutions and linear layers round theirs; no bias: the product, rounded. A product an accelerator
    rounded itself (models/common/conv.py, rounds_convolutions_itself) takes its bias in its own dtype, which XLA adds
    inside cuDNN's convolution, before its one rounding."""
    return (y if bias is None else y + bias.astype(y.dtype)).astype(dtype)
