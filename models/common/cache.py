"""The explicit causal cache, one convention for every model: a cached block takes `cache` (None on the first chunk)
and returns `(x, new_cache)`; a cache has the shape of the module tree, a dict keyed by child name, list entries by
their index ("0", "1", ...), as diffusers' CogVideoX keys its conv cache."""

from __future__ import annotations


def run_cached(layers, x, cache, *args):
    """Runs cached layers in order (each `layer(x, *args, cache=...)`); returns the output and their new caches."""
    cache = cache or {}
    new = {}
    for i, layer in enumerate(layers):
        x, new[str(i)] = layer(x, *args, cache=cache.get(str(i)))
    return x, new
