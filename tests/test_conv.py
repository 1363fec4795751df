"""The Flax models' 3D convolution on CPU (models/common/conv.py) takes one of three routes by shape: per-tap 2D
convolutions, one matrix product of the patches, or, for a wide layer whose kernel outweighs its input, XLA's conv3d,
which makes no per-tap copies of the kernel. The first two are lax's 3D convolution."""

import jax
import numpy as np
import pytest
from jax import lax

from converter.models.common.conv import time_tap_conv

SPATIAL = ((1, 1), (1, 1))  # time unpadded (the models pad it causally), space padded by one
CASES = {  # lhs (N, T, H, W, C), rhs (kT, kH, kW, C, O)
    "time taps": ((1, 5, 12, 10, 8), (3, 3, 3, 8, 16)),
    "patch product": ((1, 4, 3, 2, 16), (3, 3, 3, 16, 32)),
}
WIDE = ((1, 3, 40, 40, 1024), (3, 3, 3, 1024, 1024))  # more output positions than channels: not the product


def _conv(conv, lhs, rhs):
    return conv(lhs, rhs, (1, 1, 1), ((0, 0), *SPATIAL), dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))


@pytest.mark.parametrize("case", list(CASES))
def test_time_tap_conv_is_lax_conv3d(case):
    lhs_shape, rhs_shape = CASES[case]
    rng = np.random.default_rng(0)
    lhs = rng.standard_normal(lhs_shape).astype(np.float32)
    rhs = rng.standard_normal(rhs_shape).astype(np.float32)
    expected = np.asarray(_conv(lax.conv_general_dilated, lhs, rhs))
    got = np.asarray(jax.jit(lambda a, b: _conv(time_tap_conv, a, b))(lhs, rhs))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_no_per_tap_kernel_copies_where_the_kernel_outweighs_its_input():
    lhs_shape, rhs_shape = WIDE
    lhs, rhs = jax.ShapeDtypeStruct(lhs_shape, np.float32), jax.ShapeDtypeStruct(rhs_shape, np.float32)
    compiled = jax.jit(lambda a, b: _conv(time_tap_conv, a, b)).lower(lhs, rhs).compile()
    one_tap = np.prod(rhs_shape[1:]) * 4
    assert compiled.memory_analysis().temp_size_in_bytes < one_tap
