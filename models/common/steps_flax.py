"""Running a Flax VAE chunk by chunk, shared by both families: one jitted step per chunk shape with the causal cache
passed explicitly, on a mesh when given one, and tile by tile when tiling is on."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from .conv import STEP_COMPILER_OPTIONS
from .sharding import auto_axes, constrain_activations, replicate, shard_activations
from .tiling import run_tiled


# Split once before the loop and merge inside a plain `jax.jit`, as the Flax NNX performance guide recommends
# (flax docs_nnx/guides/performance.md): `nnx.jit` would re-split the model on every call.
@functools.partial(jax.jit, static_argnums=(0, 1, 2), compiler_options=STEP_COMPILER_OPTIONS)
def step(graphdef, part, mesh, state, x, cache):
    """One chunk through the encoder (then quant_conv) or the decoder (after post_quant_conv); compiled once per
    (chunk shape, first chunk or not). The 1x1x1 quant convs act per pixel, so applying them per chunk is exact.
    On a mesh (its Auto view), the new cache is laid out as the activations are."""
    model = nnx.merge(graphdef, state)
    if part == "decoder" and model.post_quant_conv is not None:
        x = model.post_quant_conv(x)
    x, cache = getattr(model, part)(x, cache)
    if part == "encoder" and model.quant_conv is not None:
        x = model.quant_conv(x)
    return x, constrain_activations(cache, mesh)


def run_chunks(model: nnx.Module, part: str, x, bounds: list[tuple[int, int]], mesh=None):
    """x (B, T, H, W, C) through `part` ("encoder" or "decoder") in chunks of frames [start, end), the cache carried
    from one to the next; tile by tile when the model's tiling is on. With a mesh ("dp", "tp"), batch and width are
    split over it (models/common/sharding.py)."""
    graphdef, state = nnx.split(model)
    mesh = auto_axes(mesh)
    state, x = replicate(state, mesh), shard_activations(x, mesh)

    def run(x):
        outs, cache = [], None
        for start, end in bounds:
            out, cache = step(graphdef, part, mesh, state, x[:, start:end], cache)
            outs.append(out)
        return jnp.concatenate(outs, axis=1)

    return run_tiled(
        run,
        x,
        model.tile_plan(part),
        h_axis=2,
        concat=jnp.concatenate,
        as_array=lambda values, like: jnp.asarray(values, like.dtype),
    )
