"""The targets, one object each: what their leaves are (from abstract state, never from an initialised model), how
their weights are written and read back, how a written output becomes a ready model, and how validation drives it.

  flax     Flax NNX model, channels-last. Formats: orbax (default; the NNX state as a pure dict) or safetensors
           (flat dotted keys, channels-last layouts).
  torchax  PyTorch model with diffusers' names, meant to run on JAX through torchax. Format: safetensors, named and
           laid out like diffusers' own, so `AutoencoderKL*.from_pretrained` reads it too.

Everything target-specific is here: no other module asks which target it has (converter/output.py reads an output
back through its target).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from converter import compat, orbax_io
from converter.errors import InputError
from converter.mapping import target_path
from converter.models.common.spec import FamilySpec
from converter.orbax_io import OrbaxWriter
from converter.registry import ensure_plausible_size
from converter.safetensors_io import Dtypes, SafetensorsFile, SafetensorsWriter
from converter.structure_cache import FlaxStructure, flax_structure, leaf_specs

DTYPES = Dtypes({"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"})  # --dtype's, by numpy's names


def kept_in_float32(family: FamilySpec, key: str) -> bool:
    """Whether leaf `key` (dotted) lies under a module diffusers keeps in float32 whatever the dtype
    (`FamilySpec.keep_in_float32`, matched against the key's components as diffusers matches them)."""
    return not set(family.keep_in_float32).isdisjoint(key.split("."))


def is_count(dtype) -> bool:
    """Whether a leaf of this dtype holds a count (BatchNorm's `num_batches_tracked`): an integer, which keeps its
    own dtype whatever the output's, where every other leaf is a weight in the output's dtype."""
    return np.dtype(dtype).kind in "iu"


class Target:
    name: str
    formats: tuple[str, ...]  # the first is the default
    weight_files: dict[str, str]  # format -> file or folder in the output
    library_name: str  # the Hub's library tag for a published output
    usage: str  # the loading snippet of the model card

    def default_format(self, fmt: str | None) -> str:
        """The format to write: `fmt` if this target has it (InputError otherwise), else the default."""
        if fmt is None:
            return self.formats[0]
        if fmt not in self.formats:
            raise InputError(
                f"--format {fmt} is not available for --to {self.name} (choose from {', '.join(self.formats)})"
            )
        return fmt

    def leaf_shapes(self, family: FamilySpec, config) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def integer_leaves(self, family: FamilySpec, config) -> dict[str, np.dtype]:
        """The leaves that hold counts (BatchNorm's `num_batches_tracked`), each with its integer dtype."""
        raise NotImplementedError

    def fixed_dtype_leaves(self, family: FamilySpec, config) -> dict[str, np.dtype]:
        """The leaves whose dtype is their own whatever the output's: counts (their integer dtype) and the modules
        diffusers keeps in float32; every other leaf is written in the output's dtype."""
        kept = {k: np.dtype(np.float32) for k in self.leaf_shapes(family, config) if kept_in_float32(family, k)}
        return {**kept, **self.integer_leaves(family, config)}

    def leaf_dtype(self, key, fixed_leaves: dict, dtype: np.dtype) -> np.dtype:
        """The dtype leaf `key` (as `read_weights` names it) is written in, for an output of `dtype`."""
        return fixed_leaves.get(key if isinstance(key, str) else ".".join(map(str, key)), dtype)

    def open_writer(self, fmt: str, out_dir: Path, specs: dict, metadata: dict):
        path = out_dir / self.weight_files[fmt]
        if fmt == "orbax":
            return OrbaxWriter(path, metadata)
        return SafetensorsWriter(
            path, specs, {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
        )

    def empty_model(self, family: FamilySpec, config, dtype):
        """The model's structure without weights (no storage allocated, nothing initialised)."""
        raise NotImplementedError

    def read_weights(self, out) -> dict:
        """The weights of a written output (an `output.OutputInfo`) as saved, {leaf key: host array}; `build` places
        them."""
        raise NotImplementedError

    def build(self, empty_model, weights: dict, path: Path, sharding=None):
        """A ready model: `empty_model`'s structure filled with the weights `read_weights` gave."""
        raise NotImplementedError

    def runner(self, model, native: bool = False):
        """The model driven with channels-first numpy arrays, as validation and the tests compare it: in float32, or
        (`native`) in its weights' own dtype, as it will run."""
        raise NotImplementedError

    def cast(self, model, dtype: np.dtype):
        """`model` with its weights (not its counts) in `dtype`."""
        raise NotImplementedError

    def rounded(self, model, dtype: np.dtype, family: FamilySpec):
        """`model` with its weights (not its counts, nor the family's float32 modules) rounded to `dtype` and kept in
        their own: the reference of an export to `dtype`."""
        raise NotImplementedError


class FlaxTarget(Target):
    name = "flax"
    formats = ("orbax", "safetensors")
    weight_files = {"orbax": "state", "safetensors": "flax_model.safetensors"}
    library_name = "flax"
    usage = "vae = converter.load(path)                     # Flax NNX model, channels-last (B, T, H, W, C)"

    def empty_model(self, family: FamilySpec, config, dtype) -> FlaxStructure:
        """The Flax model with shapes and dtypes for values (nothing allocated or initialised), and its variables;
        each call a model of its own, as `build` fills it in place."""
        return flax_structure(family.name, config, np.dtype(dtype))

    def leaf_shapes(self, family, config):
        return {key: shape for key, (shape, _) in self._leaf_specs(family, config).items()}

    def integer_leaves(self, family, config):
        # JAX keeps 32-bit integers unless x64 is on: the model declares its counts int32
        return {key: dtype for key, (_, dtype) in self._leaf_specs(family, config).items() if is_count(dtype)}

    @staticmethod
    def _leaf_specs(family, config) -> dict:
        """The float32 model's leaves with their shapes and dtypes, kept by the structure cache."""

        def made(structure):
            values = ((path, compat.variable_value(v)) for path, v in structure.variables)
            return {".".join(map(str, path)): (tuple(v.shape), np.dtype(v.dtype)) for path, v in values}

        return leaf_specs(family.name, config, made)

    def read_weights(self, out):
        path = _weights_path(out.path, self.weight_files[out.fmt])
        if out.fmt == "safetensors":
            weights = SafetensorsFile(path)  # mapped: `build` makes its pages the leaves, read on first use
            return {target_path(k): weights[k] for k in weights.keys()}
        try:
            arrays = orbax_io.read_checkpoint(path)
        except InputError:
            raise
        except Exception as e:  # Orbax and TensorStore raise their own error types for a damaged or foreign layout
            raise InputError(f"{path}: not a readable Orbax checkpoint ({str(e).splitlines()[0][:160]})") from None
        # Orbax saves no array of zero size (a count of none: MiniMax-H3's register tokens can be); it holds no values,
        # so the model's shapes give it back
        fixed = self.fixed_dtype_leaves(out.family, out.config)
        for key, shape in self.leaf_shapes(out.family, out.config).items():
            if math.prod(shape) == 0:
                arrays.setdefault(key, np.zeros(shape, self.leaf_dtype(key, fixed, out.dtype)))
        return {target_path(name): array for name, array in arrays.items()}

    def build(self, empty_model: FlaxStructure, weights, path, sharding=None):
        from converter.models.common.sharding import place_all

        expected = {p for p, _ in empty_model.variables}
        if set(weights) != expected:
            missing, extra = (
                sorted(map(str, expected - set(weights)))[:3],
                sorted(map(str, set(weights) - expected))[:3],
            )
            raise InputError(f"{path}: weights do not match the model (missing {missing}, unexpected {extra})")
        for p, variable in empty_model.variables:
            if tuple(weights[p].shape) != tuple(compat.variable_value(variable).shape):
                raise InputError(
                    f"{path}: {p} has shape {weights[p].shape}, the model needs {compat.variable_value(variable).shape}"
                )
        # one call places them all; on CPU, 64-byte-aligned buffers (the mapped files, TensorStore's reads) are
        # used in place; on a mesh spanning processes each process places its own devices' copies
        arrays = place_all([weights[p] for p, _ in empty_model.variables], sharding)
        for (_, variable), array in zip(empty_model.variables, arrays):
            compat.set_variable_value(variable, array)
        return empty_model.model

    def runner(self, model, native=False):
        from converter.runners import FlaxRunner

        return FlaxRunner(model, self._weights_dtype(model) if native else None)

    @staticmethod
    def _weights_dtype(model) -> np.dtype:
        """The output's dtype: its weights' narrowest (modules kept in float32 aside)."""
        from flax import nnx

        _, state = nnx.split(model)
        dtypes = {np.dtype(compat.variable_value(v).dtype) for _, v in nnx.to_flat_state(state)}
        return min((d for d in dtypes if not is_count(d)), key=lambda d: d.itemsize)

    def cast(self, model, dtype):
        import jax.numpy as jnp
        from flax import nnx

        _, state = nnx.split(model)
        for _, variable in nnx.to_flat_state(state):
            value = compat.variable_value(variable)
            if not is_count(value.dtype):
                compat.set_variable_value(variable, jnp.asarray(value, dtype))
        return model

    def rounded(self, model, dtype, family):
        import jax.numpy as jnp
        from flax import nnx

        _, state = nnx.split(model)
        for path, variable in nnx.to_flat_state(state):
            value = compat.variable_value(variable)
            if not is_count(value.dtype) and not kept_in_float32(family, ".".join(map(str, path))):
                compat.set_variable_value(variable, jnp.asarray(value, dtype).astype(value.dtype))
        return model


class TorchaxTarget(Target):
    name = "torchax"
    formats = ("safetensors",)
    weight_files = {"safetensors": "diffusion_pytorch_model.safetensors"}
    library_name = "diffusers"
    usage = (
        "vae = converter.load(path)                     # PyTorch model with diffusers' names\n"
        "from converter.torchax_runtime import compile_model\n"
        "vae = compile_model(vae)                       # on JAX through torchax, steps jitted"
    )

    def leaf_shapes(self, family, config):
        return {k: shape for k, (shape, _) in diffusers_specs(family, config).items()}

    def integer_leaves(self, family, config):
        return {k: dtype for k, (_, dtype) in diffusers_specs(family, config).items() if is_count(dtype)}

    def empty_model(self, family, config, dtype):
        return meta_torch(family, config)

    def read_weights(self, out):
        # the model's parameters are the mapped file itself: nothing is read until used, as from_pretrained does
        weights = SafetensorsFile(_weights_path(out.path, self.weight_files[out.fmt]), copy_on_write=True)
        return {k: weights[k] for k in weights.keys()}

    def build(self, empty_model, weights, path, sharding=None):
        empty_model.load_state_dict({k: to_torch(v) for k, v in weights.items()}, strict=True, assign=True)
        return empty_model.eval()

    def runner(self, model, native=False):
        from converter.runners import TorchaxRunner

        return TorchaxRunner(model, native)

    def cast(self, model, dtype):
        import torch

        return model.to(getattr(torch, np.dtype(dtype).name))

    def rounded(self, model, dtype, family):
        import torch

        rounding = getattr(torch, np.dtype(dtype).name)
        with torch.no_grad():
            for key, tensor in model.state_dict(keep_vars=True).items():
                if tensor.is_floating_point() and not kept_in_float32(family, key):
                    tensor.copy_(tensor.to(rounding).to(tensor.dtype))
        return model


def meta_torch(family: FamilySpec, config):
    """The PyTorch model on the meta device: names and shapes, no storage."""
    import torch

    with torch.device("meta"):
        model = family.torch_model()(config)
    ensure_plausible_size(config, (p.shape for p in model.parameters()))
    return model


_DIFFUSERS_SPECS: dict[tuple, dict] = {}  # (family, config) -> diffusers' state_dict specs, for this process


def diffusers_specs(family: FamilySpec, config) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The diffusers state_dict's keys, shapes and dtypes (float32, and int64 for counts) for `config` (imports
    PyTorch). Made once per process and config: a conversion asks several times, check-mappings hundreds, and
    building the model on the meta device takes 0.1-1 s."""
    key = (family.name, config)
    if key not in _DIFFUSERS_SPECS:
        _DIFFUSERS_SPECS[key] = {
            k: (tuple(v.shape), np.dtype(str(v.dtype).removeprefix("torch.")))
            for k, v in meta_torch(family, config).state_dict().items()
        }
    return dict(_DIFFUSERS_SPECS[key])


def diffusers_shapes(family: FamilySpec, config) -> dict[str, tuple[int, ...]]:
    """The diffusers state_dict's keys and shapes for `config` (imports PyTorch)."""
    return {k: shape for k, (shape, _) in diffusers_specs(family, config).items()}


def to_torch(array: np.ndarray):
    """A numpy array (bfloat16 included) as a CPU tensor on writable memory: the array's own when it is writable
    and aligned (a copy-on-write map), else a copy."""
    import torch

    if not (array.flags.writeable and array.flags.aligned):
        array = np.array(array)
    if array.dtype.name == "bfloat16":  # numpy has no bfloat16: reinterpret the bits
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


TARGETS: dict[str, Target] = {t.name: t for t in (FlaxTarget(), TorchaxTarget())}


def _weights_path(out_dir: Path, name: str) -> Path:
    path = out_dir / name
    if not path.exists():
        raise InputError(f"{out_dir}: {name} is missing; the output is incomplete or was changed by hand")
    return path
