"""The models' convolution on CPU (models/common/conv.py) takes one of its routes by shape: Winograd's F(2, 3)
along the height, per-tap 2D convolutions, one batched matrix product over the taps, for a wide layer whose kernel
outweighs its input XLA's conv3d, which makes no per-tap copies of the kernel, or, 1D with a filter per channel,
weighted slices. Each is lax's convolution, and each case below takes the route it is named for. On a mesh that
splits the width, a layer exchanges its halo once."""

import functools
import json

import jax
import numpy as np
import pytest
from jax import lax

from converter.models.common import conv
from converter.models.common.conv import cpu_conv
from tests.helpers import report_on_8_devices

pytestmark = pytest.mark.usefixtures("cpu_conv_routes")  # the routes themselves (tests/conftest.py)
SPATIAL = ((1, 1), (1, 1))  # time unpadded (the models pad it causally), space padded by one
CASES = {  # lhs (N, T, H, W, C) or (N, H, W, C), rhs (kT, kH, kW, C, O) or (kH, kW, C, O), the route taken
    "winograd": ((2, 5, 12, 9, 8), (3, 3, 3, 8, 16), "winograd_conv"),
    "winograd, height not a multiple of its tile": ((1, 5, 10, 8, 8), (3, 3, 3, 8, 16), "winograd_conv"),
    "winograd 2D": ((3, 12, 10, 8), (3, 3, 8, 16), "winograd_conv"),
    "winograd, rows of a tile past the height": ((1, 5, 2, 9, 2), (3, 3, 3, 2, 4), "winograd_conv"),
    "time taps": ((1, 5, 4, 4, 8), (3, 3, 3, 8, 32), None),
    "tap product": ((1, 4, 3, 2, 16), (3, 3, 3, 16, 32), "tap_matmul"),
    # an input padded before the convolution (replicate or reflect padding): no padding of its own
    "winograd, unpadded": ((2, 5, 12, 9, 8), (3, 3, 3, 8, 16), "winograd_conv", ((0, 0), (0, 0))),
    "winograd, unpadded, odd height": ((1, 5, 11, 10, 8), (3, 3, 3, 8, 16), "winograd_conv", ((0, 0), (0, 0))),
    "winograd 2D, unpadded": ((3, 13, 10, 8), (3, 3, 8, 16), "winograd_conv", ((0, 0), (0, 0))),
}
WIDE = ((1, 3, 40, 40, 1024), (3, 3, 3, 1024, 1024))  # more output positions than channels: not the product


def _conv(conv_fn, lhs, rhs, spatial=SPATIAL):
    layout = "NDHWC" if lhs.ndim == 5 else "NHWC"
    padding = ((0, 0), *spatial) if lhs.ndim == 5 else spatial
    return conv_fn(lhs, rhs, (1,) * (lhs.ndim - 2), padding, dimension_numbers=(layout, layout[1:-1] + "IO", layout))


def _routes_taken(monkeypatch) -> list[str]:
    """The names of the routes other than per-tap 2D convolutions that cpu_conv takes from now on, in order."""
    taken = []

    def recording(name):
        route = getattr(conv, name)

        def run(*args, **kwargs):
            taken.append(name)
            return route(*args, **kwargs)

        return run

    for name in ("winograd_conv", "tap_matmul", "depthwise_1d"):
        monkeypatch.setattr(conv, name, recording(name))
    return taken


@pytest.mark.parametrize("case", list(CASES))
def test_cpu_conv_is_lax_conv(case, monkeypatch):
    lhs_shape, rhs_shape, route, *spatial = CASES[case]
    rng = np.random.default_rng(0)
    lhs = rng.standard_normal(lhs_shape).astype(np.float32)
    rhs = rng.standard_normal(rhs_shape).astype(np.float32)
    expected = np.asarray(_conv(lax.conv_general_dilated, lhs, rhs, *spatial))
    taken = _routes_taken(monkeypatch)
    got = np.asarray(jax.jit(lambda a, b: _conv(cpu_conv, a, b, *spatial))(lhs, rhs))
    assert taken == ([route] if route else [])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 3])
def test_a_filter_per_channel_in_1d_is_lax_conv(stride, monkeypatch):
    """The vocoders' anti-aliasing filters: a 1D convolution grouped by channel, unpadded, as weighted slices."""
    rng = np.random.default_rng(0)
    lhs, rhs = rng.standard_normal((2, 23, 6)).astype(np.float32), rng.standard_normal((12, 1, 6)).astype(np.float32)
    arguments = dict(dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=6)
    expected = np.asarray(lax.conv_general_dilated(lhs, rhs, (stride,), [(0, 0)], **arguments))
    taken = _routes_taken(monkeypatch)
    got = np.asarray(jax.jit(lambda a, b: cpu_conv(a, b, (stride,), [(0, 0)], **arguments))(lhs, rhs))
    assert taken == ["depthwise_1d"] and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_winograd_only_in_float32(monkeypatch):
    lhs_shape, rhs_shape, _ = CASES["winograd"]
    lhs, rhs = jax.ShapeDtypeStruct(lhs_shape, jax.numpy.bfloat16), jax.ShapeDtypeStruct(rhs_shape, jax.numpy.bfloat16)
    taken = _routes_taken(monkeypatch)
    jax.jit(lambda a, b: _conv(cpu_conv, a, b)).lower(lhs, rhs)
    assert taken == []


def test_no_per_tap_kernel_copies_where_the_kernel_outweighs_its_input():
    lhs_shape, rhs_shape = WIDE
    lhs, rhs = jax.ShapeDtypeStruct(lhs_shape, np.float32), jax.ShapeDtypeStruct(rhs_shape, np.float32)
    compiled = jax.jit(lambda a, b: _conv(cpu_conv, a, b)).lower(lhs, rhs).compile()
    one_tap = np.prod(rhs_shape[1:]) * 4
    assert compiled.memory_analysis().temp_size_in_bytes < one_tap


def test_kernel_transforms_wait_for_their_layer_where_they_outweigh_its_input():
    """Left to XLA:CPU's scheduler, every layer's transformed kernels are made at the top of a step and all live at
    once; these layers' transforms outweigh their input, so cpu_conv has them wait for the layer's input."""
    layers, channels = 6, 64

    def chain(x, kernels):
        for kernel in kernels:
            x = jax.numpy.concatenate([x, x, x], axis=1)  # 3 frames in, 1 out
            x = _conv(cpu_conv, x, kernel)
        return x

    x = jax.ShapeDtypeStruct((1, 1, 16, 16, channels), np.float32)
    kernels = [jax.ShapeDtypeStruct((3, 3, 3, channels, channels), np.float32)] * layers
    compiled = jax.jit(chain).lower(x, kernels).compile()
    transforms = layers * len(conv._BT) * 3 * 3 * channels * channels * 4  # bytes, all layers
    assert compiled.memory_analysis().temp_size_in_bytes < transforms / 2


@pytest.mark.parametrize("first", [0.0, -0.0, 1.5, np.inf, -np.inf, np.nan])
def test_ordering_a_kernel_after_data_leaves_it_unchanged(first):
    rng = np.random.default_rng(0)
    kernel = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    kernel[0, 0, 0] = -0.0, np.inf, np.nan, 0.0
    data = rng.standard_normal((2, 3, 5)).astype(np.float32)
    data[0, 0, 0] = first
    got = np.asarray(jax.jit(conv._after)(kernel, data))
    np.testing.assert_array_equal(got.view(np.int32), kernel.view(np.int32))


MESH_SCRIPT = """
import json, sys
import jax, numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from converter.models.common.conv import cpu_conv
from tests.test_conv import _conv

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))
report = {}
for name, (lhs_shape, rhs_shape) in json.loads(sys.argv[1]).items():
    rng = np.random.default_rng(0)
    lhs, rhs = (rng.standard_normal(s).astype(np.float32) for s in (lhs_shape, rhs_shape))

    def on_mesh(a, b):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return _conv(cpu_conv, a, b)

    placed = jax.device_put(lhs, NamedSharding(mesh, P("dp", *(None,) * (lhs.ndim - 3), "tp", None)))
    step = jax.jit(on_mesh).lower(placed, rhs).compile()
    expected = np.asarray(_conv(lax.conv_general_dilated, lhs, rhs))
    report[name] = {
        "max_abs": float(np.abs(np.asarray(step(placed, rhs)) - expected).max()),
        "exchanges": step.as_text().count("collective-permute("),
    }
print(json.dumps(report))
"""
MESH_CASES = {  # on a mesh (dp 2, tp 4): batch 2, width 8
    "3D layer (Winograd)": ((2, 5, 12, 8, 8), (3, 3, 3, 8, 16)),
    "2D layer (Winograd)": ((2, 12, 8, 8), (3, 3, 8, 16)),
    "3D layer (per tap: few positions per device)": ((2, 5, 4, 8, 8), (3, 3, 3, 8, 32)),
}


def test_a_width_split_layer_exchanges_its_halo_once():
    """Each device takes one column from each neighbour once a layer (two exchanges), where XLA's partitioner would
    exchange a halo for every convolution inside the layer (a Winograd layer's 4 products: 8), and the result is the
    unsplit convolution's."""
    report = report_on_8_devices(MESH_SCRIPT, json.dumps(MESH_CASES))
    assert set(report) == set(MESH_CASES)
    for name, r in report.items():
        assert r["exchanges"] == 2, (name, r)
        assert r["max_abs"] <= 1e-4, (name, r)


def _bfloat16_layers():
    """A bfloat16 3x3 layer with a bias as each target runs it: the Flax models' Conv (XLA's convolution, or
    cpu_conv's routes), and torchax's lowering of PyTorch's convolution (channels-first)."""
    import jax.numpy as jnp
    from flax import nnx

    from converter import torchax_runtime
    from converter.models.common.layers_flax import Conv

    rng = np.random.default_rng(0)
    kernel = jnp.asarray(rng.standard_normal((3, 3, 8, 16)) / 8, jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(16), jnp.bfloat16)

    def flax_conv(**route):
        layer = Conv(8, 16, (3, 3), padding=((1, 1), (1, 1)), rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, **route)
        layer.kernel[...], layer.bias[...] = kernel, bias
        return layer

    weight = kernel.transpose(3, 2, 0, 1)  # (O, I, kH, kW)
    return {
        "flax": (flax_conv(), (1, 6, 10, 8)),
        "flax, the CPU's routes": (flax_conv(conv_general_dilated=cpu_conv), (1, 6, 10, 8)),
        "torchax": (
            lambda x: torchax_runtime._jax_convolution(x, weight, bias, (1, 1), (1, 1), (1, 1), False, (0, 0), 1),
            (1, 8, 6, 10),
        ),
    }


@pytest.mark.parametrize("target", ["flax", "flax, the CPU's routes", "torchax"])
def test_an_accelerator_convolves_bfloat16_in_bfloat16(target, monkeypatch):
    """Off the CPU a bfloat16 layer convolves in bfloat16 with its bias added there, which cuDNN accumulates and adds
    in float32 and rounds once (asked for float32 out of bfloat16, XLA's GPU compiler converts both operands and
    convolves in float32, at half the rate); on the CPU, in float32 as now. Run here, the accelerator's route
    rounds the product before its bias as well, so the results differ by a rounding or two."""
    import jax.numpy as jnp

    from converter import torchax_runtime

    torchax_runtime.torchax_env()  # torchax's operators registered, as the runtime runs them
    layer, shape = _bfloat16_layers()[target]
    x = jnp.asarray(np.random.default_rng(1).standard_normal(shape), jnp.bfloat16)

    def convolutions(*, accelerator: bool):
        with monkeypatch.context() as patch:
            if accelerator:
                patch.setattr(jax, "default_backend", lambda: "gpu")
            program = jax.make_jaxpr(lambda v: layer(v))(x)
            return [e for e in program.eqns if e.primitive.name == "conv_general_dilated"], layer(x)

    (on_cpu,), cpu_result = convolutions(accelerator=False)
    assert on_cpu.outvars[0].aval.dtype == jnp.float32
    (on_accelerator,), accelerator_result = convolutions(accelerator=True)
    assert [v.aval.dtype for v in (*on_accelerator.invars, *on_accelerator.outvars)] == [jnp.bfloat16] * 3
    assert accelerator_result.dtype == cpu_result.dtype == jnp.bfloat16
    expected = np.asarray(cpu_result, np.float32)
    assert np.abs(np.asarray(accelerator_result, np.float32) - expected).max() <= 2**-7 * np.abs(expected).max()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("target", ["flax", "torchax"])
@pytest.mark.parametrize("edge", [False, True], ids=["zeros-2d", "edge-3d"])
def test_an_upsampled_convolution_is_the_convolution_of_the_upsampled_input(edge, target, dtype, monkeypatch):
    """The upsamplers' convolution (models/common/conv.py, upsampled_conv; the torchax runtime's lowering of the
    PyTorch models' op) against the convolution of the input upsampled by 2 in height and width, nearest, as
    diffusers runs it, on a non-square input: 3x3 with a zero around and leading batch axes (a video's frames), or
    3x3x3 with the edge repeated around and time convolved as it is (HunyuanVideo's); in float32 and in bfloat16: the
    CPU's route, and an accelerator's by output phase (phase kernels summed in float32 and rounded once, the bias
    added before the output is rounded)."""
    import jax.numpy as jnp
    import torch
    from flax import nnx

    from converter import torchax_runtime
    from converter.models.common.conv import prepadded_conv
    from converter.models.common.layers_flax import Conv

    rng = np.random.default_rng(0)
    dtype = jnp.dtype(dtype)
    window = (3,) * (3 if edge else 2)
    kernel = jnp.asarray(rng.standard_normal((*window, 8, 16)) / 8, dtype)
    bias = jnp.asarray(rng.standard_normal(16), dtype)
    x = jnp.asarray(rng.standard_normal((2, 3, 5, 7, 8)), dtype)  # (B, T, H, W, C)
    around = (((0, 0),) * len(window)) if edge else ((1, 1), (1, 1))
    plain = Conv(
        8, 16, window, padding=around, rngs=nnx.Rngs(0), param_dtype=dtype, conv_general_dilated=prepadded_conv
    )
    plain.kernel[...], plain.bias[...] = kernel, bias
    upsampled = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)
    if edge:
        upsampled = jnp.pad(upsampled, ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    expected = np.asarray(plain(upsampled), np.float32)

    if target == "flax":
        layer = functools.partial(plain.upsampled, edge=edge)
    else:
        env = torchax_runtime.torchax_env()  # before torchax is imported (converter/torchax_runtime.py)
        from torchax import interop

        to_torch = torchax_runtime.kernel_order(kernel.ndim)
        with env:
            weight, bias_t = (interop.torch_view(a) for a in (kernel.transpose(np.argsort(to_torch)), bias))

        def layer(v):  # channels first, as the PyTorch models call it; a 2D layer takes the frames as its batch
            first = v.transpose(0, 4, 1, 2, 3) if edge else v.transpose(0, 1, 4, 2, 3).reshape(6, 8, 5, 7)
            with torch.no_grad(), env:
                y = torch.ops.vae_convert.upsampled_conv(interop.torch_view(first), weight, bias_t, edge).jax()
            return y.transpose(0, 2, 3, 4, 1) if edge else y.reshape(2, 3, 16, 10, 14).transpose(0, 1, 3, 4, 2)

    tolerance = (1e-5 if dtype == jnp.float32 else 2**-8) * np.abs(expected).max()
    got = layer(x)
    assert got.shape == expected.shape and got.dtype == dtype
    assert np.abs(np.asarray(got, np.float32) - expected).max() <= tolerance
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    on_accelerator = np.asarray(layer(x), np.float32)
    assert np.abs(on_accelerator - expected).max() <= (1 if dtype == jnp.float32 else 4) * tolerance
