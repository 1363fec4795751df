"""3D convolutions on CPU as one 2D convolution per time tap, or as one matrix product of their patches: a drop-in
`conv_general_dilated` for `nnx.Conv`.

XLA:CPU runs 2D convolutions much faster than 3D ones, and a matrix product reads a large kernel better than either
when there are few output positions (README, Performance, has the measurements); a wide layer's kernel larger than
its input stays with XLA's conv3d, as per-tap convolutions would copy it. Other backends keep XLA's conv3d,
which is their fast path. Both are the same convolution; only the order of additions differs.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax

# Options for compiling the models' steps. XLA:CPU hands convolutions to YNNPACK by default; with that off it runs
# them with its Eigen kernels, which are faster for these layers (README, Performance, has the measurements). An
# xla_cpu_* option is read by the CPU compiler only.
STEP_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}

# Input times output channels from which XLA:CPU's conv3d keeps up with per-tap 2D convolutions (README, Performance).
WIDE_LAYER = 1024 * 1024


def time_tap_conv(
    lhs,
    rhs,
    window_strides,
    padding,
    *,
    lhs_dilation=None,
    rhs_dilation=None,
    dimension_numbers=None,
    feature_group_count=1,
    **kwargs,
):
    """lhs (N, T, H, W, C), rhs (kT, kH, kW, C, O), as nnx.Conv passes them (channels-last); time unpadded."""

    def xla_conv():
        return lax.conv_general_dilated(
            lhs,
            rhs,
            window_strides,
            padding,
            lhs_dilation=lhs_dilation,
            rhs_dilation=rhs_dilation,
            dimension_numbers=dimension_numbers,
            feature_group_count=feature_group_count,
            **kwargs,
        )

    if (
        lhs.ndim != 5
        or rhs.shape[0] == 1
        or jax.default_backend() != "cpu"
        or tuple(padding[0]) != (0, 0)
        or window_strides[0] != 1
        or feature_group_count != 1
        or any(d != 1 for d in (*(lhs_dilation or (1,)), *(rhs_dilation or (1,))))
    ):
        return xla_conv()
    per_frame = {k: v for k, v in kwargs.items() if k != "out_sharding"}  # let jit propagate the sharding
    taps = rhs.shape[0]
    n, t, h, w, c = lhs.shape
    frames = t - taps + 1
    if n * frames * math.prod(_output_size(lhs, rhs, window_strides[1:], padding[1:])) <= rhs.shape[-1]:
        return patch_matmul(lhs, rhs, window_strides[1:], padding[1:], **per_frame)
    # Each tap's slice of the kernel is a copy on XLA:CPU, and its scheduler makes them all at the top of a step. XLA's
    # 3D convolution reads the kernel in place, and for wide layers it is about as fast: there it takes the layers
    # whose kernel outweighs their input.
    if rhs.size > lhs.size and c * rhs.shape[-1] >= WIDE_LAYER:
        return xla_conv()
    out = None
    for tap in range(taps):
        window = lhs[:, tap : tap + frames].reshape(n * frames, h, w, c)  # (N*T', H, W, C)
        y = lax.conv_general_dilated(
            window, rhs[tap], window_strides[1:], padding[1:], dimension_numbers=("NHWC", "HWIO", "NHWC"), **per_frame
        )
        out = y if out is None else out + y
    return out.reshape(n, frames, *out.shape[1:])  # (N, T', H', W', O)


def _output_size(lhs, rhs, strides, padding) -> tuple[int, int]:
    """(H', W') of a convolution of lhs (N, T, H, W, C) by rhs (kT, kH, kW, C, O), strides and padding for (H, W)."""
    return tuple(
        (size + lo + hi - k) // stride + 1
        for size, (lo, hi), k, stride in zip(lhs.shape[2:4], padding, rhs.shape[1:3], strides)
    )


def patch_matmul(lhs, rhs, strides, padding, precision=None, preferred_element_type=None):
    """The convolution as one matrix product: its patches (N*T'*H'*W', kT*kH*kW*C) times the kernel (kT*kH*kW*C, O).
    For layers with fewer output positions than output channels (low resolution, many channels) reading the kernel
    once is what costs, and one product reads it once where the per-tap 2D convolutions do not. lhs (N, T, H, W, C)
    time-unpadded, rhs (kT, kH, kW, C, O), strides and padding for (H, W)."""
    kt, kh, kw, c, o = rhs.shape
    (n, t, *_), (ho, wo) = lhs.shape, _output_size(lhs, rhs, strides, padding)
    frames = t - kt + 1
    x = jnp.pad(lhs, ((0, 0), (0, 0), *padding, (0, 0)))
    patches = jnp.concatenate(
        [
            lax.slice(
                x,
                (0, a, b, d, 0),
                (n, a + frames, b + (ho - 1) * strides[0] + 1, d + (wo - 1) * strides[1] + 1, c),
                (1, 1, *strides, 1),
            )
            for a, b, d in itertools.product(range(kt), range(kh), range(kw))
        ],
        axis=-1,
    )  # (N, T', H', W', kT*kH*kW*C), in the kernel's order
    kernel = rhs.reshape(kt * kh * kw * c, o)
    return jnp.einsum(
        "nthwk,ko->nthwo", patches, kernel, precision=precision, preferred_element_type=preferred_element_type
    )
