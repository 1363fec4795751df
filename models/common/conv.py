"""Convolutions on CPU by the fastest route for their shape: a drop-in `conv_general_dilated` for `nnx.Conv`.

3x3 float32 layers with many output positions go through Winograd's F(2, 3) along the height, 4 products for each
2 rows of output instead of 6; other 3D ones become one 2D convolution per time tap, which XLA:CPU runs much faster
than its 3D ones, or, when there are few output positions, one batched matrix product over the window's taps, which
reads a large kernel better than either (docs/performance.md, Design decisions); a wide layer's kernel larger
than its input stays with XLA's conv3d, as per-tap convolutions would copy it. A 1D convolution with a filter per
channel (the vocoders' anti-aliasing filters) is its taps' weighted slices, summed in one pass. Other backends keep
XLA's convolutions, which are their fast path. All compute the same convolution; only the order of additions
differs. On a mesh that splits the width, each layer first takes its halo columns from its neighbours, once.

With VAE_CONVERT_XLA_CONV=1 the CPU takes XLA's convolutions too, as every other backend does: they run slower and
compile in about half the time (a small CogVideoX decode: 7.7 s against 15.8 s), which is what the test suite's
many small models need (tests/conftest.py). It is read when a step is traced.
"""

from __future__ import annotations

import functools
import itertools
import math
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from .precision import plus_bias

# Options for compiling the models' steps. XLA:CPU hands convolutions to YNNPACK by default; with that off it runs
# them with its Eigen kernels, which are faster for these layers (docs/performance.md, Design decisions). An
# xla_cpu_* option is read by the CPU compiler only.
STEP_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
XLA_CONV_ENV = "VAE_CONVERT_XLA_CONV"

# Input times output channels from which XLA:CPU's conv3d keeps up with per-tap 2D convolutions (docs/performance.md,
# Design decisions).
WIDE_LAYER = 1024 * 1024
# Output positions per channel from which Winograd's transforms, the kernel's above all, cost less than the products
# they save (docs/performance.md, Design decisions).
WINOGRAD_POSITIONS_PER_CHANNEL = 2


def cpu_conv(
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
    """lhs (N, T, H, W, C) with rhs (kT, kH, kW, C, O), time unpadded, or lhs (N, H, W, C) with rhs (kH, kW, C, O),
    as nnx.Conv passes them (channels-last)."""

    def xla_conv():
        return conv_general_dilated(
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

    if jax.default_backend() != "cpu":
        return xla_conv()
    if _depthwise_1d(lhs, rhs, padding, feature_group_count, lhs_dilation, rhs_dilation):
        return depthwise_1d(lhs, rhs[:, 0], window_strides[0])
    if feature_group_count != 1 or lhs.ndim not in (4, 5):
        return xla_conv()
    plain = {k: v for k, v in kwargs.items() if k != "out_sharding"}  # let jit propagate the sharding
    mesh = _width_split_mesh(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation)
    if mesh is not None:
        return _with_width_halo(
            functools.partial(cpu_conv, window_strides=window_strides, dimension_numbers=dimension_numbers, **plain),
            lhs,
            rhs,
            padding,
            mesh,
        )
    if os.environ.get(XLA_CONV_ENV) == "1":
        return xla_conv()
    if lhs.ndim == 4:  # a 2D convolution: one frame of one time tap
        if not _winograd_fits(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation):
            return xla_conv()
        return winograd_conv(lhs[:, None], rhs[None], tuple(padding[1]), height_padding=tuple(padding[0]), **plain)[
            :, 0
        ]
    if (
        rhs.shape[:3] == (1, 1, 1)
        or tuple(padding[0]) != (0, 0)
        or window_strides[0] != 1
        or not _undilated(lhs_dilation, rhs_dilation)
    ):
        return xla_conv()
    taps = rhs.shape[0]
    n, t, h, w, c = lhs.shape
    frames = t - taps + 1
    if n * frames * math.prod(_output_size(lhs, rhs, window_strides[1:], padding[1:])) <= rhs.shape[-1]:
        return tap_matmul(lhs, rhs, window_strides[1:], padding[1:], **plain)
    # Each tap's slice of the kernel, and each transformed kernel, is a copy on XLA:CPU, and its scheduler makes them
    # all at the top of a step. XLA's 3D convolution reads the kernel in place, and for wide layers it is about as
    # fast: there it takes the layers whose kernel outweighs their input.
    if rhs.size > lhs.size and c * rhs.shape[-1] >= WIDE_LAYER:
        return xla_conv()
    if _winograd_fits(lhs, rhs, window_strides[1:], padding[1:], None, None):
        return winograd_conv(lhs, rhs, tuple(padding[2]), height_padding=tuple(padding[1]), **plain)
    out = None
    for tap in range(taps):
        window = lhs[:, tap : tap + frames].reshape(n * frames, h, w, c)  # (N*T', H, W, C)
        y = lax.conv_general_dilated(
            window, rhs[tap], window_strides[1:], padding[1:], dimension_numbers=("NHWC", "HWIO", "NHWC"), **plain
        )
        out = y if out is None else out + y
    return out.reshape(n, frames, *out.shape[1:])  # (N, T', H', W', O)


def rounds_convolutions_itself() -> bool:
    """Whether this backend's convolutions of low-precision operands accumulate in float32 and round once by
    themselves, the bias with them where XLA fuses it into cuDNN's call: an accelerator's do. Asked for float32 out
    of bfloat16, XLA's GPU compiler converts both operands and convolves in float32, at TF32's half rate and with
    every activation twice the bytes (docs/performance.md, On a GPU). XLA:CPU convolves bfloat16 in float32 either
    way, so there the models ask for float32 and round once as PyTorch's CPU convolutions do."""
    return jax.default_backend() != "cpu"


def conv_general_dilated(lhs, rhs, window_strides, padding, *, preferred_element_type=None, **kwargs):
    """lax's convolution, in its operands' dtype where the backend rounds convolutions itself (plus_bias then adds
    the bias in that dtype too)."""
    if rounds_convolutions_itself():
        preferred_element_type = None
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, preferred_element_type=preferred_element_type, **kwargs
    )


def depthwise_1d(lhs, taps, stride: int = 1):
    """lhs (N, W, C) through a filter per channel, taps (K, C), or one for all, (K,); unpadded (a correlation, as
    PyTorch's Conv1d grouped by channel), in float32: K strided slices weighted and summed, which XLA fuses into one
    pass over lhs, where XLA:CPU ran the grouped convolution 7x slower than PyTorch."""
    k = taps.shape[0]
    end = (lhs.shape[1] - k) // stride * stride + 1
    wide = lhs.astype(jnp.promote_types(lhs.dtype, jnp.float32))
    taps = taps.astype(wide.dtype)
    return sum(taps[i] * lax.slice_in_dim(wide, i, i + end, stride, axis=1) for i in range(k))


def prepadded_conv(lhs, rhs, window_strides, padding, **kwargs):
    """cpu_conv for convolutions whose input is padded before them (by replication or reflection): on a mesh, XLA's
    partitioner splits them (cpu_conv's width-halo exchange is for convolutions that zero-pad their own width)."""
    if not jax.sharding.get_abstract_mesh().empty:
        return conv_general_dilated(lhs, rhs, window_strides, padding, **kwargs)
    return cpu_conv(lhs, rhs, window_strides, padding, **kwargs)


def _depthwise_1d(lhs, rhs, padding, feature_group_count, lhs_dilation, rhs_dilation) -> bool:
    """Whether the CPU's depthwise_1d takes this convolution: 1D, a filter per channel, unpadded, undilated, and XLA's
    convolutions not asked for."""
    return (
        lhs.ndim == 3
        and feature_group_count == lhs.shape[-1] == rhs.shape[-1]
        and rhs.shape[1] == 1
        and tuple(padding[0]) == (0, 0)
        and _undilated(lhs_dilation, rhs_dilation)
        and os.environ.get(XLA_CONV_ENV) != "1"
    )


def _undilated(lhs_dilation, rhs_dilation) -> bool:
    """Whether neither the input nor the kernel is dilated (None: not at all)."""
    return all(d == 1 for d in (*(lhs_dilation or (1,)), *(rhs_dilation or (1,))))


def _width_split_mesh(lhs, rhs, strides, padding, lhs_dilation, rhs_dilation):
    """The mesh ("dp", "tp") of the step being traced where it splits lhs (N, ..., W, C) by batch and width and the
    convolution keeps the width (stride 1, padding summing to the kernel's width less one); else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if isinstance(padding, str) or mesh.empty or set(mesh.axis_names) != {"dp", "tp"} or mesh.shape["tp"] == 1:
        return None
    if any(t != AxisType.Auto for t in mesh.axis_types):  # inside the halo exchange's shard_map already
        return None
    (lo, hi), kw, w = tuple(padding[-1]), rhs.shape[-3], lhs.shape[-2]
    return (
        mesh
        if strides[-1] == 1
        and _undilated(lhs_dilation, rhs_dilation)
        and kw > 1
        and lo + hi == kw - 1
        and lhs.shape[0] % mesh.shape["dp"] == 0
        and w % mesh.shape["tp"] == 0
        and max(lo, hi) <= w // mesh.shape["tp"]
        else None
    )


def _with_width_halo(conv, lhs, rhs, padding, mesh):
    """conv(lhs, rhs, padding) on a mesh that splits lhs's batch over "dp" and its width over "tp": each device takes
    its neighbours' edge columns once, then convolves its own columns with no width padding. Left to XLA's
    partitioner, every width-padded convolution inside conv exchanges its own halo, a Winograd layer's 4 products 8
    times, each with a haloed copy of its input (docs/performance.md, Design decisions)."""
    (lo, hi), tp = tuple(padding[-1]), mesh.shape["tp"]
    spec = P("dp", *(None,) * (lhs.ndim - 3), "tp", None)

    def local(x, k):  # x (N/dp, ..., W/tp, C)
        w = x.shape[-2]
        parts = [x]
        if lo:  # the left neighbour's last columns; the first device gets zeros, the padding
            parts.insert(0, lax.ppermute(x[..., w - lo :, :], "tp", [(i, i + 1) for i in range(tp - 1)]))
        if hi:
            parts.append(lax.ppermute(x[..., :hi, :], "tp", [(i + 1, i) for i in range(tp - 1)]))
        return conv(jnp.concatenate(parts, axis=-2), k, padding=(*padding[:-1], (0, 0)))

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, P()), out_specs=spec)(lhs, rhs)


def _output_size(lhs, rhs, strides, padding) -> tuple[int, int]:
    """(H', W') of a convolution of lhs (N, T, H, W, C) by rhs (kT, kH, kW, C, O), strides and padding for (H, W)."""
    return tuple(
        (size + lo + hi - k) // stride + 1
        for size, (lo, hi), k, stride in zip(lhs.shape[2:4], padding, rhs.shape[1:3], strides)
    )


def tap_matmul(lhs, rhs, strides, padding, precision=None, preferred_element_type=None):
    """The convolution as matrix products, one per tap of its window: the input under that tap (N*T'*H'*W', C) times
    the tap's slice of the kernel (C, O), all taps in one batched product, then summed. For layers with fewer output
    positions than output channels (low resolution, many channels) reading the kernel is what costs: this reads it
    once, where per-tap 2D convolutions do not, and XLA:CPU packs each tap's slice for its product faster than the
    whole kernel as one (kT*kH*kW*C, O) matrix. lhs (N, T, H, W, C) time-unpadded, rhs (kT, kH, kW, C, O), strides
    and padding for (H, W)."""
    kt, kh, kw, c, o = rhs.shape
    (n, t, *_), (ho, wo) = lhs.shape, _output_size(lhs, rhs, strides, padding)
    frames = t - kt + 1
    x = jnp.pad(lhs, ((0, 0), (0, 0), *padding, (0, 0)))
    windows = jnp.stack(
        [
            lax.slice(
                x,
                (0, a, b, d, 0),
                (n, a + frames, b + (ho - 1) * strides[0] + 1, d + (wo - 1) * strides[1] + 1, c),
                (1, 1, *strides, 1),
            ).reshape(n * frames * ho * wo, c)
            for a, b, d in itertools.product(range(kt), range(kh), range(kw))
        ]
    )  # (kT*kH*kW, N*T'*H'*W', C), in the kernel's order
    products = lax.dot_general(
        windows,
        rhs.reshape(kt * kh * kw, c, o),
        (((2,), (1,)), ((0,), (0,))),
        precision=precision,
        preferred_element_type=preferred_element_type,
    )  # (kT*kH*kW, N*T'*H'*W', O)
    return products.sum(0).reshape(n, frames, ho, wo, o)


# Winograd's F(2, 3) (Lavin and Gray, 2015), along the height: B^T takes a tile's 4 rows of input to the transformed
# domain, G the kernel's 3 rows, A^T the 4 products back to the tile's 2 rows of output. Each product is one 2D
# convolution over (time, width), so a layer is 4 of them at half the height each: 2 output-heights of convolution
# instead of 3, with no copies of frames per time tap. F(4, 3) saves more products but has XLA compile half as much
# again per step (docs/performance.md, Design decisions).
_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
_G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))
_AT = ((1, 1, 1, 0), (0, 1, -1, -1))
_TILE = len(_AT)  # output rows per tile


def _winograd_fits(lhs, rhs, strides, padding, lhs_dilation, rhs_dilation) -> bool:
    """Whether the convolution of lhs (N, T, H, W, C) by rhs (kT, kH, kW, C, O), or of lhs (N, H, W, C) by rhs
    (kH, kW, C, O), with the spatial strides, padding and dilations given, goes through `winograd_conv`: a 3x3
    window at stride 1 with a row of zero padding above and below or none (an input padded before, by replication or
    reflection), float32 (its transforms round more than a direct sum,
    in float32 far below the parity tolerance), and enough output positions for the transforms, the kernel's above
    all, to cost less than the products they save."""
    n, t, h, w, c = lhs.shape if lhs.ndim == 5 else (lhs.shape[0], 1, *lhs.shape[1:])
    kt, kh, kw, _, o = rhs.shape if rhs.ndim == 5 else (1, *rhs.shape)
    positions = n * (t - kt + 1) * h * w
    return (
        (kh, kw) == (3, 3)
        and tuple(strides) == (1, 1)
        and tuple(padding[0]) in ((1, 1), (0, 0))
        and h + sum(padding[0]) > 2
        and _undilated(lhs_dilation, rhs_dilation)
        and lhs.dtype == rhs.dtype == jnp.float32
        and positions >= WINOGRAD_POSITIONS_PER_CHANNEL * max(c, o)
    )


def _combine(coefficients, terms):
    """The sum of coefficients[i] * terms[i] over the nonzero coefficients, in lax's operations: a coefficient of 1
    or -1 adds or subtracts its term (the same sum, bit for bit, with fewer operations for JAX to trace)."""
    total = None
    for a, x in zip(coefficients, terms):
        if a:
            x = x if abs(a) == 1 else lax.mul(x, abs(a))
            total = (x if a > 0 else lax.neg(x)) if total is None else (lax.add if a > 0 else lax.sub)(total, x)
    return total


def _after(kernel, data):
    """The float32 kernel, bit for bit, made once `data` is: a layer's kernel transforms then wait for the layer.
    Left free, XLA:CPU's scheduler makes every layer's at the top of a step, all alive at once (docs/performance.md,
    Design decisions).
    The dependency: the kernel's bits or'ed with those of data's first element shifted right past their width, which
    XLA defines as 0 whatever the value, and does not fold away."""
    zero = lax.shift_right_logical(lax.bitcast_convert_type(data[(0,) * data.ndim], jnp.int32), jnp.int32(32))
    return lax.bitcast_convert_type(lax.bitcast_convert_type(kernel, jnp.int32) | zero, kernel.dtype)


def winograd_conv(lhs, rhs, width_padding=(1, 1), precision=None, preferred_element_type=None, height_padding=(1, 1)):
    """The convolution of lhs (N, T, H, W, C), time unpadded, by rhs (kT, 3, 3, C, O), at stride 1 with
    `height_padding` rows of zeros above and below (one each, or none) and `width_padding` columns left and right,
    through Winograd's F(2, 3) along the height. Tile rows go to the batch, so each of the 4 products is a 2D
    convolution over (time, width) by a (kT, 3) window of the transformed kernel: the time taps are its rows."""
    kt, _, _, c, o = rhs.shape
    n, t, h, w, _ = lhs.shape
    top = height_padding[0]
    out_h = h + sum(height_padding) - 2
    frames, tiles = t - kt + 1, -(-out_h // _TILE)
    kernels_outweigh_input = len(_BT) * kt * 3 * c * o > lhs.size  # the transformed kernels, all 4

    def tile_row(r):  # (N, tiles, T, W, C): row r of every tile, input row 2i + r - top, zero outside [0, H)
        first = 1 if r < top else 0  # the top padding row is tile 0's row 0
        count = min(tiles, (h - 1 - r + top) // _TILE + 1) - first
        if count <= 0:
            return jnp.zeros((n, tiles, t, w, c), lhs.dtype)
        start = _TILE * first + r - top
        rows = lax.slice_in_dim(lhs, start, start + _TILE * (count - 1) + 1, _TILE, axis=2)
        rows = jnp.pad(rows, ((0, 0), (0, 0), (first, tiles - first - count), (0, 0), (0, 0)))  # fused with its reader
        return rows.transpose(0, 2, 1, 3, 4)

    # each traced once, for the 4 products
    tile_rows = [tile_row(r) for r in range(len(_BT))]
    kernel_rows = [lax.index_in_dim(rhs, i, axis=1, keepdims=False) for i in range(3)]  # (kT, 3, C, O) each

    def product(p):  # (N, tiles, T', W, O)
        v = _combine(_BT[p], tile_rows).reshape(n * tiles, t, w, c)
        u = _combine(_G[p], kernel_rows)  # (kT, 3, C, O): a (time, width) window
        if kernels_outweigh_input:
            u = _after(u, v)
        m = lax.conv_general_dilated(
            v,
            u,
            (1, 1),
            ((0, 0), width_padding),
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=precision,
            preferred_element_type=preferred_element_type,
        )
        return m.reshape(n, tiles, frames, m.shape[2], o)

    products = [product(p) for p in range(len(_BT))]
    out = jnp.stack([_combine(_AT[e], products) for e in range(_TILE)], axis=2)  # (N, tiles, 2, T', W', O)
    out = out.transpose(0, 3, 1, 2, 4, 5).reshape(n, frames, tiles * _TILE, out.shape[-2], o)
    return out[:, :, :out_h]


# An upsampler's output pixel (2i + a, 2j + b) reads input rows i - 1 + a and i + a (and columns likewise): phase a
# of the 3x3 kernel is 2 rows, each the sum of the kernel's rows that fall on one input row.
_PHASE_ROWS = (((0,), (1, 2)), ((0, 1), (2,)))


def upsampled_conv(x, kernel, bias, dtype, conv=cpu_conv, edge=False):
    """The 3x3 convolution (stride 1) by kernel (*K, 3, 3, C, O), plus bias (O,) or None, of x (..., *D, H, W, C)
    upsampled by 2 (nearest) in height and width and padded by one row and column around (zeros, or with `edge` its
    edge repeated), as diffusers' upsamplers compute it, rounded once to `dtype`. Leading window axes K (a video's
    time) convolve D as they are, padded by the caller. On a CPU as written, through `conv`: Winograd's F(2, 3) there
    takes 24 products per input pixel, and a whole decode by phases was no faster (docs/performance.md, Design
    decisions). Elsewhere by output phase, never making the upsampled input: one 2x2 convolution of x, padded by one
    around, with 4 x O outputs, a phase's each (its kernel sums, in float32, the taps that read one input pixel, then
    rounds once to the convolution's dtype), interleaved: 16 products per input pixel where the upsampled input takes
    36. An edge row of the upsampled input repeats an input row, so the edge padding is x's own."""
    lead = kernel.ndim - 4
    batch, (h, w, c) = x.shape[: -lead - 3], x.shape[-3:]
    o = kernel.shape[-1]
    x = x.reshape(-1, *x.shape[-lead - 3 :])
    compute = jnp.result_type(x, kernel)
    around = ((1, 1), (1, 1), (0, 0))
    pad = ((0, 0),) * (lead + 1) + around  # an edge's, here; zeros, by the convolution
    layout = ("NHWC", "NDHWC")[lead]
    along = functools.partial(
        conv,
        window_strides=(1,) * (lead + 2),
        padding=((0, 0),) * (lead + 2) if edge else ((0, 0),) * lead + around[:2],
        dimension_numbers=(layout, layout[1:-1] + "IO", layout),
        preferred_element_type=jnp.float32,
    )
    if not rounds_convolutions_itself():
        upsampled = jnp.repeat(jnp.repeat(x, 2, axis=-3), 2, axis=-2)
        if edge:
            upsampled = jnp.pad(upsampled, pad, mode="edge")
        y = plus_bias(along(upsampled.astype(compute), kernel.astype(compute)), bias, dtype)
        return y.reshape(*batch, *y.shape[1:])
    if edge:
        x = jnp.pad(x, pad, mode="edge")

    def summed(k, axis, phase):  # k's 3 taps along `axis` -> phase's 2
        return jnp.stack([sum(jnp.take(k, t, axis=axis) for t in taps) for taps in _PHASE_ROWS[phase]], axis=axis)

    wide = kernel.astype(jnp.float32)
    phases = [summed(summed(wide, lead, a), lead + 1, b) for a in range(2) for b in range(2)]
    phases = jnp.stack(phases, axis=-2).reshape(*kernel.shape[:lead], 2, 2, c, 4 * o)  # (*K, 2, 2, C, 4 O)
    y = along(x.astype(compute), phases.astype(compute))  # (N, *D', H + 1, W + 1, 4 O)
    y = plus_bias(y, None if bias is None else jnp.tile(bias, 4), dtype).reshape(*y.shape[:-1], 2, 2, o)
    # phase (a, b) of output pixel (i, j) is the window at (i + a, j + b)
    rows = [jnp.stack([y[..., a : a + h, b : b + w, a, b, :] for b in range(2)], axis=-2) for a in range(2)]
    y = jnp.stack(rows, axis=-4)  # (N, *D', H, a, W, b, O)
    return y.reshape(*batch, *y.shape[1:-5], 2 * h, 2 * w, o)
