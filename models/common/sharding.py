"""Placing the Flax models on a `jax.sharding.Mesh` with axes ("dp", "tp"): parameters replicated, videos and
latents (B, T, H, W, C) split by batch over "dp" and by width over "tp". jit propagates that layout through every
step, so decode and encode run sharded with no change to the models; the CPU convolution exchanges each layer's
halo columns itself (models/common/conv.py).

Meshes made by `jax.make_mesh` have Explicit axes by default, under which every reshape of a sharded dimension must
state its output sharding; the models leave the layout to XLA's propagation instead, so they run on the Auto view of
the same mesh (the same devices and names: arrays are relabelled, not copied), and their results come back on it."""

from __future__ import annotations

import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

ACTIVATIONS = P("dp", None, None, "tp", None)  # (B, T, H, W, C)
PARAMETERS = P()  # replicated


def auto_axes(mesh: Mesh | None) -> Mesh | None:
    if mesh is None or all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def shard_activations(x, mesh: Mesh | None):
    if mesh is None:
        return x
    for axis, (name, size) in ((0, ("dp", "batch")), (3, ("tp", "width"))):
        devices = mesh.shape[name]
        if x.shape[axis] % devices:
            raise ValueError(
                f"a {size} of {x.shape[axis]} does not split over the mesh's {name!r} axis of {devices} devices "
                f"(mesh {dict(mesh.shape)}): use a {size} that is a multiple of {devices}, or a mesh with "
                f"{name}={_divisor(x.shape[axis], devices)}"
            )
    return jax.device_put(x, NamedSharding(mesh, ACTIVATIONS))


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


def replicate(tree, mesh: Mesh | None):
    return tree if mesh is None else jax.device_put(tree, NamedSharding(mesh, PARAMETERS))
