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
from converter.safetensors_io import SafetensorsFile, SafetensorsWriter

SAVE_CONCURRENT_GB = 0.0625
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
    """Collects the converted leaves, then saves them as the NNX state's pure dict in one Orbax checkpoint."""

    def __init__(self, path: Path, metadata: dict):
        self.path, self.metadata, self.leaves = path, metadata, {}

    def write(self, key: str, array: np.ndarray):
        import jax

        # A JAX buffer of our own now (the source's pages are released after this call).
        self.leaves[key] = jax.device_put(np.array(array, copy=True))

    def close(self):
        import orbax.checkpoint as ocp

        tree = nested(self.leaves)
        # Synchronous, with at most SAVE_CONCURRENT_GB of host copies in flight: Orbax copies arrays to host before
        # writing, and without the bound it copies them all at once (2x the checkpoint in memory).
        handler = ocp.StandardCheckpointHandler(save_concurrent_gb=SAVE_CONCURRENT_GB)
        with ocp.Checkpointer(handler) as checkpointer:
            checkpointer.save(self.path, args=ocp.args.StandardSave(tree), custom_metadata=self.metadata)


def open_writer(target: str, fmt: str, out_dir: Path, specs: dict, metadata: dict):
    path = out_dir / WEIGHT_FILES[(target, fmt)]
    if fmt == "orbax":
        return OrbaxWriter(path, metadata)
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
    import orbax.checkpoint as ocp
    from flax import nnx

    _, abstract = abstract_flax(family, config, dtype)
    # The sharding goes into each abstract leaf: without it Orbax would fall back to the saved one.
    template = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                            nnx.to_pure_dict(abstract))
    with ocp.StandardCheckpointer() as checkpointer:
        saved = checkpointer.metadata(path).item_metadata
        saved_dtypes = {p: m.dtype for p, m in jax.tree_util.tree_leaves_with_path(saved)}
        for p, leaf in jax.tree_util.tree_leaves_with_path(template):
            # Orbax would cast silently to the template's dtype; a mismatch means a wrong manifest or checkpoint.
            if p in saved_dtypes and np.dtype(saved_dtypes[p]) != np.dtype(leaf.dtype):
                raise InputError(f"{path}: leaf {jax.tree_util.keystr(p)} is {saved_dtypes[p]}, expected {leaf.dtype}")
        restored = checkpointer.restore(path, template)
    return {tuple(getattr(k, "key", getattr(k, "idx", None)) for k in p): leaf
            for p, leaf in jax.tree_util.tree_leaves_with_path(restored)}
