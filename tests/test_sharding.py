"""Decode and encode on a ("dp", "tp") mesh of 8 simulated CPU devices, width sharded over "tp": parameters are restored
straight onto the mesh, and the results equal the unsharded ones within 1e-5 (relative to the output's scale), on the
meshes each family's test data names: (1, 8) and (2, 4), made with Auto axes (`Mesh(devices, names)`) and with Explicit
ones (what `jax.make_mesh` gives by default); Wan's cases meet both shapes and both axis types, a family whose
layers split as Wan's do names one mesh. A batch that "dp" does not divide is one clear ValueError. The causal cache a
step returns is split over the mesh as the activations are."""

import json

import pytest

from tests.helpers import family_cases, family_params, report_on_8_devices, run_in_process, save_diffusers, small

pytestmark = pytest.mark.slow  # every case compiles a model on 8 simulated devices, twice

# 1e-5 relative to the output's scale (max(1, max |unsharded|)): CogVideoX decodes unclipped values up to ~7, where
# sharded convolutions summing in another order differ by 1.07e-5 (1.5e-6 relative). A sharding bug (a wrong halo, a
# misplaced shard) gives errors of order 1.
RTOL = 1e-5

SCRIPT = """
import json, sys
import jax, numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh
import converter
from converter.models.common import steps_flax

out, channels, frames, meshes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
rng = np.random.default_rng(0)
# (B, T, H, W, C), an image model's (B, H, W, C) (frames 0): latents of width 8 over tp <= 8; videos of width 64
# encode to width 8 (2 at LTX's 32x)
z = rng.standard_normal((2, 3, 4, 8, channels) if frames else (2, 4, 8, channels)).astype(np.float32)
x = rng.uniform(-1, 1, (2, frames, 32, 64, 3) if frames else (2, 32, 64, 3)).astype(np.float32)
plain = converter.load(out)
expected = {"decode": np.asarray(plain.decode(z)), "encode": np.asarray(plain.encode(x)[0])}
report = {"devices": len(jax.devices()), "scale": {k: float(np.abs(v).max()) for k, v in expected.items()}}
first_caches, jitted_step = [], steps_flax.step


def recording_step(part, mesh, model, chunk, cache, inputs, keep_cache):
    out, new_cache = jitted_step(part, mesh, model, chunk, cache, inputs, keep_cache)
    if cache is None and keep_cache:
        first_caches.append((part, mesh, new_cache))
    return out, new_cache


steps_flax.step = recording_step
for dp, tp, kind in meshes:
    shape = (dp, tp)
    if kind == "auto":
        mesh = Mesh(np.array(jax.devices()).reshape(shape), ("dp", "tp"))
    else:
        mesh = jax.make_mesh(shape, ("dp", "tp"))
    model = converter.load(out, mesh=mesh)
    params = jax.tree.leaves(nnx.state(model))
    got = {"decode": model.decode(z, mesh=mesh), "encode": model.encode(x, mesh=mesh)[0]}
    report[f"{shape} {kind}"] = {
        "axis_types": sorted({str(t) for t in mesh.axis_types}),
        "params_on_mesh": all(p.sharding.mesh == mesh for p in params),
        **{f"{k}_max_abs": float(np.abs(np.asarray(v) - expected[k]).max()) for k, v in got.items()},
        **{f"{k}_devices": len(v.sharding.device_set) for k, v in got.items()},
    }
report["replicated_cache"] = [  # a first chunk's caches on each mesh, split as the activations where they divide
    f"{part}{jax.tree_util.keystr(path)} on {dict(mesh.shape)}"
    for part, mesh, cache in first_caches
    for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
    if leaf.shape[0] % mesh.shape["dp"] == 0 and leaf.shape[3] % mesh.shape["tp"] == 0
    and leaf.sharding.is_fully_replicated
]
try:  # the last mesh has "dp" of 2
    model.decode(z[:1], mesh=mesh)
except ValueError as e:
    report["batch_of_one"] = str(e)
print(json.dumps(report))
"""


# Each family's small configs with the meshes it names (models/<family>/testing.py). The axis types are handled once
# for every family (steps_flax.run_chunks), the width halos per layer (models/common).
CASES = family_cases(lambda testing: testing.meshes)


@pytest.mark.parametrize("case", family_params(CASES))
def test_sharded_matches_unsharded(tmp_path, case):
    family, which, meshes = CASES[case]
    model, config = small(family, which)
    channels = family.validation_latent_shape(family.config_class.from_dict(config))[1]
    save_diffusers(family, tmp_path / "vae", config)
    run_in_process(
        model, "--source", tmp_path / "vae", "--to", "flax", "--out", tmp_path / "out", "--no-validate", check=True
    )
    # a short clip the encoder takes; 0 for an image model
    frames = 0 if not family.frame_axis else min(f for f in family.testing().parity_frames[1] if f > 1)
    report = report_on_8_devices(SCRIPT, tmp_path / "out", channels, frames, json.dumps(meshes))
    assert report["devices"] == 8
    assert "a batch of 1 does not split over the mesh's 'dp' axis of 2 devices" in report["batch_of_one"]
    assert report["replicated_cache"] == []
    assert len(report) == 4 + len(meshes)  # devices, scale, replicated_cache, batch_of_one, and each mesh
    for dp, tp, kind in meshes:
        shape = f"{(dp, tp)} {kind}"
        r = report[shape]
        assert r["axis_types"] == ["AxisType.Auto" if shape.endswith("auto") else "AxisType.Explicit"], r
        assert r["params_on_mesh"], shape
        assert r["decode_devices"] == r["encode_devices"] == 8, shape
        for step in ("decode", "encode"):
            assert r[f"{step}_max_abs"] <= RTOL * max(1.0, report["scale"][step]), (shape, step, r)
