"""Placing the Flax models on a `jax.sharding.Mesh` with axes ("dp", "tp"): parameters replicated, videos and
latents (B, T, H, W, C), images (B, H, W, C), split by batch over "dp" and by width over "tp". jit propagates that
layout through every step, so decode and encode run sharded with no change to the models; the CPU convolution
exchanges each layer's halo columns itself (models/common/conv.py).

Meshes made by `jax.make_mesh` have Explicit axes by default, under which every reshape of a sharded dimension must
state its output sharding; the models leave the layout to XLA's propagation instead, so they run on the Auto view of
the same mesh (the same devices and names: arrays are relabelled, not copied), and their results come back on it."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

ACTIVATIONS = P("dp", None, None, "tp", None)  # (B, T, H, W, C)
IMAGE_ACTIVATIONS = P("dp", None, "tp", None)  # (B, H, W, C)
TOKENS = P("dp", "tp", None)  # a ViT's (B, N, C): batch over "dp", tokens over "tp"
PARAMETERS = P()  # replicated


def activation_spec(ndim: int) -> P:
    """How activations split over the mesh: a video's (B, T, H, W, C), or an image's (B, H, W, C)."""
    return ACTIVATIONS if ndim == 5 else IMAGE_ACTIVATIONS


def auto_axes(mesh: Mesh | None) -> Mesh | None:
    if mesh is None or all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def shard_activations(x, mesh: Mesh | None):
    if mesh is None:
        return x
    for axis, (name, size) in ((0, ("dp", "batch")), (x.ndim - 2, ("tp", "width"))):
        devices = mesh.shape[name]
        if x.shape[axis] % devices:
            raise ValueError(
                f"a {size} of {x.shape[axis]} does not split over the mesh's {name!r} axis of {devices} devices "
                f"(mesh {dict(mesh.shape)}): use a {size} that is a multiple of {devices}, or a mesh with "
                f"{name}={_divisor(x.shape[axis], devices)}"
            )
    return place(x, NamedSharding(mesh, activation_spec(x.ndim)))


def _divisor(n: int, devices: int) -> int:
    """The largest axis size up to `devices` that splits n."""
    return max(d for d in range(1, devices + 1) if n % d == 0)


def constrain_activations(tree, mesh: Mesh | None):
    """Lays out each (B, T, H, W, C) leaf of tree as the activations are, where its batch and width split over the
    mesh: a value made of constants inside a step (a first chunk's zero history) would otherwise be replicated, a
    whole copy on every device."""
    if mesh is None:
        return tree

    def constrain(x):
        if x.ndim == 5 and x.shape[0] % mesh.shape["dp"] == 0 and x.shape[3] % mesh.shape["tp"] == 0:
            return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, ACTIVATIONS))
        return x

    return jax.tree.map(constrain, tree)


def traced_mesh():
    """The ("dp", "tp") mesh of the step being traced (its abstract mesh), or None outside one."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or "tp" not in mesh.axis_names else mesh


def constrain_tokens(x):
    """x (B, N, C) tokens split over the mesh of the step being traced as TOKENS says, each device computing the
    per-token layers for its share (models/common/attention.py `query_split_attention` splits the attention so);
    x as it is without a mesh."""
    return x if traced_mesh() is None else jax.lax.with_sharding_constraint(x, TOKENS)


def whole_where_width_uneven(x, width: int):
    """x replicated, inside a step traced on a mesh, where a width of `width` would not split evenly over "tp": XLA's
    partitioner regroups an unevenly split width wrongly in LTX's space-to-depth (from 17 frames on, on every mesh
    whose "tp" leaves a level's width uneven), so such a regrouping runs whole on each device."""
    mesh = traced_mesh()
    if mesh is None or width % mesh.shape["tp"] == 0:
        return x
    return jax.lax.with_sharding_constraint(x, PARAMETERS)


def replicate(tree, mesh: Mesh | None):
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, PARAMETERS)
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)
    return jax.tree.map(lambda leaf: place(leaf, sharding), tree)


def place(x, sharding):
    """`x` (host data or an array) laid out on `sharding`. Where the sharding spans several processes (a
    multi-controller job: one process per host), each process makes only its own devices' shards from its copy:
    jax.device_put of host data would first gather the whole of it from every process to check that the copies
    agree. An array is moved as jax.device_put moves it (one already laid out so is used as it is)."""
    if sharding.is_fully_addressable or isinstance(x, jax.Array):  # in one process, or already an array (traced)
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place_all(arrays: list, sharding) -> list:
    """`place` for many arrays; in one process a single device_put (on CPU, 64-byte-aligned buffers are used in
    place)."""
    if sharding is None or sharding.is_fully_addressable:
        return jax.device_put(arrays, sharding)
    return [place(x, sharding) for x in arrays]


def gather(tree):
    """Every array of `tree` whole, as numpy, on every process: an output spread over the devices of several
    processes cannot be read with np.asarray (each process holds only its own shards); this gathers them
    (multihost_utils.process_allgather, a collective: every process must call it)."""
    from jax.experimental import multihost_utils

    def whole(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(whole, tree)
