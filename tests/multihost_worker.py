"""One process of the test's multi-process JAX job (tests/test_multihost.py): what a user's script runs on each host.
It joins the job, loads the converted output onto meshes that span the processes, decodes (also tiled), gathers the
results, and process 0 writes them to RESULTS (an .npz)."""

import os
import sys

import jax
import numpy as np

OUT, PORT, PROCESSES, RANK, RESULTS, CHANNELS = sys.argv[1:7]
jax.distributed.initialize(
    f"127.0.0.1:{PORT}",
    int(PROCESSES),
    int(RANK),
    initialization_timeout=60,
    heartbeat_timeout_seconds=10,
    shutdown_timeout_seconds=10,
)
from jax.sharding import Mesh  # noqa: E402

import converter  # noqa: E402

z = np.random.default_rng(0).standard_normal((2, 3, 4, 8, int(CHANNELS))).astype(np.float32)  # (B, T, H, W, C)
devices = np.array(jax.devices())  # process 0's first, then process 1's
meshes = {
    "1x8": Mesh(devices.reshape(1, 8), ("dp", "tp")),  # width split over every device of both processes
    "2x4": Mesh(devices.reshape(2, 4), ("dp", "tp")),  # batch split over the processes, width within each
}
results = {}
for name, mesh in meshes.items():
    model = converter.load(OUT, mesh=mesh)
    frames = z if name == "1x8" else z[:, :1]  # the causal cache carried across processes once: compiles are slow
    results[f"decode {name}"] = converter.gather(model.decode(frames, mesh=mesh))
# tiled, the batch split over the processes (one device each)
mesh = Mesh(devices.reshape(2, 4)[:, :1], ("dp", "tp"))
model = converter.load(OUT, mesh=mesh)
model.enable_tiling(
    tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24, tile_sample_stride_width=24
)
results["tiled decode 2x1"] = converter.gather(model.decode(z[:, :1, :3, :6], mesh=mesh))  # tiles 3x4 and 3x3
if jax.process_index() == 0:
    np.savez(RESULTS, **results)
jax.distributed.shutdown()
sys.stdout.flush()
os._exit(0)  # past a clean shutdown, the runtime's native teardown can hang (docs/multihost.md)
