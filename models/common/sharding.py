"""Placing the Flax models on a `jax.sharding.Mesh` with axes ("dp", "tp"): parameters replicated, videos and
latents (B, T, H, W, C) split by batch over "dp" and by width over "tp". jit propagates that layout through every
step (XLA exchanges the conv halos), so decode and encode run sharded with no change to the models."""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

ACTIVATIONS = P("dp", None, None, "tp", None)  # (B, T, H, W, C)
PARAMETERS = P()  # replicated


def shard_activations(x, mesh: Mesh | None):
    return x if mesh is None else jax.device_put(x, NamedSharding(mesh, ACTIVATIONS))


def replicate(tree, mesh: Mesh | None):
    return tree if mesh is None else jax.device_put(tree, NamedSharding(mesh, PARAMETERS))
