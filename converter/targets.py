"""The targets, one object each: what their leaves are (from abstract state, never from an initialised model), how
their weights are written and read back, how a written output becomes a ready model, and how validation drives it.

  flax     Flax NNX model, channels-last. Formats: orbax (default; the NNX state as a pure dict) or safetensors
           (flat dotted keys, channels-last layouts).
  torchax  PyTorch model with diffusers' names, meant to run on JAX through torchax. Format: safetensors, named and
           laid out like diffusers' own, so `AutoencoderKL*.from_pretrained` reads it too.

Everything target-specific is here: no other module asks which target it has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import logging
import math
import mmap
import os
import pickle
import stat
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import ml_dtypes
import numpy as np

from converter import compat, untrusted
from converter.errors import InputError
from converter.mapping import nested, target_path
from converter.models.common.spec import FamilySpec
from converter.output import read_manifest
from converter.registry import FAMILIES, config_from_dict
from converter.safetensors_io import SafetensorsFile, SafetensorsWriter, nbytes

# Orbax holds about three copies of what it is saving: saving the leaves in groups of 1/8 of the checkpoint keeps the
# peak well below the checkpoint's size, and groups of at least 32 MB keep small checkpoints to one or two saves.
ORBAX_GROUPS = 8
ORBAX_MIN_GROUP_BYTES = 32 * 2**20
ORBAX_ITEM = "state"  # the name partial saves give the one PyTree in the checkpoint
# How Orbax lays the checkpoint out: each leaf a zarr (v2) array in a folder of its own, its bytes uncompressed in one
# file, which a load maps (OCDBT, Orbax's default, packs them into shared files at offsets JAX would copy from; zstd
# gains little on trained float weights and slows every load).
ORBAX_SAVING = {"use_ocdbt": False, "use_zarr3": False, "use_compression": False}
# Where the Flax models' structures are kept between processes: a folder, or "off"; by default vae-convert/structures
# in the user's cache folder.
STRUCTURE_CACHE_ENV = "VAE_CONVERT_STRUCTURE_CACHE"
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}


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

    def open_writer(self, fmt: str, out_dir: Path, specs: dict, metadata: dict):
        path = out_dir / self.weight_files[fmt]
        if fmt == "orbax":
            return OrbaxWriter(path, metadata, sum(nbytes(shape, dtype) for shape, dtype in specs.values()))
        return SafetensorsWriter(
            path, specs, {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
        )

    def empty_model(self, family: FamilySpec, config, dtype):
        """The model's structure without weights (no storage allocated, nothing initialised)."""
        raise NotImplementedError

    def read_weights(self, out_dir: Path, fmt: str) -> dict:
        """The weights of a written output as saved, {leaf key: host array}; `build` places them."""
        raise NotImplementedError

    def build(self, empty_model, weights: dict, path: Path, sharding=None):
        """A ready model: `empty_model`'s structure filled with the weights `read_weights` gave."""
        raise NotImplementedError

    def runner(self, model):
        """The model driven with channels-first numpy arrays, as validation and the tests compare it."""
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
        return _flax_structure(family.name, config, np.dtype(dtype))

    def leaf_shapes(self, family, config):
        return {
            ".".join(map(str, path)): tuple(compat.variable_value(v).shape)
            for path, v in self.empty_model(family, config, np.float32).variables
        }

    def read_weights(self, out_dir, fmt):
        path = _weights_path(out_dir, self.weight_files[fmt])
        if fmt == "safetensors":
            weights = SafetensorsFile(path)  # mapped: `build` makes its pages the leaves, read on first use
            return {target_path(k): weights[k] for k in weights.keys()}
        try:
            arrays = _zarr_leaves(path / ORBAX_ITEM) or _read_ocdbt_leaves(path)
        except InputError:
            raise
        except Exception as e:  # Orbax and TensorStore raise their own error types for a damaged or foreign layout
            raise InputError(f"{path}: not a readable Orbax checkpoint ({str(e).splitlines()[0][:160]})") from None
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

    def runner(self, model):
        return FlaxRunner(model)


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
        return {k: tuple(v.shape) for k, v in self.empty_model(family, config, None).state_dict().items()}

    def empty_model(self, family, config, dtype):
        return meta_torch(family, config)

    def read_weights(self, out_dir, fmt):
        # the model's parameters are the mapped file itself: nothing is read until used, as from_pretrained does
        weights = SafetensorsFile(_weights_path(out_dir, self.weight_files[fmt]), copy_on_write=True)
        return {k: weights[k] for k in weights.keys()}

    def build(self, empty_model, weights, path, sharding=None):
        empty_model.load_state_dict({k: to_torch(v) for k, v in weights.items()}, strict=True, assign=True)
        return empty_model.eval()

    def runner(self, model):
        return TorchaxRunner(model)


class FlaxStructure(NamedTuple):
    """A Flax model whose variables hold shapes and dtypes (jax.ShapeDtypeStruct), and those variables by path, in
    the order they are filled."""

    model: object  # an nnx.Module
    variables: list  # [(path, nnx.Variable)]


_STRUCTURES: dict[tuple, bytes] = {}  # (family, config, dtype) -> the pickled FlaxStructure, for this process


def _flax_structure(family_name: str, config, dtype: np.dtype) -> FlaxStructure:
    """Made once per process, and a copy of it unpickled for each later call (a few milliseconds, where building
    Flax's modules again takes tens); kept for later processes in the structure cache (`structure_cache`)."""
    import jax.numpy as jnp
    from flax import nnx

    key = (family_name, config, dtype)
    if (kept := _STRUCTURES.get(key)) is not None:
        return pickle.loads(kept)
    entry = _structure_entry(family_name, config, dtype)
    if entry is not None and (read := _read_structure(entry)) is not None:
        _STRUCTURES[key], structure = read
        return structure
    cls = FAMILIES[family_name].flax_model()
    model = nnx.eval_shape(lambda: cls(config, rngs=_NoKeys(), param_dtype=jnp.dtype(dtype)))
    # the variables listed once here: walking the graph for them costs more than unpickling it
    structure = FlaxStructure(model, [(p, v) for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)])
    _STRUCTURES[key] = pickle.dumps(structure)
    if entry is not None:
        _write_structure(entry, _STRUCTURES[key])
    return structure


def structure_cache() -> Path | None:
    """The folder of kept structures: $VAE_CONVERT_STRUCTURE_CACHE, else vae-convert/structures in the user's cache
    folder ($XDG_CACHE_HOME, else ~/.cache); None when the variable says off, or there is no home to default to."""
    chosen = os.environ.get(STRUCTURE_CACHE_ENV)
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen).expanduser().absolute()
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:  # no home directory known
        return None
    return base.absolute() / "vae-convert" / "structures"


def _structure_entry(family_name: str, config, dtype: np.dtype) -> Path | None:
    """The cache file of one abstract model, named by all it is made from: the config, the dtype, the model code, and
    the Flax, JAX and Python whose objects it pickles. None while the cache is off."""
    import flax
    import jax

    directory = structure_cache()
    if directory is None:
        return None
    made_from = (family_name, config, dtype.name, flax.__version__, jax.__version__, sys.version_info[:2])
    key = hashlib.sha256(repr((made_from, _models_digest())).encode()).hexdigest()
    return directory / f"{key}.pickle"


@functools.cache
def _models_digest() -> str:
    """A digest of the model code's files."""
    import converter.models

    digest = hashlib.sha256()
    for path in sorted(Path(converter.models.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _read_structure(entry: Path) -> tuple[bytes, FlaxStructure] | None:
    """A kept structure (its pickle and itself), or None when there is none, it is damaged, or someone else could
    have written it (unpickling runs code): the entry must be a regular file of ours, not a link, writable by us
    alone, in a folder of ours that only we can write (`_private_folder`). It is then made anew."""
    from flax import nnx

    if not _private_folder(entry.parent):
        return None
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # missing, or a symbolic link (ELOOP)
        return None
    try:
        with os.fdopen(fd, "rb", buffering=0) as file:
            status = os.fstat(file.fileno())
            if not _ours_alone(status) or status.st_nlink != 1:
                return None
            kept = file.read()
        structure = pickle.loads(kept)
    except Exception:  # truncated or foreign: unpickling raises any of a dozen types
        return None
    whole = isinstance(structure, FlaxStructure) and isinstance(structure.model, nnx.Module)
    return (kept, structure) if whole else None


def _ours_alone(status: os.stat_result) -> bool:
    return status.st_uid == os.getuid() and not status.st_mode & 0o022


_REFUSED_FOLDERS: set[Path] = set()


def _private_folder(folder: Path) -> bool:
    """Whether the structure cache's folder is ours and writable by us alone; says once when it is not (the cache
    is then not used: anyone who can write there could make us unpickle their code)."""
    try:
        status = os.stat(folder)
    except OSError:
        return False
    if stat.S_ISDIR(status.st_mode) and _ours_alone(status):
        return True
    if folder not in _REFUSED_FOLDERS:
        _REFUSED_FOLDERS.add(folder)
        _note(
            f"the model structure cache {folder} is not used: it is not a folder of this user's that only this user "
            f"can write; set {STRUCTURE_CACHE_ENV} to a private folder, or to off"
        )
    return False


def _note(message: str):
    """One line on stderr, for what a user should know that does not stop the work."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"vae-convert: note: {message}\n")


def _write_structure(entry: Path, kept: bytes) -> None:
    """Keeps a structure whole or not at all (another process may be reading the entry): written to a new file of an
    unpredictable name (never through a name someone else made), then renamed over the entry; a cache that cannot be
    written is noted, not fatal."""
    temporary = None
    try:
        entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private_folder(entry.parent):
            return
        fd, temporary = tempfile.mkstemp(prefix=f".{entry.name}.", dir=entry.parent)
        with os.fdopen(fd, "wb") as file:
            file.write(kept)
        os.replace(temporary, entry)
    except OSError as e:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        _note(f"the model structure is not kept in {entry.parent} ({e.strerror or e}); set {STRUCTURE_CACHE_ENV} "
              f"to another folder, or to off")  # fmt: skip


class _NoKeys:
    """In place of nnx.Rngs while tracing the abstract model: nnx.Conv and nnx.Linear ask for a key per parameter,
    which the models' initialisers (zeros, ones) never use, and a real Rngs would trace a counter update per ask.
    A random initialiser given this fails loudly."""

    def params(self):
        return None


def _zarr_leaves(item_dir: Path) -> dict[str, np.ndarray]:
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


_ZARR_DTYPES = {"<f4": np.dtype(np.float32), "<f2": np.dtype(np.float16), "bfloat16": DTYPES["bfloat16"]}

# Data files from this size on are mapped, page-aligned, so JAX on CPU takes them as they are and their pages are read
# on first use, as from_pretrained does; smaller ones (biases, norms: most of a model's leaves) are read, since a
# mapping costs more system calls and page-table work than reading a few pages, and JAX copies them in no time.
MAPPED_FROM_BYTES = 1 << 16


def _zarr_leaf(folder: str, meta: dict) -> np.ndarray:
    """One leaf's data file as the array its .zarray (`meta`) describes: one uncompressed chunk in C order holding
    the whole array, as Orbax writes it with ORBAX_SAVING. A missing or cut data file is damage (Orbax writes every
    chunk, zeros too), not zarr's fill value."""
    name = os.path.basename(folder)
    untrusted.check(meta, {"shape": [int], "dtype": str, "dimension_separator": str}, name, ValueError)
    shape, dtype = tuple(meta.get("shape", ())), _ZARR_DTYPES.get(meta.get("dtype"))
    plain = {"chunks": list(shape), "compressor": None, "filters": None, "order": "C", "zarr_format": 2}
    if dtype is None or any(d < 0 for d in shape) or any(meta.get(k) != v for k, v in plain.items()):
        raise ValueError(f"{name}: not laid out as vae-convert writes it ({os.path.join(folder, '.zarray')})")
    size = nbytes(shape, dtype)
    chunk = os.path.join(folder, meta.get("dimension_separator", ".").join(["0"] * len(shape)))
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


def _read_ocdbt_leaves(path: Path) -> dict[str, np.ndarray]:
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


def meta_torch(family: FamilySpec, config):
    """The PyTorch model on the meta device: names and shapes, no storage."""
    import torch

    with torch.device("meta"):
        return family.torch_model()(config)


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


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    """A written output as its manifest and config.json describe it, each checked against the registry."""

    path: Path
    manifest: dict
    family: FamilySpec
    target: Target
    fmt: str
    dtype: np.dtype
    config: object


def read_output(path: str | Path) -> OutputInfo:
    """An output folder's manifest and config, or one InputError saying what does not fit."""
    path = Path(path).expanduser().absolute()
    manifest = read_manifest(path)
    family = FAMILIES.get(manifest.get("family"))
    target = TARGETS.get(manifest.get("target"))
    if (
        family is None
        or target is None
        or manifest.get("dtype") not in DTYPES
        or manifest.get("format") not in target.formats
    ):
        raise InputError(f"{path}: the manifest names an unknown family, target, format or dtype")
    raw = untrusted.read_json(path / "config.json", schema=dict)
    if raw.get("_class_name") != family.class_name:
        raise InputError(
            f"{path}: config.json is for {raw.get('_class_name')}, but the manifest says family {family.name} "
            f"({family.class_name})"
        )
    config = config_from_dict(family, raw, str(path / "config.json"))
    return OutputInfo(path, manifest, family, target, manifest["format"], DTYPES[manifest["dtype"]], config)


def load_output(path: str | Path, mesh=None):
    """A written output -> a ready model, checked against its manifest. With `mesh`, a Flax model's parameters are
    restored straight onto it, replicated. An output replaced while it loads (another run's --force moves a new
    folder in) is said to have changed, not to be damaged."""
    folder = Path(path).expanduser().absolute()
    before = _identity(folder)
    try:
        with collection_paused():
            return _load_output(read_output(folder), mesh)
    except InputError:
        if before is not None and _identity(folder) != before:
            raise InputError(
                f"{folder}: the output changed while loading (another run replaced it); load again"
            ) from None
        raise


def _identity(folder: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(folder)
    except OSError:
        return None
    return status.st_dev, status.st_ino


@contextlib.contextmanager
def collection_paused():
    """Python's garbage collector off: a load makes many short-lived objects (tracing the abstract model, Orbax's
    trees), and the collections they set off, each walking every object the process holds, cost more than the
    reading they interrupt. Cyclic garbage made meanwhile is collected after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _load_output(out: OutputInfo, mesh):
    sharding = None
    if mesh is not None:
        from jax.sharding import NamedSharding

        from converter.models.common.sharding import PARAMETERS

        sharding = NamedSharding(mesh, PARAMETERS)
    weights = out.target.read_weights(out.path, out.fmt)
    for key, array in weights.items():
        if np.dtype(array.dtype) != out.dtype:
            raise InputError(f"{out.path}: {key} is {array.dtype}, the manifest says {out.dtype.name}")
    return out.target.build(out.target.empty_model(out.family, out.config, out.dtype), weights, out.path, sharding)


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
        import orbax.checkpoint.experimental.v1 as ocp
        from orbax.checkpoint.experimental.v1 import partial

        if self.group:
            context = ocp.Context()
            for option, value in ORBAX_SAVING.items():
                setattr(context.array.saving, option, value)
            with context:
                partial.save(self.path, nested(self.group), custom_metadata=self.metadata)
        self.group, self.group_bytes = {}, 0

    def close(self):
        from orbax.checkpoint.experimental.v1 import partial

        self._save_group()
        with _orbax_merge_note_hidden():
            partial.finalize(self.path)


@contextlib.contextmanager
def _orbax_merge_note_hidden():
    """Orbax's finalize merges per-process OCDBT stores and, finding none (none are written), logs a warning that
    would reach the user's terminal; nothing else it logs is hidden."""

    def keep(record):
        return not str(record.msg).startswith("[process=%s][thread=%s] Skipping merge of OCDBT checkpoints")

    logger = logging.getLogger("absl")
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


class FlaxRunner:
    """The Flax model, channels-last, driven with channels-first arrays (as the reference takes them)."""

    to_last, to_first = (0, 2, 3, 4, 1), (0, 4, 1, 2, 3)

    def __init__(self, model):
        self.model = model

    def decode(self, latent: np.ndarray) -> np.ndarray:
        return np.asarray(self.model.decode(latent.transpose(self.to_last))).transpose(self.to_first)

    def encode(self, video: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, logvar = self.model.encode(video.transpose(self.to_last))
        return np.asarray(mean).transpose(self.to_first), np.asarray(logvar).transpose(self.to_first)


class TorchaxRunner:
    """The PyTorch model on JAX through torchax, each chunk step jitted, in float32."""

    def __init__(self, model):
        from converter import torchax_runtime

        self.vae = torchax_runtime.compile_model(model.float().eval())

    def decode(self, latent: np.ndarray) -> np.ndarray:
        from converter.torchax_runtime import to_jax_tensor, to_numpy

        return to_numpy(self.vae.decode(to_jax_tensor(self.vae, latent)).sample)

    def encode(self, video: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from converter.torchax_runtime import to_jax_tensor, to_numpy

        dist = self.vae.encode(to_jax_tensor(self.vae, video)).latent_dist
        return to_numpy(dist.mean), to_numpy(dist.logvar)
