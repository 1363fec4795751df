"""The versions a run uses, as installed: `vae-convert --version` prints them and every manifest records them, so a
report names its environment. Read from the installed packages' metadata, without importing them."""

from __future__ import annotations

import platform
from importlib import metadata

from converter import __version__

# what decides a conversion's result, in the order printed
PACKAGES = ("jax", "jaxlib", "flax", "orbax-checkpoint", "torch", "torchax", "numpy", "huggingface_hub")


def versions() -> dict[str, str]:
    found = {"vae-convert": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def report() -> str:
    """`vae-convert --version`: one package a line."""
    entries = versions()
    width = max(map(len, entries))
    return "\n".join(f"{name.ljust(width)}  {version}" for name, version in entries.items())
