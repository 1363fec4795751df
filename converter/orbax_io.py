"""Orbax checkpoints as the Flax target writes and reads them: a writer that writes Orbax's layout a leaf at a time,
and readers that map each leaf's bytes (our layout) or read Orbax's default layout into aligned buffers."""

from __future__ import annotations

import json
import math
import mmap
import os
import time
from pathlib import Path

import numpy as np

from converter import untrusted
from converter.errors import InputError
from converter.safetensors_io import Dtypes, nbytes

ORBAX_ITEM = "state"  # the name Orbax gives the one PyTree in the checkpoint
# How Orbax lays the checkpoint out: each leaf a zarr (v2) array in a folder of its own, its bytes uncompressed in one
# file, which a load maps (OCDBT, Orbax's default, packs them into shared files at offsets JAX would copy from; zstd
# gains little on trained float weights and slows every load).
ORBAX_SAVING = {"use_ocdbt": False, "use_zarr3": False, "use_compression": False}
# the handler Orbax's v1 API names for a PyTree it saves whole (`ocp.save_pytree`), which its loads look up
ORBAX_ITEM_HANDLER = "orbax.checkpoint.experimental.v1._src.handlers.pytree_handler.PyTreeHandler"


def read_checkpoint(path: Path) -> dict[str, np.ndarray]:
    """{dotted name: array} of the checkpoint at `path`, in our layout or Orbax's default one."""
    return zarr_leaves(path / ORBAX_ITEM) or read_ocdbt_leaves(path)


def zarr_leaves(item_dir: Path) -> dict[str, np.ndarray]:
    """{dotted name: array} of a checkpoint in OrbaxWriter's layout (ORBAX_SAVING; the pinned Orbax names each leaf's
    folder by its dotted path, list positions as numbers), each leaf's data file mapped as the array, or read when it
    is small (`_zarr_leaf`). Empty for other layouts."""
    leaves = {}
    if not item_dir.is_dir():
        return leaves
    # os's calls on plain strings: Python's file objects and pathlib cost more than the reads and maps themselves
    for entry in os.scandir(item_dir):
        try:
            meta = untrusted.loads_json(_read_small(os.path.join(entry.path, ".zarray")), entry.name, ValueError)
        except (FileNotFoundError, NotADirectoryError):  # not a leaf's folder
            continue
        leaves[entry.name] = _zarr_leaf(entry.path, meta)
    return leaves


def _read_small(path: str) -> bytes:
    fd = untrusted.os_open_regular(path)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


_ZARR_DTYPES = Dtypes({"<f4": "float32", "<f2": "float16", "bfloat16": "bfloat16", "<i4": "int32"})  # i4: counts
_ZARR_NAMES = {dtype: name for name, dtype in _ZARR_DTYPES.names.items()}  # a dtype's name -> zarr's

# Data files from this size on are mapped, page-aligned, so JAX on CPU takes them as they are and their pages are read
# on first use, as from_pretrained does; smaller ones (biases, norms: most of a model's leaves) are read, since a
# mapping costs more system calls and page-table work than reading a few pages, and JAX copies them in no time.
MAPPED_FROM_BYTES = 1 << 16


def _zarr_leaf(folder: str, meta: dict) -> np.ndarray:
    """One leaf's data file as the array its .zarray (`meta`) describes: one uncompressed chunk in C order holding
    the whole array, as Orbax writes it with ORBAX_SAVING. A missing or cut data file is damage (Orbax writes every
    chunk, zeros too), not zarr's fill value."""
    name = os.path.basename(folder)
    untrusted.check(meta, {"shape": [untrusted.Size], "dtype": str, "dimension_separator": str}, name, ValueError)
    shape, dtype = tuple(meta.get("shape", ())), _ZARR_DTYPES.get(meta.get("dtype"))
    plain = {"chunks": list(shape), "compressor": None, "filters": None, "order": "C", "zarr_format": 2}
    if dtype is None or any(d < 0 for d in shape) or any(meta.get(k) != v for k, v in plain.items()):
        raise ValueError(f"{name}: not laid out as vae-convert writes it ({os.path.join(folder, '.zarray')})")
    size = nbytes(shape, dtype)
    chunk = os.path.join(folder, meta.get("dimension_separator", ".").join(["0"] * max(len(shape), 1)))  # "0": 0-d
    try:
        fd = untrusted.os_open_regular(chunk)
        try:  # read, a byte more than the array so that a longer file shows as one, or mapped
            data = os.read(fd, size + 1) if size < MAPPED_FROM_BYTES else mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
    except (OSError, ValueError):  # mmap raises ValueError for an empty file
        raise ValueError(f"{name}: its data file is missing or empty") from None
    if len(data) != size:
        raise ValueError(f"{name}: its data file holds {len(data)} bytes, the array {size}")
    return np.frombuffer(data, dtype, math.prod(shape)).reshape(shape)


def read_ocdbt_leaves(path: Path) -> dict[str, np.ndarray]:
    """{dotted name: array} of an OCDBT checkpoint of zarr3 arrays (Orbax's default layout, which earlier versions
    wrote), found through Orbax's metadata and read by TensorStore straight into 64-byte-aligned buffers, which JAX
    on CPU then uses without a copy (Orbax's own reader fills buffers of its own and copies each into JAX's: twice
    the memory traffic)."""
    import jax
    import orbax.checkpoint.experimental.v1 as ocp
    import tensorstore as ts

    saved = ocp.metadata(path, checkpointable_name=ORBAX_ITEM).metadata
    # Orbax names each leaf by its dotted path, list positions as text
    leaves = {
        ".".join(str(getattr(k, "key", getattr(k, "idx", None))) for k in p): (tuple(leaf.shape), leaf.dtype)
        for p, leaf in jax.tree_util.tree_leaves_with_path(saved)
    }
    if not leaves:  # Orbax logs what it could not find and returns no tree
        raise InputError(f"{path}: not a readable Orbax checkpoint (no arrays found in it)")
    item_dir = path / ORBAX_ITEM
    context, store = ts.Context(), {"driver": "ocdbt", "base": {"driver": "file", "path": f"{item_dir.resolve()}/"}}
    opening = {
        name: ts.open({"driver": "zarr3", "kvstore": {**store, "path": f"{name}/"}}, context=context, read=True)
        for name in leaves
    }
    arrays, reads = {}, []
    for name, (shape, dtype) in leaves.items():
        array = opening[name].result()
        if array.shape != shape or array.dtype.numpy_dtype != dtype:
            raise InputError(
                f"{item_dir}: {name} is stored as {array.dtype.numpy_dtype} {array.shape}, its metadata says "
                f"{dtype} {shape}"
            )
        arrays[name] = _aligned_empty(shape, dtype)
        reads.append(ts.array(arrays[name], copy=False, write=True).write(array))
    for read in reads:
        read.result()
    return arrays


def _aligned_empty(shape: tuple[int, ...], dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialised array whose data starts at a multiple of `alignment` bytes, as XLA:CPU needs to use a host
    buffer in place (NumPy's large arrays start 16 bytes into a page)."""
    size = math.prod(shape) * np.dtype(dtype).itemsize
    raw = np.empty(size + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + size].view(dtype).reshape(shape)


class OrbaxWriter:
    """Writes the NNX state's pure dict as one Orbax checkpoint, each leaf as it comes, in the layout Orbax writes
    with ORBAX_SAVING: a folder per leaf named by its dotted path, holding the zarr (v2) array's `.zarray` and its
    bytes as one uncompressed chunk; the tree's `_METADATA` beside them, the item's name ORBAX_ITEM; the checkpoint's
    `_CHECKPOINT_METADATA` (its custom metadata, `metadata`), marker and commit note above. No leaf is held after
    its write. Orbax itself is not asked: its import costs about a second and each of its saves a fixed 0.15 s or
    so, more than writing the bytes (test_orbax_io holds the layout to Orbax's own save; Orbax reads it, the floor
    release too: test_model_api)."""

    def __init__(self, path: Path, metadata: dict):
        self.path, self.metadata = path, metadata
        self.item = path / ORBAX_ITEM
        self.item.mkdir(parents=True)
        self.keys: list[str] = []
        self.started = time.time_ns()

    def write(self, key: str, array: np.ndarray):
        if array.size == 0:  # Orbax saves none (the Flax target's read gives it back from the model's shapes)
            return
        folder = self.item / key
        folder.mkdir()
        meta = {
            "chunks": list(array.shape), "compressor": None, "dimension_separator": ".",
            "dtype": _ZARR_NAMES[array.dtype.name], "fill_value": None, "filters": None, "order": "C",
            "shape": list(array.shape), "zarr_format": 2,
        }  # fmt: skip
        (folder / ".zarray").write_text(json.dumps(meta, sort_keys=True, separators=(",", ":")))
        with open(folder / (".".join(["0"] * array.ndim) or "0"), "wb") as chunk:
            np.ascontiguousarray(array).tofile(chunk)
        self.keys.append(key)

    def close(self):
        leaf = {"value_type": "np.ndarray", "skip_deserialize": False}
        tree = {
            repr(tuple(key.split("."))): {"key_metadata": [{"key": p, "key_type": 2} for p in key.split(".")],
                                          "value_metadata": leaf}
            for key in self.keys
        }  # fmt: skip
        saving = {k: v for k, v in ORBAX_SAVING.items() if k != "use_compression"}
        item = {"tree_metadata": tree, **saving, "store_array_data_equal_to_fill_value": True, "custom_metadata": None}
        (self.item / "_METADATA").write_text(json.dumps(item))
        checkpoint = {
            "item_handlers": {ORBAX_ITEM: ORBAX_ITEM_HANDLER}, "metrics": {}, "performance_metrics": {},
            "init_timestamp_nsecs": self.started, "commit_timestamp_nsecs": time.time_ns(),
            "custom_metadata": self.metadata,
        }  # fmt: skip
        (self.path / "_CHECKPOINT_METADATA").write_text(json.dumps(checkpoint))
        (self.path / "orbax.checkpoint").write_bytes(b"")
        (self.path / "commit_success.txt").write_text(f"Checkpoint commit was successful to {self.path}")
