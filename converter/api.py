"""`converter.load(path)`: a converted output directory -> a ready model.

flax     -> the Flax NNX model (channels-last), built from abstract state and filled by path, never initialised.
torchax  -> the PyTorch model (diffusers' names) with the converted weights, on CPU; pass it to
            `converter.torchax_runtime.compile_model` to run it on JAX, each step jitted.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from converter import targets
from converter.convert import DTYPES
from converter.output import read_manifest
from converter.errors import InputError
from converter.registry import FAMILIES


COMPILE_CACHE_ENV = "VAE_CONVERT_COMPILE_CACHE"


def enable_compile_cache(directory: str | Path | None = None) -> bool:
    """Turns on JAX's persistent compilation cache in `directory` (default: $VAE_CONVERT_COMPILE_CACHE), so a later
    process reaches its first decode without compiling again. Off unless asked for; returns whether it is on."""
    import os

    import jax

    directory = directory or os.environ.get(COMPILE_CACHE_ENV)
    if not directory:
        return False
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the steps are small on CPU: keep them all
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return True


def load(path: str | Path, mesh=None):
    """A converted output -> a ready model. With `mesh` (a jax.sharding.Mesh, axes "dp" and "tp"), a Flax model's
    parameters are restored straight onto it, replicated; pass the mesh to encode/decode to run them sharded."""
    path = Path(path)
    enable_compile_cache()
    manifest = read_manifest(path)
    family = FAMILIES[manifest["family"]]
    config = family.config_from_dict(json.loads((path / "config.json").read_text()))
    dtype = DTYPES[manifest["dtype"]]
    sharding = None
    if mesh is not None:
        from jax.sharding import NamedSharding

        from models.sharding import PARAMETERS

        sharding = NamedSharding(mesh, PARAMETERS)
    weights = targets.read_weights(path, manifest["target"], manifest["format"], family, config, dtype, sharding)
    for key, array in weights.items():
        if np.dtype(array.dtype) != dtype:
            raise InputError(f"{path}: {key} is {array.dtype}, the manifest says {dtype.name}")
    if manifest["target"] == "flax":
        return _flax_model(family, config, dtype, weights, path, sharding)
    return _torch_model(family, config, weights)


def _flax_model(family, config, dtype, weights: dict, path: Path, sharding=None):
    import jax
    from flax import nnx

    graphdef, abstract = targets.abstract_flax(family, config, dtype)
    flat = nnx.to_flat_state(abstract)
    expected = {p for p, _ in flat}
    if set(weights) != expected:
        missing, extra = sorted(map(str, expected - set(weights)))[:3], sorted(map(str, set(weights) - expected))[:3]
        raise InputError(f"{path}: weights do not match the model (missing {missing}, unexpected {extra})")
    for p, variable in flat:
        if tuple(weights[p].shape) != tuple(variable.get_value().shape):
            raise InputError(f"{path}: {p} has shape {weights[p].shape}, the model needs {variable.get_value().shape}")
        variable.set_value(jax.device_put(weights[p], sharding))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _torch_model(family, config, weights: dict):
    import torch

    def to_torch(array: np.ndarray) -> torch.Tensor:
        if array.dtype.name == "bfloat16":  # numpy has no bfloat16: reinterpret the bits
            return torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
        return torch.from_numpy(np.array(array))

    model = targets.meta_torch(family, config)
    model.load_state_dict({k: to_torch(v) for k, v in weights.items()}, strict=True, assign=True)
    return model.eval()
