"""The output folder as a transaction: everything is written into a work folder beside --out, and only a finished,
validated output is renamed into place.

What it guarantees:
- --out is never the source, nor a folder that holds it, with or without --force.
- --force replaces only an earlier vae-convert output (its manifest is there) or an empty folder; anything else is
  refused, naming what is there.
- The final rename refuses an existing target (renameat2 with RENAME_NOREPLACE, where the kernel has it; a plain
  rename of a folder onto a non-empty folder fails anyway): a run without --force never replaces an output that
  another run wrote after it started.
- An old output replaced under --force is moved aside first and only deleted once the new one is in place; if the
  new one cannot be moved in, the old one goes back.
- Work and backup folders carry the owner's pid, so a later run can tell a killed run's leftovers from a live run's
  folders, remove them, and put back an output that a killed --force run had moved aside.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import gc
import hashlib
import json
import math
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from converter import untrusted
from converter.errors import InputError, OutputError
from converter.models.common.spec import FamilySpec
from converter.registry import COMPONENTS, FAMILIES, config_from_dict
from converter.targets import DTYPES, TARGETS, Target

MANIFEST = "vae_convert.json"
TOOL = "vae-convert"
_IN_PROGRESS: set[OutputFolder] = set()  # folders whose work folder exists, for `abandon_all` on a signal
_WRITTEN: list[Path] = []  # outputs this process has moved into place
_HELD = (signal.SIGINT, signal.SIGTERM)  # the signals whose handler undoes a run (converter/__main__.py)


def new_manifest(**fields) -> dict:
    """The manifest every writer starts from: the tool, its version and the environment it ran in, then `fields`
    (MANIFEST_SCHEMA says what they are)."""
    from converter import __version__, environment

    return {"tool": TOOL, "version": __version__, "environment": environment.versions(), **fields}


FULL = (errno.ENOSPC, errno.EDQUOT)


def cannot_write(location: Path, error: OSError, needed: int | None = None) -> OutputError:
    """The one line for a write into `location` that failed; on a full disk, about what the output needs."""
    message = f"cannot write to {location}: {error.strerror or error}"
    if error.errno in FULL and needed:
        message += f" (the output needs about {size_text(needed)})"
    return OutputError(message)


def specs_bytes(specs: dict) -> int:
    """The bytes of tensors listed as {key: (shape, dtype)}."""
    return sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in specs.values())


def size_text(n: int | None) -> str:
    if n is None:
        return "size unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def write_json(path: Path, content: dict):
    """Standard JSON (no Infinity or NaN, which other readers refuse)."""
    path.write_text(json.dumps(content, indent=2, allow_nan=False) + "\n")


must = untrusted.Required
_CHECK = {
    "output": must(str),
    "shape": must([untrusted.Size]),
    "max_abs": must((float, None)),  # null: not finite
    "mean_abs": must((float, None)),
    "tol": must((float, None)),
    "ratio": (float, None),
    "reference_finite": bool,
    "ok": must(bool),
}
_SOURCE = {
    "origin": must(str),
    "files": [str],
    "sha256": {str: str},
    "revision": str,
    "verified": str,
    "format": str,
    "dropped": {str: {"tensors": must(int), "bytes": must(int)}},
    "exported_from": str,
    "filled": {str: int},
    "config_inferred": [str],
    "saved_from": str,
    "output": {"model": (str, None), "target": str, "dtype": str, "source": must(dict), "version": str},
    "flax_output": {"model": (str, None), "dtype": str, "source": must(dict), "version": str},  # exports before 0.3
}
# What every reader of a manifest may rely on: the fields it uses, of these types, the required ones there.
MANIFEST_SCHEMA = {
    "tool": must(str),
    "version": must(str),
    "family": must(str),
    "model": (str, None),
    "component": str,
    "target": must(str),
    "format": must(str),
    "dtype": must(str),
    "mapping": {"file": must(str), "sha256": must(str)},
    "source": must(_SOURCE),
    "config_ignored": [str],
    "tensors": {str: ([float], {"shape": must([untrusted.Size]), "sha256": must(str)})},
    "environment": {str: str},
    "validation": {
        "rtol": must(float),
        "ok": must(bool),
        "checks": must([_CHECK]),
        "preview": {"file": must(str), "max_abs": dict, "sound": str},
        "decode_inputs": {str: (list, float)},  # an array's values, or a number (LTX's noise seed)
    },
}


def _tool_manifest(path: Path) -> dict:
    """The manifest of a folder vae-convert wrote (its `tool` says so), fields unchecked."""
    where = Path(path) / MANIFEST
    if not os.path.lexists(where):
        if parts := component_outputs(path):
            raise InputError(
                f"{path}: holds one output per pipeline component ({', '.join(p.name for p in parts)}, written by "
                f"--component all); give one of them, as {parts[0]}"
            )
        raise InputError(f"{path}: not a vae-convert output ({MANIFEST} is missing)")
    manifest = untrusted.read_json(where, schema=dict)
    if manifest.get("tool") != TOOL:
        raise InputError(f"{path}: not a vae-convert output ({MANIFEST} was not written by {TOOL})")
    return manifest


def read_manifest(path: Path) -> dict:
    """The manifest of an output folder, or an InputError saying the folder is no vae-convert output or its manifest
    is damaged."""
    manifest = _tool_manifest(path)
    where = Path(path) / MANIFEST
    untrusted.check(manifest, MANIFEST_SCHEMA, str(where))
    for earlier in _earlier_sources(manifest.get("source", {})):
        untrusted.check(earlier, _SOURCE, str(where))
    return manifest


def _earlier_sources(source: dict):
    while isinstance(source.get("flax_output"), dict) and "source" in source["flax_output"]:
        source = source["flax_output"]["source"]
        yield source


def is_output(path: Path) -> bool:
    """Whether vae-convert wrote the folder (so --force may replace it), whole or not, or its components' outputs."""
    try:
        _tool_manifest(path)
    except InputError:
        return bool(component_outputs(path))
    return True


def component_outputs(path: Path) -> list[Path]:
    """The component outputs in a folder `--component all` wrote (OUT/<component>/, the VAE first), or [] where it
    holds anything else."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink() or os.path.lexists(path / MANIFEST):
        return []
    entries = {p.name: p for p in path.iterdir()}
    if not entries or not set(entries) <= set(COMPONENTS):
        return []
    parts = [entries[c] for c in COMPONENTS if c in entries]
    return parts if all(p.is_dir() and not p.is_symlink() and is_output(p) for p in parts) else []


def _describe(folder: Path, n: int = 3) -> str:
    if not folder.is_dir():
        return "a file"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _sibling_prefix(out: Path, kind: str) -> str:
    """The name start of --out's work and backup folders; a long name is shortened (kept apart from others by a
    digest of it) so that the pid and random suffix still fit a file name's 255 bytes."""
    name = out.name
    if len(os.fsencode(name)) > 160:
        name = (
            os.fsencode(name)[:120].decode(errors="ignore") + "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
        )
    return f".{name}.{kind}-"


class OutputFolder:
    """--out for one run. `check()` before any work, `check_not_source(paths)` once the source is known, then
    `with folder as work:` ... `folder.commit()`; leaving the block without a commit removes the work folder."""

    def __init__(self, out: Path, force: bool, say: Callable[[str], None] = lambda message: None):
        self.out = Path(out).expanduser().absolute()
        self.force = force
        self.say = say
        self.work: Path | None = None
        self.moved_aside: Path | None = None  # where --force put the old output while the new one moves in
        self.committed = False
        self.needed: int | None = None  # about how many bytes the output takes, for a full disk's message

    def check(self):
        """Whether --out may be written at all; also cleans up after killed runs at the same --out."""
        self.recover_interrupted()
        refusal = self.refusal()
        if refusal:
            raise OutputError(refusal)

    def refusal(self) -> str | None:
        """Why --out cannot be written now, or None; changes nothing (dry runs ask this)."""
        if not os.path.lexists(self.out):
            return None
        if self.out.is_symlink():
            return (
                f"{self.out} is a symbolic link; refusing to write through it{' even with --force' * self.force}: "
                f"give the real folder, or another --out"
            )
        if not self._replaceable():
            return (
                f"{self.out} exists and is not a vae-convert output (it holds {_describe(self.out)}); refusing "
                f"to replace it{' even with --force' if self.force else ''}: choose another --out"
            )
        if not self.force:
            return f"{self.out} exists; pass --force to replace it (the old output stays until the new one is done)"
        return None

    def _replaceable(self) -> bool:
        return self.out.is_dir() and not self.out.is_symlink() and (not any(self.out.iterdir()) or is_output(self.out))

    def check_not_source(self, paths: Iterable[Path]):
        """--out must not be the source or hold it: replacing --out would delete the user's checkpoint."""
        out = self.out.resolve()
        for path in paths:
            real = Path(path).resolve()
            if real == out or out in real.parents:
                raise OutputError(
                    f"--out {self.out} is the source or holds it ({path}); refusing to write there, "
                    f"with or without --force: choose another --out"
                )

    def __enter__(self) -> Path:
        with _signals_held():  # a signal handler sees the work folder registered, or not yet made
            try:
                self.out.parent.mkdir(parents=True, exist_ok=True)
                work = tempfile.mkdtemp(prefix=f"{_sibling_prefix(self.out, 'tmp')}{os.getpid()}-", dir=self.out.parent)
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(work, 0o777 & ~umask)  # mkdtemp makes it private; the output should get normal permissions
            except OSError as e:
                raise OutputError(f"cannot create the output next to {self.out}: {e.strerror or e}") from None
            self.work = Path(work)
            _IN_PROGRESS.add(self)
        return self.work

    def __exit__(self, exc_type, exc, traceback):
        if not self.committed:
            _remove(self.work)
        _IN_PROGRESS.discard(self)
        if isinstance(exc, OSError) and exc.errno in FULL:  # whatever was being written: the output, the picture
            raise cannot_write(self.out.parent, exc, self.needed) from None
        return False

    def abandon(self) -> bool:
        """Undoes this run's changes at once (on a signal): the work folder goes, and an old output moved aside for
        --force comes back. Returns False when the new output was already in place."""
        if self.committed:
            _remove(self.moved_aside)  # the old output it replaced
            return False
        if self.moved_aside is not None:
            self._put_back(self.moved_aside)
        _remove(self.moved_aside)
        _remove(self.work)
        return True

    def _put_back(self, aside: Path) -> bool:
        """Moves an old output that --force had put aside back to --out, if the new one never arrived."""
        if (aside / "previous").exists() and not os.path.lexists(self.out):
            os.rename(aside / "previous", self.out)
            return True
        return False

    def commit(self):
        """Moves the finished work folder into place. Without --force an output that appeared meanwhile is kept and
        this run fails; with --force it is moved aside, and deleted only once the new output is in place."""
        with _signals_held():  # a signal handler sees the output moved in and `committed` set, or neither
            self._move_into_place()
        _remove(self.moved_aside)
        self.moved_aside = None

    def _move_into_place(self):
        try:
            if self.force and os.path.lexists(self.out):
                if not self._replaceable():  # it changed since check()
                    raise OutputError(
                        f"{self.out} changed during the conversion and is no longer a vae-convert "
                        f"output (it holds {_describe(self.out)}); not replacing it"
                    )
                self.moved_aside = Path(
                    tempfile.mkdtemp(prefix=f"{_sibling_prefix(self.out, 'old')}{os.getpid()}-", dir=self.out.parent)
                )
                os.rename(self.out, self.moved_aside / "previous")
            try:
                _rename_noreplace(self.work, self.out)
            except BaseException:
                if self.moved_aside is not None:
                    self._put_back(self.moved_aside)
                raise
        except FileExistsError:
            raise OutputError(
                f"another run wrote {self.out} first; its output is kept and this one discarded "
                f"(pass --force to replace it)"
            ) from None
        except OSError as e:
            raise OutputError(f"cannot move the output into place at {self.out}: {e.strerror or e}") from None
        self.committed = True
        _WRITTEN.append(self.out)

    def recover_interrupted(self):
        """Cleans up after runs that were killed: their work folders go; a previous output one had moved aside for
        --force comes back if the new one never arrived."""
        parent = self.out.parent
        if not parent.is_dir():
            return
        for kind in ("old", "tmp"):
            prefix = _sibling_prefix(self.out, kind)  # compared as a string: --out may hold glob characters
            for folder in sorted(p for p in parent.iterdir() if p.name.startswith(prefix)):
                if _owner_alive(folder, prefix):
                    continue
                if kind == "old" and self._put_back(folder):
                    self.say(f"restored the previous output at {self.out} (a killed --force run had moved it aside)")
                _remove(folder)


def _owner_alive(folder: Path, prefix: str) -> bool:
    pid = folder.name[len(prefix) :].split("-", 1)[0]
    if not untrusted.ascii_digits(pid):
        return True  # not ours to touch
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(folder: Path | None):
    """Removes a work or backup folder. Writer threads may still be adding files under it (Orbax writes from threads,
    making missing parent folders as it goes), so the folder is first swapped, atomically, for an empty file of its
    name, under which nothing can be made; that file goes last."""
    if folder is None or not os.path.lexists(folder):
        return
    trash = folder.with_name(folder.name + ".removing")
    _discard(trash)
    blocker = None
    try:
        os.close(os.open(trash, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        if _renameat2(trash, folder, _RENAME_EXCHANGE) == 0:
            blocker = folder
        else:
            os.unlink(trash)
            os.rename(folder, trash)
    except OSError:
        trash = folder
    _discard(trash)
    if blocker is not None:
        _discard(blocker)


def _discard(path: Path):
    for _ in range(3):  # a writer holding an open folder may still add to it while it is emptied
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
        if not os.path.lexists(path):
            return


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM that arrive during the block are recorded and handed to their handler (converter/__main__.py)
    when it ends. Handlers are swapped rather than the signal masked: a mask covers one thread, and a signal sent to
    the process can land on any of JAX's or Orbax's threads."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum)) for sig in _HELD}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if arrived and callable(previous[arrived[0]]):
            previous[arrived[0]](arrived[0], None)


def abandon_all() -> str:
    """Abandons every output folder in progress (see `OutputFolder.abandon`); says what became of the outputs."""
    unwritten = any([folder.abandon() for folder in list(_IN_PROGRESS)])
    if _WRITTEN:
        return f"the output at {_WRITTEN[-1]} was already complete and stays"
    return "nothing was written" if unwritten else ""


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _renameat2(source: Path, target: Path, flags: int) -> int:
    """Linux renameat2(2): 0 when done, else its errno (ENOSYS where the C library lacks it)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return errno.ENOSYS
    if renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) == 0:
        return 0
    return ctypes.get_errno()


def _rename_noreplace(source: Path, target: Path):
    """rename(2) that fails with FileExistsError when `target` exists, atomically (Linux renameat2); where the kernel
    or filesystem lacks it, a plain rename, which cannot replace a non-empty folder either."""
    err = _renameat2(source, target, _RENAME_NOREPLACE)
    if err == 0:
        return
    if err == errno.EEXIST:
        raise FileExistsError(err, os.strerror(err), str(target))
    if err not in (errno.EINVAL, errno.ENOSYS):
        raise OSError(err, os.strerror(err), str(target))
    if os.path.lexists(target) and not target.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    try:
        os.rename(source, target)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(e.errno, e.strerror, str(target)) from None
        raise


# -- reading an output back -------------------------------------------------------------------------------


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
    weights = out.target.read_weights(out)
    fixed = out.target.fixed_dtype_leaves(out.family, out.config)
    for key, array in weights.items():
        expected = out.target.leaf_dtype(key, fixed, out.dtype)
        if np.dtype(array.dtype) != expected:
            raise InputError(f"{out.path}: {key} is {array.dtype}, the output's dtype for it is {expected.name}")
    model = out.target.build(out.target.empty_model(out.family, out.config, out.dtype), weights, out.path, sharding)
    if upcast(out.config, out.dtype):  # as diffusers' pipelines run such a VAE
        model = out.target.cast(model, np.dtype(np.float32))
    return model


def upcast(config, dtype) -> bool:
    """Whether a float16 output of `config` loads in float32: its config asks for it (`force_upcast`, SDXL's VAE,
    whose activations overflow float16), as diffusers' pipelines upcast such a VAE before running it."""
    return np.dtype(dtype) == np.float16 and getattr(config, "force_upcast", False)
