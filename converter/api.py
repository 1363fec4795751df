"""The Python API: `converter.load(path)` turns a converted output folder into a ready model.

flax     -> the Flax NNX model (channels-last), built from abstract state and filled by path, never initialised;
            the abstract model is kept for later processes in the structure cache (`converter.structure_cache`:
            the user's cache folder unless $VAE_CONVERT_STRUCTURE_CACHE names another, or off).
torchax  -> the PyTorch model (diffusers' names) with the converted weights, on CPU; pass it to
            `converter.torchax_runtime.compile_model` to run it on JAX, each step jitted.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from converter.output import load_output
from converter.structure_cache import OFF, note

COMPILE_CACHE_ENV = "VAE_CONVERT_COMPILE_CACHE"


def enable_compile_cache(directory: str | Path | None = None) -> bool:
    """Turns on JAX's persistent compilation cache in `directory` (default: $VAE_CONVERT_COMPILE_CACHE), so a later
    process reaches its first decode without compiling again. Off unless asked for (unset, empty or "off", as the
    structure cache's variable says it); returns whether it is on."""
    import jax

    directory = directory or os.environ.get(COMPILE_CACHE_ENV)
    if not directory or str(directory) == OFF:
        return False
    folder = Path(directory).expanduser().absolute()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the steps are small on CPU: keep them all
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _cache_failures_noted(folder)
    return True


def _cache_failures_noted(folder: Path):
    """JAX warns, two lines with its own file and line, for every entry it cannot read or write (a full disk, a
    file where the folder should be); the run goes on without it. Said once per process, as a note."""
    shown = warnings.showwarning
    if getattr(shown, "notes_cache_failures", False):
        return
    noted = []

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if not text.startswith(("Error writing persistent compilation cache entry", "Error reading persistent")):
            return shown(message, category, filename, lineno, file, line)
        if not noted:
            noted.append(text)
            found = re.search(r"\[Errno \d+\] ([^:]+)", text)
            reason = found.group(1) if found else text.split("': ", 1)[-1]
            note(f"compiled steps are not kept in {folder} ({reason}); set {COMPILE_CACHE_ENV} to another folder")

    showwarning.notes_cache_failures = True
    warnings.showwarning = showwarning


def load(path: str | Path, mesh=None):
    """A converted output -> a ready model. `path` may be relative (to the working directory). With `mesh` (a
    jax.sharding.Mesh, axes "dp" and "tp"), a Flax model's parameters are restored straight onto it, replicated;
    pass the mesh to encode/decode to run them sharded."""
    enable_compile_cache()
    return load_output(path, mesh)
