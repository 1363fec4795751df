"""Flax NNX layers several families share."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .attention import attention
from .conv import conv_general_dilated, cpu_conv, upsampled_conv
from .group_norm import group_norm
from .precision import in_float32


class Buffer(nnx.Variable):
    """A tensor the checkpoint carries that is no parameter (diffusers' persistent buffers)."""


silu = in_float32(jax.nn.silu)


class _RoundedOnce:
    """A layer rounded once: in a low precision it accumulates in float32 and adds its bias there, as PyTorch's
    convolutions and linear layers do, then rounds to the dtype it computes in. Rounding the product and again its
    sum with the bias puts a bfloat16 decode up to a third further from float32 than diffusers' bfloat16
    (docs/performance.md, Design decisions)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, preferred_element_type=jnp.float32, **kwargs)

    def __call__(self, x):
        # the dtype nnx's own layer would give: its own, else its input's and kernel's (a kept float32 layer's)
        return super().__call__(x).astype(self.dtype or jnp.result_type(x.dtype, self.kernel.dtype))


class Conv(_RoundedOnce, nnx.Conv):
    """nnx.Conv, rounded once, by conv.py's convolution unless given another (as an accelerator rounds it)."""

    def __init__(self, *args, conv_general_dilated=conv_general_dilated, **kwargs):
        super().__init__(*args, conv_general_dilated=conv_general_dilated, **kwargs)

    def upsampled(self, x, edge=False):
        """This 3x3 convolution (in height and width) of x upsampled by 2 (nearest) in height and width, padded by
        one around (zeros, or the edge), its leading window axes as x already has them padded (models/common/conv.py,
        upsampled_conv)."""
        dtype = self.dtype or jnp.result_type(x.dtype, self.kernel.dtype)
        bias = None if self.bias is None else self.bias[...]
        kernel = self.kernel[...].astype(dtype)
        return upsampled_conv(x.astype(dtype), kernel, bias, dtype, conv=self.conv_general_dilated, edge=edge)


class UpsampledConv(Conv):
    """A 3x3 convolution, a zero around, of its input upsampled by 2 (nearest) in height and width, as diffusers'
    upsamplers run it (their convolution's parameters); off the CPU by output phase, never making the upsampled
    input (models/common/conv.py, upsampled_conv)."""

    def __init__(self, in_channels, out_channels, *, rngs, param_dtype):
        super().__init__(
            in_channels,
            out_channels,
            (3, 3),
            padding=((1, 1), (1, 1)),
            kernel_init=nnx.initializers.zeros,  # filled by the converted weights
            rngs=rngs,
            param_dtype=param_dtype,
            conv_general_dilated=cpu_conv,  # on a CPU, the convolution of the upsampled input takes its routes
        )

    def __call__(self, x):
        return self.upsampled(x)


class Linear(_RoundedOnce, nnx.Linear):
    """nnx.Linear, rounded once."""


class BatchNorm2d(nnx.Module):
    """PyTorch's `BatchNorm2d(channels, eps, affine=False)` as it runs in eval mode, over the last axis: its running
    statistics and its count of batches, carried as the checkpoint holds them. The count is a 32-bit integer (JAX's
    without x64), written back as PyTorch's int64."""

    def __init__(self, channels, eps, *, param_dtype):
        self.eps = eps
        self.running_mean = Buffer(jnp.zeros((channels,), param_dtype))
        self.running_var = Buffer(jnp.ones((channels,), param_dtype))
        self.num_batches_tracked = Buffer(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        return (x - self.running_mean[...]) * jax.lax.rsqrt(self.running_var[...] + self.eps)


class GroupNorm(nnx.Module):
    """PyTorch's GroupNorm on channels-last input: groups are contiguous channel ranges; statistics over
    (T, H, W, C/G) in float32."""

    def __init__(self, num_groups, num_channels, eps, *, param_dtype):
        self.num_groups, self.eps = num_groups, eps
        self.scale = nnx.Param(jnp.ones((num_channels,), param_dtype))
        self.bias = nnx.Param(jnp.zeros((num_channels,), param_dtype))

    def __call__(self, x):
        return group_norm(x, self.num_groups, self.eps, self.scale[...], self.bias[...])[0]


class Attention(nnx.Module):
    """diffusers' Attention as the VAEs' mid blocks configure it: GroupNorm first, one head as wide as the channels,
    q/k/v and an output projection with biases, the input added back. Over an image's pixels (B, H, W, C), or a
    clip's (B, T, H, W, C) where a token sees its own and earlier frames (HunyuanVideo's mask); in blocks, never the
    score matrix whole."""

    def __init__(self, channels, groups, *, rngs, param_dtype):
        kw = dict(kernel_init=nnx.initializers.zeros, rngs=rngs, param_dtype=param_dtype)
        self.group_norm = GroupNorm(groups, channels, 1e-6, param_dtype=param_dtype)
        self.to_q = Linear(channels, channels, **kw)
        self.to_k = Linear(channels, channels, **kw)
        self.to_v = Linear(channels, channels, **kw)
        self.to_out = nnx.List([Linear(channels, channels, **kw)])

    def __call__(self, x):
        frames = x.shape[1] if x.ndim == 5 else 1
        tokens = self.group_norm(x).reshape(x.shape[0], -1, x.shape[-1])
        out = attention(self.to_q(tokens), self.to_k(tokens), self.to_v(tokens), frames=frames)
        return self.to_out[0](out).reshape(x.shape) + x
