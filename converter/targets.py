"""The two targets: what their leaves are (from abstract state, never from an initialised model), how their weights
are written, and how a written output becomes a ready model again.

  flax     Flax NNX model, channels-last. Formats: orbax (default; the NNX state as a pure dict) or safetensors
           (flat dotted keys, channels-last layouts).
  torchax  PyTorch model with diffusers' names, meant to run on JAX through torchax. Format: safetensors, named and
           laid out like diffusers' own, so `AutoencoderKL*.from_pretrained` reads it too.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from converter.errors import InputError
from converter.mapping import nested, target_path
from converter.registry import Family
from converter.safetensors_io import SafetensorsFile, SafetensorsWriter, nbytes

# Orbax holds about three copies of what it is saving: groups of 1/8 of the checkpoint keep the peak near 0.4x of
# it above the baseline (measured), and groups of at least 32 MB keep small checkpoints to one or two saves.
ORBAX_GROUPS = 8
ORBAX_MIN_GROUP_BYTES = 32 * 2**20
ORBAX_ITEM = "state"  # the name partial saves give the one PyTree in the checkpoint
FORMATS = {"flax": ("orbax", "safetensors"), "torchax": ("safetensors",)}
WEIGHT_FILES = {("flax", "orbax"): "state", ("flax", "safetensors"): "flax_model.safetensors",
                ("torchax", "safetensors"): "diffusion_pytorch_model.safetensors"}


def abstract_flax(family: Family, config, dtype):
    """(graphdef, abstract state) of the Flax model: shapes and dtypes only, nothing allocated."""
    import jax.numpy as jnp
    from flax import nnx

    cls = family.load("flax_cls")
    abstract = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), param_dtype=jnp.dtype(dtype)))
    return nnx.split(abstract)


def meta_torch(family: Family, config):
    """The PyTorch model on the meta device: names and shapes, no storage."""
    import torch

    with torch.device("meta"):
        return family.load("torch_cls")(config)


def target_shapes(family: Family, config, target: str) -> dict[str, tuple[int, ...]]:
    if target == "flax":
        from flax import nnx

        _, state = abstract_flax(family, config, np.float32)
        return {".".join(map(str, path)): tuple(v.get_value().shape) for path, v in nnx.to_flat_state(state)}
    return {k: tuple(v.shape) for k, v in meta_torch(family, config).state_dict().items()}


class OrbaxWriter:
    """Writes the NNX state's pure dict as one Orbax checkpoint, a group of leaves at a time (Orbax's partial save,
    finalized on close): at most a group of converted leaves is held at once, so memory stays well below the
    checkpoint's size. The checkpoint at `path` holds one PyTree, named ORBAX_ITEM."""

    def __init__(self, path: Path, metadata: dict, total_bytes: int):
        self.path, self.metadata = path, metadata
        self.group_limit = max(ORBAX_MIN_GROUP_BYTES, total_bytes // ORBAX_GROUPS)
        self.group, self.group_bytes = {}, 0

    def write(self, key: str, array: np.ndarray):
        self.group[key] = np.array(array, copy=True)  # our own copy: the source's pages are released after this call
        self.group_bytes += array.nbytes
        if self.group_bytes >= self.group_limit:
            self._save_group()

    def _save_group(self):
        from orbax.checkpoint.experimental.v1 import partial

        if self.group:
            partial.save(self.path, nested(self.group), custom_metadata=self.metadata)
        self.group, self.group_bytes = {}, 0

    def close(self):
        from orbax.checkpoint.experimental.v1 import partial

        self._save_group()
        partial.finalize(self.path)


def open_writer(target: str, fmt: str, out_dir: Path, specs: dict, metadata: dict):
    path = out_dir / WEIGHT_FILES[(target, fmt)]
    if fmt == "orbax":
        return OrbaxWriter(path, metadata, sum(nbytes(shape, dtype) for shape, dtype in specs.values()))
    return SafetensorsWriter(path, specs, {k: json.dumps(v) if not isinstance(v, str) else v
                                           for k, v in metadata.items()})


def read_weights(out_dir: Path, target: str, fmt: str, family: Family, config, dtype, sharding=None) -> dict:
    """Weights of a written output as {target path: array}; Orbax restores into the abstract state's layout, placing
    each array with `sharding` (a jax.sharding.Sharding) directly when one is given."""
    path = out_dir / WEIGHT_FILES[(target, fmt)]
    if fmt == "safetensors":
        weights = SafetensorsFile(path)
        return {target_path(k) if target == "flax" else k: weights[k] for k in weights.keys()}
    import jax
    import orbax.checkpoint.experimental.v1 as ocp
    from flax import nnx

    _, abstract = abstract_flax(family, config, dtype)
    # The sharding goes into each abstract leaf (Orbax places each array with it); by default the first device.
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
    template = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                            nnx.to_pure_dict(abstract))
    saved = ocp.metadata(path, checkpointable_name=ORBAX_ITEM).metadata
    saved_dtypes = {p: m.dtype for p, m in jax.tree_util.tree_leaves_with_path(saved)}
    for p, leaf in jax.tree_util.tree_leaves_with_path(template):
        # Orbax would cast silently to the template's dtype; a mismatch means a wrong manifest or checkpoint.
        if p in saved_dtypes and np.dtype(saved_dtypes[p]) != np.dtype(leaf.dtype):
            raise InputError(f"{path}: leaf {jax.tree_util.keystr(p)} is {saved_dtypes[p]}, expected {leaf.dtype}")
    restored = ocp.load(path, template, checkpointable_name=ORBAX_ITEM)
    return {tuple(getattr(k, "key", getattr(k, "idx", None)) for k in p): leaf
            for p, leaf in jax.tree_util.tree_leaves_with_path(restored)}
