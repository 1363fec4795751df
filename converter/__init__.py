"""vae-convert: PyTorch VAE checkpoints (diffusers' or original release files) -> Flax NNX (Orbax) or torchax weights.

The installed package holds the converter and, beneath it, `converter.models` (the implementations) and
`converter.mappings` (the mapping files). `load`, `save` and `enable_compile_cache` import the rest on first use, so
that `import converter` stays light (none of them starts JAX's runtime: in a multi-process job the user calls
`jax.distributed.initialize` first).
"""

__version__ = "0.2.0"


def load(path, mesh=None):
    """A converted output directory -> a ready model, optionally restored onto a mesh (see converter.api)."""
    from converter.api import load as _load

    return _load(path, mesh=mesh)


def save(vae, path, fmt="orbax", force=False):
    """Writes a Flax model held in memory as a vae-convert output (see converter.export.save)."""
    from converter.export import save as _save

    return _save(vae, path, fmt=fmt, force=force)


def gather(tree):
    """Every array of `tree` (a decode's output, an encode's (mean, logvar)) whole, as numpy arrays, on every process
    of a multi-process job; a collective, so every process calls it (see converter.models.common.sharding)."""
    from converter.models.common.sharding import gather as _gather

    return _gather(tree)


def enable_compile_cache(directory=None) -> bool:
    """JAX's persistent compilation cache in `directory` or $VAE_CONVERT_COMPILE_CACHE (see converter.api)."""
    from converter.api import enable_compile_cache as _enable

    return _enable(directory)
