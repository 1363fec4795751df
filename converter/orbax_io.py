"""Orbax checkpoints as the Flax target writes and reads them: a writer that saves a group of leaves at a time, and
readers that map each leaf's bytes (our layout) or read Orbax's default layout into aligned buffers."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import mmap
import os
import re
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from converter import untrusted
from converter.errors import InputError
from converter.mapping import nested
from converter.safetensors_io import nbytes

# Orbax holds about three copies of what it is saving: saving the leaves in groups of 1/16 of the checkpoint keeps the
# peak well below the checkpoint's size (for an 84 M-parameter VAE too, whose fixed costs weigh more), and groups of
# at least 16 MB keep small checkpoints to a few saves.
ORBAX_GROUPS = 16
ORBAX_MIN_GROUP_BYTES = 16 * 2**20
ORBAX_ITEM = "state"  # the name partial saves give the one PyTree in the checkpoint
# How Orbax lays the checkpoint out: each leaf a zarr (v2) array in a folder of its own, its bytes uncompressed in one
# file, which a load maps (OCDBT, Orbax's default, packs them into shared files at offsets JAX would copy from; zstd
# gains little on trained float weights and slows every load).
ORBAX_SAVING = {"use_ocdbt": False, "use_zarr3": False, "use_compression": False}


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


_ZARR_DTYPES = {
    "<f4": np.dtype(np.float32),
    "<f2": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "<i4": np.dtype(np.int32),  # counts (BatchNorm's batches)
}

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


def _return_freed_memory():
    """Hands the heap's freed pages back to the system (glibc): Orbax's writer threads each free a group's copies
    in an arena of their own, which would otherwise keep them, so the resident set grew by a group per save."""
    if sys.platform == "linux":
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


class OrbaxWriter:
    """Writes the NNX state's pure dict as one Orbax checkpoint, a group of leaves at a time (Orbax's partial save,
    finalized on close): at most a group of converted leaves is held at once, so memory stays well below the
    checkpoint's size. The checkpoint at `path` holds one PyTree, named ORBAX_ITEM."""

    def __init__(self, path: Path, metadata: dict, total_bytes: int):
        self.path, self.metadata = path, metadata
        self.group_limit = max(ORBAX_MIN_GROUP_BYTES, total_bytes // ORBAX_GROUPS)
        self.group, self.group_bytes = {}, 0

    def write(self, key: str, array: np.ndarray):
        if array.size == 0:  # Orbax saves none (the Flax target's read gives it back from the model's shapes)
            return
        self.group[key] = np.array(array, copy=True)  # our own copy: the source's pages are released after this call
        self.group_bytes += array.nbytes
        if self.group_bytes >= self.group_limit:
            self._save_group()

    def _save_group(self):
        import orbax.checkpoint.experimental.v1 as ocp
        from orbax.checkpoint.experimental.v1 import partial

        if self.group:
            context = ocp.Context()
            for option, value in ORBAX_SAVING.items():
                setattr(context.array.saving, option, value)
            with context, _orbax_writing():
                partial.save(self.path, nested(self.group), custom_metadata=self.metadata)
        self.group, self.group_bytes = {}, 0
        _return_freed_memory()

    def close(self):
        from orbax.checkpoint.experimental.v1 import partial

        self._save_group()
        with _orbax_writing():
            partial.finalize(self.path)


# what Orbax logs that is no news to the user: finalize's merge of per-process OCDBT stores finding none (none are
# written), and each of its writer threads reporting the failure that the caller is raised anyway
_MERGE_NOTE = "[process=%s][thread=%s] Skipping merge of OCDBT checkpoints"
_THREAD_FAILURE = "_SignalingThread.run() raised an exception"


@contextlib.contextmanager
def _orbax_writing():
    """Orbax's writes as the tool reports them: a failed file write (Orbax raises it as ValueError with the OS's
    error code) is the OSError it was, and what the user needs not see is hidden: the notes above, and the
    tracebacks Orbax's writer threads print when a write fails (what they print is held until the write is done)."""

    def keep(record):
        message = str(record.msg)
        return not (message.startswith(_MERGE_NOTE) or _THREAD_FAILURE in record.getMessage())

    logger = logging.getLogger("absl")
    logger.addFilter(keep)
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except ValueError as e:
        code = re.search(r"os_error_code='(\d+)'", str(e))
        if code is None:
            raise
        _quiet_after_a_failed_write()
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1)))) from None
    else:
        sys.stderr.write(held.getvalue())  # nothing failed: what was printed meanwhile is the user's to see
    finally:
        logger.removeFilter(keep)


@functools.cache  # once a process: each call would stack another filter and hook
def _quiet_after_a_failed_write():
    """What Orbax's machinery says after a failed write, when the failure has been reported: each failed write task
    logs its exception when it is collected (which may be at exit), and TensorStore's writes still in flight print
    a traceback each (as unraisable) finding the event loop Orbax closed."""
    logging.getLogger("asyncio").addFilter(lambda record: "os_error_code=" not in record.getMessage())
    shown = sys.unraisablehook

    def unraisablehook(unraisable):
        if str(unraisable.exc_value) != "Event loop is closed":
            shown(unraisable)

    sys.unraisablehook = unraisablehook
