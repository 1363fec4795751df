"""Running the project's PyTorch models on JAX through torchax.

torchax 0.0.13 (the newest) names about 20 ATen named-tensor ("Dimname") overloads that torch 2.13 removed, and
fails at import with AttributeError. Named tensors are never used by our models, so before importing torchax we
define a placeholder schema for exactly those names that this torch lacks (nothing is redefined on a torch that
still has them). torchax only uses them as dictionary keys for dtype policies and decompositions.
"""
from __future__ import annotations

import functools

import torch

REMOVED_NAMED_OVERLOADS = (
    "all.dimname", "all.dimname_out", "index_add.dimname", "index_copy.dimname", "index_copy_.dimname",
    "index_fill.Dimname_Scalar", "index_fill.Dimname_Tensor", "index_fill_.Dimname_Scalar",
    "index_fill_.Dimname_Tensor", "norm.names_ScalarOpt_dim", "norm.names_ScalarOpt_dim_dtype",
    "norm.names_dtype_out", "norm.names_out", "prod.dim_Dimname", "std.correction_names",
    "std.correction_names_out", "std.names_dim", "std.names_out", "std_mean.correction_names",
    "std_mean.names_dim", "unbind.Dimname",
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


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    """Moves `model` onto JAX and makes its `run_step` a jitted step: one compile per chunk shape.

    Parameters are passed to the compiled function as arguments (not baked in as constants), and the cache
    pytree flows through it explicitly.
    """
    torchax = import_torchax()
    from torchax import interop

    env = torchax.default_env()
    with env:
        model.to("jax")
    jitted = {}

    def run_step(block, x, cache):
        if id(block) not in jitted:
            params = dict(block.named_parameters())

            def step(params, x, cache):
                return torch.func.functional_call(block, params, (x, cache))

            jitted[id(block)] = functools.partial(interop.jax_jit(step), params)
        with env:
            return jitted[id(block)](x, cache)

    model.run_step = run_step
    model.torchax_env = env
    return model


def to_jax_tensor(model: torch.nn.Module, array) -> torch.Tensor:
    """A numpy array as a torchax tensor, on the device of a compiled model."""
    with model.torchax_env:
        return torch.from_numpy(array).to("jax")


def to_numpy(tensor: torch.Tensor):
    import numpy as np

    return np.asarray(tensor.jax())
