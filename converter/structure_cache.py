"""The Flax models' structures (an abstract model from `nnx.eval_shape`, with its variables listed): made once per
process, kept between processes in a private cache folder, read back only from a file this user alone could have
written (docs/security.md). Beside each, the leaves' shapes and dtypes, which is all a conversion plans with: one
that does not validate then needs neither Flax nor JAX."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import pickle
import stat
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import numpy as np

from converter.registry import FAMILIES, ensure_plausible_size

# Where the Flax models' structures are kept between processes: a folder, or "off"; by default vae-convert/structures
# in the user's cache folder.
STRUCTURE_CACHE_ENV = "VAE_CONVERT_STRUCTURE_CACHE"
OFF = "off"  # what a cache variable says to keep nothing (this one and $VAE_CONVERT_COMPILE_CACHE alike)


class FlaxStructure(NamedTuple):
    """A Flax model whose variables hold shapes and dtypes (jax.ShapeDtypeStruct), and those variables by path, in
    the order they are filled."""

    model: object  # an nnx.Module
    variables: list  # [(path, nnx.Variable)]


_STRUCTURES: dict[tuple, bytes] = {}  # (family, config, dtype) -> the pickled FlaxStructure, for this process


def flax_structure(family_name: str, config, dtype: np.dtype) -> FlaxStructure:
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
    ensure_plausible_size(config, (v.shape for _, v in structure.variables))
    _STRUCTURES[key] = pickle.dumps(structure)
    if entry is not None:
        _write_structure(entry, _STRUCTURES[key])
    return structure


_LEAVES: dict[tuple, dict] = {}  # (family, config) -> the float32 model's leaf specs, for this process
LEAVES_SUFFIX = ".leaves.json"
LEAF_DTYPES = ("float32", "int32")  # the float32 model's: weights, and counts (JAX keeps 32-bit integers)


def leaf_specs(family_name: str, config, make) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The float32 model's leaves, dotted, each with its shape and dtype: `make(structure)` of its structure, or
    kept beside it from an earlier process (a JSON file, read as the structures are: `_read_private`)."""
    key = (family_name, config)
    if key in _LEAVES:
        return _LEAVES[key]
    entry = _structure_entry(family_name, config, np.dtype(np.float32))
    kept = entry.with_suffix(LEAVES_SUFFIX) if entry is not None else None
    specs = _read_leaves(kept) if kept is not None else None
    if specs is None:
        specs = make(flax_structure(family_name, config, np.dtype(np.float32)))
        if kept is not None:
            shown = {k: [list(shape), dtype.name] for k, (shape, dtype) in specs.items()}
            _write_structure(kept, json.dumps(shown).encode())
    _LEAVES[key] = specs
    return specs


def _read_leaves(kept: Path) -> dict | None:
    data = _read_private(kept)
    try:
        specs = {k: (tuple(shape), name) for k, (shape, name) in json.loads(data).items()}
    except (ValueError, TypeError, AttributeError, RecursionError):  # none, damaged or foreign: made anew
        return None
    fits = all(
        isinstance(k, str) and name in LEAF_DTYPES and all(type(d) is int and d >= 0 for d in shape)
        for k, (shape, name) in specs.items()
    )
    return {k: (shape, np.dtype(name)) for k, (shape, name) in specs.items()} if fits else None


def structure_cache() -> Path | None:
    """The folder of kept structures: $VAE_CONVERT_STRUCTURE_CACHE, else vae-convert/structures in the user's cache
    folder ($XDG_CACHE_HOME, else ~/.cache); None when the variable says off, or there is no home to default to."""
    chosen = os.environ.get(STRUCTURE_CACHE_ENV)
    if chosen == OFF:
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
    the Flax, JAX and Python whose objects it pickles (their versions as installed: asked without importing them).
    None while the cache is off."""
    directory = structure_cache()
    if directory is None:
        return None
    versions = (metadata.version("flax"), metadata.version("jax"), sys.version_info[:2])
    made_from = (family_name, config, dtype.name, *versions)
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

    kept = _read_private(entry)
    if kept is None:
        return None
    try:
        structure = pickle.loads(kept)
    except Exception:  # truncated or foreign: unpickling raises any of a dozen types
        return None
    whole = isinstance(structure, FlaxStructure) and isinstance(structure.model, nnx.Module)
    return (kept, structure) if whole else None


def _read_private(entry: Path) -> bytes | None:
    """A kept entry's bytes, or None where there is none or someone else could have written it (`_read_structure`)."""
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
            return file.read()
    except OSError:
        return None


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
        note(
            f"the model structure cache {folder} is not used: it is not a folder of this user's that only this user "
            f"can write; set {STRUCTURE_CACHE_ENV} to a private folder, or to off"
        )
    return False


def note(message: str):
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
        note(f"the model structure is not kept in {entry.parent} ({e.strerror or e}); set {STRUCTURE_CACHE_ENV} "
              f"to another folder, or to off")  # fmt: skip


class _NoKeys:
    """In place of nnx.Rngs while tracing the abstract model: nnx.Conv and nnx.Linear ask for a key per parameter,
    which the models' initialisers (zeros, ones) never use, and a real Rngs would trace a counter update per ask.
    A random initialiser given this fails loudly."""

    def params(self):
        return None
