"""Running a Flax VAE chunk by chunk, for every family: one jitted step per chunk shape with the causal cache
passed explicitly, on a mesh when given one, and tile by tile when tiling is on."""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from .conv import STEP_COMPILER_OPTIONS
from .protocol import keeps_cache
from .sharding import auto_axes, constrain_activations, replicate, shard_activations
from .tiling import run_framewise, run_tiled


# The model goes into the jitted step as it is: NNX modules are pytrees, which JAX flattens in a few milliseconds a
# call, where `nnx.split` walks the module graph several times longer and its graphdef, a static argument, is hashed
# anew on every call.
@functools.partial(jax.jit, static_argnums=(0, 1, 6), compiler_options=STEP_COMPILER_OPTIONS)
def step(part, mesh, model, x, cache, inputs, keep_cache):
    """One chunk through the encoder (then quant_conv) or the decoder (after post_quant_conv), with the part's extra
    inputs (a dict of arrays by keyword, {} for most families), and its cache, or None where no later chunk takes it
    (`keep_cache` False: XLA then leaves the cache out of the step); compiled once per (chunk shape, first chunk or
    not, keep_cache).
    The 1x1x1 quant convs act per pixel, so applying them per chunk is exact. On a mesh (its Auto view), the new cache
    is laid out as the activations are, and the convolutions see the mesh (models/common/conv.py exchanges their
    width halos)."""
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if mesh is not None else contextlib.nullcontext():
        if part == "decoder" and model.post_quant_conv is not None:
            x = model.post_quant_conv(x)
        x, cache = getattr(model, part)(x, cache, **inputs)
        if part == "encoder" and model.quant_conv is not None:
            x = model.quant_conv(x)
    return x, constrain_activations(cache, mesh) if keep_cache else None


def run_chunks(model: nnx.Module, part: str, x, bounds: list[tuple[int, int]] | None, mesh=None, inputs=None):
    """x (B, T, H, W, C) through `part` ("encoder" or "decoder") in chunks of frames [start, end), the cache carried
    from one to the next (bounds None: x is an image (B, H, W, C), run in one step), `inputs` (keyword arrays, such
    as a per-batch timestep) given to every chunk of every tile (or a function of the tile's input that returns
    them, for inputs drawn per tile such as noise maps); tile by tile when the model's tiling is on. With a mesh
    ("dp", "tp"), batch and width are split over it (models/common/sharding.py)."""
    mesh = auto_axes(mesh)
    placed, x = replicate(model, mesh), shard_activations(x, mesh)

    def run(x):
        outs, cache, given = [], None, inputs(x) if callable(inputs) else inputs or {}
        if bounds is None:  # an image: no frames, one step
            return _fitting(model, part, step, mesh, placed, x, None, given, False)[0]
        keep = keeps_cache(bounds)
        for start, end in bounds:
            out, cache = _fitting(model, part, step, mesh, placed, x[:, start:end], cache, given, keep)
            outs.append(out)
        return jnp.concatenate(outs, axis=1)

    return run_tiled(
        run,
        x,
        model.tile_plan(part),
        h_axis=x.ndim - 3,
        concat=jnp.concatenate,
        as_array=lambda values, like: jnp.asarray(values, like.dtype),
    )


def _fitting(model, part: str, step, *args):
    """`step(part, *args)`, where running out of memory says what to do about it: tiles, or smaller ones. Waited for,
    so that the failure is raised here, not where the caller first reads the result (the chunks run one after
    another anyway: each needs the cache of the one before)."""
    try:
        out = step(part, *args)
        # traced (the benchmark's compile-only rows, a user's jit): nothing to wait for, and JAX's wait on a tracer
        # walks the whole trace so far for a message, so a traced tiled decode grew with the square of its tiles
        if not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(out)):
            jax.block_until_ready(out)
        return out
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e) and "Out of memory" not in str(e):
            raise
        chunk = tuple(args[2].shape)
        advice = "smaller tiles (enable_tiling's tile_sample_min_*)" if model.tiling else "vae.enable_tiling()"
        raise MemoryError(
            f"the {part} step of a {chunk} chunk does not fit in memory ({str(e).splitlines()[0][:200]}); "
            f"decode or encode it in tiles: {advice}"
        ) from None


def run_image(model, part: str, x, mesh=None):
    """x (B, H, W, C) through `part` in one step (an image model: no frames, no cache), tile by tile when the model's
    tiling is on, batch and width split over a mesh."""
    return run_chunks(model, part, x, None, mesh)


def run_clip(model, part: str, x, out_frames: int, framewise: bool, mesh=None, inputs=None, drop_last=False):
    """x (B, T, H, W, C) through `part` whole (families with no causal cache), or, with `framewise` and more frames
    than one temporal tile, in diffusers' overlapping temporal tiles (the model's `tiling_class().frame_tiles`; later
    tiles drop their first output frame, their last with `drop_last`); spatial tiles inside as run_chunks makes them."""

    def run(clip):
        return run_chunks(model, part, clip, [(0, clip.shape[1])], mesh, inputs)

    tiles = (model.tiling or model.tiling_class()).frame_tiles(model.config, part)
    if not framewise or x.shape[1] < tiles[0]:
        return run(x)
    return run_framewise(
        run,
        x,
        tiles,
        out_frames,
        t_axis=1,
        concat=jnp.concatenate,
        as_array=lambda values, like: jnp.asarray(values, like.dtype),
        drop_last=drop_last,
    )
