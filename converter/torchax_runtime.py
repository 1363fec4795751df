"""Running the project's PyTorch models on JAX through torchax.

torchax 0.0.13 (the newest) names about 20 ATen named-tensor ("Dimname") overloads that torch 2.13 removed, and
fails at import with AttributeError. Named tensors are never used by our models, so before importing torchax we
define a placeholder schema for exactly those names that this torch lacks (nothing is redefined on a torch that
still has them). torchax only uses them as dictionary keys for dtype policies and decompositions.

`compile_model(model)` returns a `TorchaxVAE`: the model's encode/decode on JAX, each chunk step one jitted function.
The runtime lowers some ops as the Flax models compute them:
- GroupNorm (`aten.native_group_norm`) as one JAX function, channels-last (models/common/group_norm.py), statistics
  in float32;
- 1D, 2D and 3D convolutions (`aten.convolution` on 3-D to 5-D inputs) channels-last through `cpu_conv`
  (models/common/conv.py): on CPU the route the Flax models take for the layer's shape (Winograd's F(2, 3), one 2D
  convolution per time tap, one batched matrix product over the window's taps, or a 1D filter per channel as its
  taps' weighted slices). The models pad and cache channels-last around them, so XLA's transposes cancel;
- the upsamplers' convolution of a nearest-upsampled input (`vae_convert::upsampled_conv`, models/common/
  layers_torch.py) as the Flax models compute it: off the CPU by output phase, never making the upsampled input;
- the vocoders' anti-aliased SnakeBeta (`vae_convert::anti_aliased_snake`, models/common/layers_torch.py) as the
  Flax models' one jitted function (models/common/resample.py), traced once a shape, not op by op at every call;
- sin (`aten.sin`, Snake's) as models/common/sine.py computes it, which XLA:CPU vectorises;
- SiLU and sums of activations (`aten.silu`, `aten.add.Tensor` on tensors of one shape) channels-last, so that what
  XLA materialises between the convolutions is laid out as they read it;
- attention with no mask (`F.scaled_dot_product_attention`) in blocks with a running softmax, as the Flax models
  compute it (models/common/attention.py), never holding the score matrix.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

REMOVED_NAMED_OVERLOADS = (
    "all.dimname",
    "all.dimname_out",
    "index_add.dimname",
    "index_copy.dimname",
    "index_copy_.dimname",
    "index_fill.Dimname_Scalar",
    "index_fill.Dimname_Tensor",
    "index_fill_.Dimname_Scalar",
    "index_fill_.Dimname_Tensor",
    "norm.names_ScalarOpt_dim",
    "norm.names_ScalarOpt_dim_dtype",
    "norm.names_dtype_out",
    "norm.names_out",
    "prod.dim_Dimname",
    "std.correction_names",
    "std.correction_names_out",
    "std.names_dim",
    "std.names_out",
    "std_mean.correction_names",
    "std_mean.names_dim",
    "unbind.Dimname",
)
_placeholders = torch.library.Library("aten", "FRAGMENT")


def missing_overloads() -> list[str]:
    missing = []
    for name in REMOVED_NAMED_OVERLOADS:
        op, overload = name.split(".")
        try:
            getattr(getattr(torch.ops.aten, op), overload)
        except AttributeError:
            missing.append(name)
    return missing


@functools.cache
def import_torchax():
    for name in missing_overloads():
        _placeholders.define(f"{name}(Tensor self) -> Tensor")
    import torchax

    return torchax


def _channels_last(ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The axes (N, C, ...) -> (N, ..., C), and back."""
    to_last = (0, *range(2, ndim), 1)
    return to_last, tuple(np.argsort(to_last))


def _jax_group_norm(x, weight, bias, n, channels, hw, groups, eps):
    """aten.native_group_norm in JAX: (output, mean, rstd), computed channels-last as the Flax models do."""
    import jax.numpy as jnp

    from converter.models.common.group_norm import group_norm

    to_last, to_first = _channels_last(x.ndim)
    out, mean, rstd = group_norm(jnp.transpose(x, to_last), groups, eps, weight, bias)
    return jnp.transpose(out, to_first), mean.astype(x.dtype), rstd.astype(x.dtype)


def _native_group_norm(x, weight, bias, n, channels, hw, groups, eps):
    from torchax import interop

    return interop.call_jax(_jax_group_norm, x, weight, bias, n, channels, hw, groups, eps)


def _channels_last_elementwise(jax_op):
    """An elementwise op (torchax's own JAX lowering) computed channels-last when its tensors are activations of
    one shape (N, C, ...): XLA:CPU lays out whatever it materialises in the logical axis order, and a SiLU's sigmoid
    or a residual sum materialised channels-first is read transposed by the channels-last convolutions around it."""

    def channels_last(*args, **kwargs):
        import jax.numpy as jnp

        arrays = [a for a in args if isinstance(a, jnp.ndarray)]
        if not arrays or any(a.ndim < 4 or a.shape != arrays[0].shape for a in arrays):
            return jax_op(*args, **kwargs)
        to_last, to_first = _channels_last(arrays[0].ndim)
        moved = [jnp.transpose(a, to_last) if isinstance(a, jnp.ndarray) else a for a in args]
        return jnp.transpose(jax_op(*moved, **kwargs), to_first)

    def lowering(*args, **kwargs):
        from torchax import interop

        return interop.call_jax(channels_last, *args, **kwargs)

    return lowering


def kernel_order(ndim: int) -> tuple[int, ...]:
    """A convolution kernel's axes, PyTorch's (O, C/groups, *window) -> (*window, C/groups, O) (a linear layer's
    (out, in) -> (in, out)): the order the lowering reads. `np.argsort` of it turns it back."""
    return (*range(2, ndim), 1, 0)


def _jax_convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """aten.convolution in JAX: a 1D, 2D or 3D convolution channels-last through `cpu_conv`, as the Flax models run
    it, anything else as torchax lowers it; either accumulating in float32 with its bias added there and rounded
    once, as PyTorch's own convolutions and the Flax models' (models/common/layers_flax.py, Conv) are: on an
    accelerator by its convolution units (models/common/conv.py, rounds_convolutions_itself)."""
    import jax.numpy as jnp
    from jax import lax
    from torchax.ops import jaten

    from converter.models.common.conv import cpu_conv, rounds_convolutions_itself
    from converter.models.common.precision import plus_bias

    if transposed or x.ndim not in (3, 4, 5):
        rest = (stride, padding, dilation, transposed, output_padding, groups)
        if rounds_convolutions_itself():
            return jaten._aten_convolution(x, weight, bias, *rest)
        wide = (None if a is None else a.astype(jnp.float32) for a in (x, weight, bias))
        return jaten._aten_convolution(*wide, *rest).astype(jnp.result_type(x, weight))
    to_last, to_first = _channels_last(x.ndim)
    layout = {3: "NWC", 4: "NHWC", 5: "NDHWC"}[x.ndim]
    y = cpu_conv(
        x.transpose(to_last),
        weight.transpose(kernel_order(weight.ndim)),
        tuple(stride),
        [(p, p) for p in padding],
        rhs_dilation=tuple(dilation),
        dimension_numbers=(layout, layout[1:-1] + "IO", layout),
        feature_group_count=groups,
        preferred_element_type=jnp.float32,
    )
    return lax.transpose(plus_bias(y, bias, jnp.result_type(x, weight)), to_first)


def _convolution(*args):
    from torchax import interop

    return interop.call_jax(_jax_convolution, *args)


def _upsampled_conv(x, weight, bias, edge):
    """The PyTorch models' upsampler convolution (models/common/layers_torch.py) as the Flax models compute it
    (models/common/conv.py, upsampled_conv), channels-last; padding the edge itself, it takes prepadded_conv's
    route, as a convolution after replicate padding does."""
    import jax.numpy as jnp
    from torchax import interop

    from converter.models.common.conv import cpu_conv, prepadded_conv, upsampled_conv

    to_last, to_first = _channels_last(x.ndim)

    def channels_last(x, weight, bias):
        dtype = jnp.result_type(x, weight)
        conv = prepadded_conv if edge else cpu_conv
        y = upsampled_conv(x.transpose(to_last), weight.transpose(kernel_order(weight.ndim)), bias, dtype, conv, edge)
        return y.transpose(to_first)

    return interop.call_jax(channels_last, x, weight, bias)


def _scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Attention with no mask (the image models' mid blocks, MiniMax-H3's decoder) as the Flax models compute it
    (models/common/attention.py: in blocks with a running softmax, or cuDNN's fused kernel): torchax's own lowering
    holds the (N, N) score matrix, 17 GB at 65,536 tokens. Anything else (a mask, dropout, a scale of its own) goes
    to torchax's."""
    from torchax import interop
    from torchax.ops import jtorch

    if attn_mask is not None or dropout_p or is_causal or scale is not None or enable_gqa:
        return jtorch._sdpa_reference(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def heads_as_batch(q, k, v):  # (B, heads, N, C)
        from converter.models.common.attention import attention

        out = attention(*(x.reshape(-1, *x.shape[2:]) for x in (q, k, v)))
        return out.reshape(*q.shape[:2], *out.shape[1:])

    return interop.call_jax(heads_as_batch, query, key, value)


def _frame_causal_attention(query, key, value, frames):
    """The PyTorch models' frame-causal attention (models/common/layers_torch.py) as the Flax models compute it: in
    blocks, the mask from frame indices."""
    from torchax import interop

    from converter.models.common.attention import attention

    return interop.call_jax(lambda q, k, v: attention(q, k, v, frames), query, key, value)


def _anti_aliased_snake(x, up_taps, down_taps, log_alpha, log_beta, ratio):
    """The PyTorch models' anti-aliased SnakeBeta (models/common/layers_torch.py) as the Flax models compute it: one
    jitted function, channels-last."""
    from torchax import interop

    from converter.models.common.resample import anti_aliased_snake

    def channels_last(x, *params):
        return anti_aliased_snake(x.transpose(0, 2, 1), *params, ratio).transpose(0, 2, 1)

    return interop.call_jax(channels_last, x, up_taps, down_taps, log_alpha, log_beta)


@functools.cache
def torchax_env():
    """torchax's environment, with this runtime's lowerings installed once."""
    env = import_torchax().default_env()
    from torchax.ops import jaten

    env.override_op_definition(torch.ops.aten.native_group_norm.default, _native_group_norm)
    env.override_op_definition(torch.ops.aten.convolution.default, _convolution)
    env.override_op_definition(torch.nn.functional.scaled_dot_product_attention, _scaled_dot_product_attention)
    from converter.models.common import layers_torch  # noqa: F401  (registers the project's own ops)

    env.override_op_definition(torch.ops.vae_convert.frame_causal_attention.default, _frame_causal_attention)
    env.override_op_definition(torch.ops.vae_convert.upsampled_conv.default, _upsampled_conv)
    env.override_op_definition(torch.ops.vae_convert.anti_aliased_snake.default, _anti_aliased_snake)
    from converter.models.common.precision import in_float32
    from converter.models.common.sine import sin

    for op, jax_op in (
        (torch.ops.aten.sin.default, sin),
        (torch.ops.aten.silu.default, in_float32(jaten._aten_silu)),
        (torch.ops.aten.add.Tensor, jaten._aten_add),
    ):
        env.override_op_definition(op, _channels_last_elementwise(jax_op))
    return env


class _ChunkStep(nn.Module):
    """One chunk step of `model` (encoder then quant_conv, or post_quant_conv then decoder) as a module, so that
    torch.func.functional_call can pass the parameters in as arguments."""

    def __init__(self, model: nn.Module, part: str, keep_cache: bool):
        super().__init__()
        self.model, self.part, self.keep_cache = model, part, keep_cache

    def forward(self, x, cache, inputs):
        return self.model.chunk_step(self.part, x, cache, inputs, self.keep_cache)


def stored_kernels(model: nn.Module) -> set[str]:
    """The parameters `TorchaxVAE` stores transposed: the convolutions' kernels and the linear layers' weights."""
    transposed = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
    return {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, transposed)}


def step_function(model: nn.Module, part: str, keep_cache: bool, kernels: set[str]):
    """One chunk step of `model` as a function of its parameters (by name, `kernels` stored transposed), its chunk,
    cache and inputs: what `TorchaxVAE` jits."""
    module = _ChunkStep(model, part, keep_cache)

    def run(params, x, cache, inputs):
        params = {
            f"model.{name}": value.permute(tuple(np.argsort(kernel_order(value.ndim)))) if name in kernels else value
            for name, value in params.items()
        }
        return torch.func.functional_call(module, params, (x, cache, inputs))

    return run


class TorchaxVAE:
    """A PyTorch VAE of this project on JAX through torchax: `encode` / `decode` as the model's, each chunk step
    one jitted function (compiled once per chunk shape) taking the parameters as arguments (not baked in as
    constants), with the causal cache flowing through it explicitly.

    The model itself is left as it is, where it is: the wrapper holds its own copy of the parameters on JAX, with
    each convolution's kernel stored ([kT,] [kH,] kW, C, O), the order XLA's convolutions and matrix
    products read. Inside a step the kernel is seen as PyTorch's (O, C, [kT,] [kH,] kW) again, and the convolution's
    lowering turns it back, so XLA sees the stored kernel itself instead of copying a transposed one on every call
    (the copy cost more than the convolutions on CPU). A linear layer's weight is stored (in, out) the same way: a
    product contracting PyTorch's (out, in) weight on its last axis runs several times slower in XLA:CPU's kernels
    (docs/performance.md, Design decisions)."""

    def __init__(self, model: nn.Module):
        self.torchax_env = torchax_env()
        self.model, self.config = model, model.config
        # the output's dtype: its weights' narrowest (modules kept in float32 aside)
        self.dtype = min({p.dtype for p in model.parameters()}, key=lambda d: d.itemsize)
        self.kernels = stored_kernels(model)
        self.params = {  # copied onto JAX as `model.to("jax")` copies (a permuted kernel is laid out anew first)
            name: self.torchax_env.t2j_copy(
                tensor.detach().permute(kernel_order(tensor.ndim)).contiguous()
                if name in self.kernels
                else tensor.detach()
            )
            for name, tensor in (*model.named_parameters(), *model.named_buffers())
        }
        self._steps = {}

    def _step(self, part: str, x, cache, inputs, keep_cache: bool):
        if (part, keep_cache) not in self._steps:
            from torchax import interop

            from converter.models.common.conv import STEP_COMPILER_OPTIONS

            run = step_function(self.model, part, keep_cache, self.kernels)
            jitted = interop.jax_jit(run, kwargs_for_jax_jit={"compiler_options": STEP_COMPILER_OPTIONS})
            self._steps[part, keep_cache] = functools.partial(jitted, self.params)
        return self._steps[part, keep_cache](x, cache, inputs)

    def encode(self, x: torch.Tensor):
        """(B, C, T, H, W) torchax tensor (see `to_jax_tensor`) -> the model's EncoderOutput."""
        with torch.no_grad(), self.torchax_env:
            return self.model.encode(x, step=self._step)

    def decode(self, z: torch.Tensor, **inputs: torch.Tensor):
        """(B, z, T, H, W) torchax tensor (see `to_jax_tensor`), and the model's extra decode inputs (torchax tensors
        by keyword) -> the model's DecoderOutput."""
        with torch.no_grad(), self.torchax_env:
            return self.model.decode(z, step=self._step, **inputs)

    def enable_tiling(self, **settings):
        self.model.enable_tiling(**settings)

    def disable_tiling(self):
        self.model.disable_tiling()


def compile_model(model: nn.Module) -> TorchaxVAE:
    """`model` (a PyTorch VAE of this project, for instance from `converter.load`) on JAX through torchax."""
    return TorchaxVAE(model)


def to_jax_tensor(vae: TorchaxVAE, array) -> torch.Tensor:
    """A numpy or JAX array as a torchax tensor, floating point in the model's dtype (integers, such as a noise seed,
    as they are), ready for `vae.encode` / `vae.decode`."""
    import jax.numpy as jnp
    from torchax import interop

    with vae.torchax_env:
        tensor = interop.torch_view(jnp.asarray(array))
        return tensor.to(vae.dtype) if tensor.is_floating_point() else tensor


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return np.asarray(tensor.jax())
