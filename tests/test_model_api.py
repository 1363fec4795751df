"""The Python API: `converter.load` takes relative paths, uses a Flax output's mapped files in place (Orbax and
safetensors), gives each load a model of its own, still loads the OCDBT checkpoints earlier versions wrote, and
fails on a damaged output with one clear error; Orbax's own loader reads the output as docs/usage.md says; the models
check their inputs with one clear ValueError, and the README's torchax snippet works as written for a bfloat16
output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import converter
from converter import orbax_io
from converter.errors import InputError
from converter.torchax_runtime import compile_model, to_jax_tensor
from tests.helpers import run_in_process


@pytest.fixture(scope="module")
def outputs(wan_small, tmp_path_factory):
    source, _ = wan_small
    root = tmp_path_factory.mktemp("api")
    outputs = {
        "flax": ("--to", "flax"),
        "flax-st": ("--to", "flax", "--format", "safetensors"),
        "tx": ("--to", "torchax", "--dtype", "bfloat16"),
    }
    for folder, args in outputs.items():
        run_in_process("wan2.1", "--source", source, *args, "--out", root / folder, "--no-validate", check=True)
    # what earlier versions wrote: Orbax's default layout, one OCDBT store of zarr3 arrays, saved by Orbax itself
    shutil.copytree(root / "flax", root / "flax-ocdbt")
    shutil.rmtree(root / "flax-ocdbt" / "state")
    _orbax_save(root / "flax-ocdbt" / "state", nnx.to_pure_dict(nnx.state(converter.load(root / "flax"))))
    return root


def _orbax_save(path, tree, **saving):
    """`tree` saved by Orbax's own v1 API, as the README's loader reads it (`saving`: Orbax's array options)."""
    import orbax.checkpoint.experimental.v1 as ocp

    context = ocp.Context()
    for option, value in saving.items():
        setattr(context.array.saving, option, value)
    with context:
        ocp.save_pytree(path, jax.tree.map(np.asarray, tree))


LATENT = np.linspace(-1, 1, 3 * 2 * 2 * 4, dtype=np.float32).reshape(1, 3, 2, 2, 4)


def test_load_takes_a_relative_path_from_any_working_directory(outputs, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = os.getcwd()
    os.chdir(elsewhere)
    try:
        vae = converter.load(os.path.relpath(outputs / "flax", elsewhere))
    finally:
        os.chdir(before)
    assert vae.decode(np.zeros((1, 1, 2, 2, 4), np.float32)).shape == (1, 1, 16, 16, 3)


MAPPED_FROM = {"flax": orbax_io.MAPPED_FROM_BYTES, "flax-st": 0}  # the Orbax output's small leaves are read


@pytest.mark.parametrize("name", list(MAPPED_FROM))
def test_flax_output_is_used_in_place(outputs, name):
    """Loading maps the weights' files and their bytes become the model's parameters, read on first use, not copied:
    the Orbax output holds each leaf's bytes in a file of their own (the small ones are read), the safetensors writer
    starts each tensor whose size is a multiple of 64 bytes 64-byte aligned, as JAX on CPU needs to take a buffer as
    it is (the others, a few small ones, are copied)."""
    vae = converter.load(outputs / name)
    with open("/proc/self/maps") as maps:
        spans = [
            [int(address, 16) for address in line.split()[0].split("-")]
            for line in maps
            if line.split()[-1].startswith(f"{outputs / name}/")
        ]
    leaves = jax.tree.leaves(nnx.state(vae))
    in_place = [any(start <= leaf.unsafe_buffer_pointer() < end for start, end in spans) for leaf in leaves]
    assert spans and len(leaves) > 50
    large = [(mapped, leaf) for mapped, leaf in zip(in_place, leaves) if leaf.nbytes >= MAPPED_FROM[name]]
    assert all(mapped for mapped, leaf in large if leaf.nbytes % 64 == 0)
    assert sum(leaf.nbytes for mapped, leaf in large if mapped) > 0.95 * sum(leaf.nbytes for _, leaf in large)
    assert vae.decode(np.zeros((1, 1, 2, 2, 4), np.float32)).shape == (1, 1, 16, 16, 3)


@pytest.mark.parametrize("collecting", [True, False])
def test_load_leaves_the_garbage_collector_as_it_found_it(outputs, tmp_path, collecting):
    """A load pauses Python's collector (its own short-lived objects would set off collections), also when it
    fails, and gives it back as it was."""
    import gc

    broken = tmp_path / "broken"
    broken.mkdir()
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        converter.load(outputs / "flax")
        assert gc.isenabled() == collecting
        with pytest.raises(InputError):
            converter.load(broken)
        assert gc.isenabled() == collecting
    finally:
        (gc.enable if was else gc.disable)()


def test_flax_output_without_its_state_is_one_clear_error(outputs, tmp_path):
    shutil.copytree(outputs / "flax", tmp_path / "broken")
    shutil.rmtree(tmp_path / "broken" / "state")
    with pytest.raises(InputError, match="state is missing"):
        converter.load(tmp_path / "broken")


@pytest.mark.parametrize(
    "layout, damage",
    [
        ("flax", "largest data file truncated"),
        ("flax", "smallest data file truncated"),  # small ones are read, not mapped
        ("flax", "largest data file removed"),
        ("flax", "its .zarray says compressed"),
        ("flax-ocdbt", "largest data file truncated"),
        ("flax-ocdbt", "largest data file removed"),
        ("flax-ocdbt", "manifest removed"),
    ],
)
def test_damaged_flax_state_is_one_clear_error(outputs, tmp_path, layout, damage):
    """A damaged Orbax checkpoint, as this version or earlier ones wrote it, fails the load with one InputError
    naming it, whichever of its files is hit."""
    shutil.copytree(outputs / layout, tmp_path / "broken")
    item = tmp_path / "broken" / "state" / "state"
    files = [p for p in item.rglob("*") if p.is_file() and not p.name.startswith(".")]
    data = (min if damage.startswith("smallest") else max)(files, key=lambda p: p.stat().st_size)
    if damage.endswith("truncated"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    elif damage == "largest data file removed":
        data.unlink()
    elif damage == "manifest removed":
        (item / "manifest.ocdbt").unlink()
    else:
        meta = json.loads((data.parent / ".zarray").read_text())
        (data.parent / ".zarray").write_text(json.dumps({**meta, "compressor": {"id": "zstd", "level": 1}}))
    with pytest.raises(InputError, match=r"state: not a readable Orbax checkpoint \(.+\)$"):
        converter.load(tmp_path / "broken")


def test_an_ocdbt_output_of_earlier_versions_loads_the_same(outputs):
    assert (outputs / "flax-ocdbt" / "state" / "state" / "manifest.ocdbt").exists()
    earlier, now = converter.load(outputs / "flax-ocdbt"), converter.load(outputs / "flax")
    np.testing.assert_array_equal(earlier.decode(LATENT), now.decode(LATENT))


def test_a_model_saves_over_the_output_it_was_loaded_from(outputs, tmp_path):
    """Its parameters are that output's mapped files: saving over the folder (force) writes a new one beside it and
    swaps them, so the model in memory and the output written keep the same weights."""
    shutil.copytree(outputs / "flax", tmp_path / "ckpt")
    vae = converter.load(tmp_path / "ckpt")
    before = np.asarray(vae.decode(LATENT))
    converter.save(vae, tmp_path / "ckpt", force=True)
    np.testing.assert_array_equal(np.asarray(vae.decode(LATENT)), before)
    np.testing.assert_array_equal(np.asarray(converter.load(tmp_path / "ckpt").decode(LATENT)), before)


def test_each_load_is_a_model_of_its_own(outputs, tmp_path):
    """A load fills the abstract model in place, one made afresh for each load: loading another output of the same
    config leaves the first model as it was."""
    shutil.copytree(outputs / "flax", tmp_path / "other")
    kernel = tmp_path / "other" / "state" / "state" / "decoder.conv_out.kernel" / "0.0.0.0.0"
    kernel.write_bytes(np.full(kernel.stat().st_size // 4, 0.5, np.float32).tobytes())
    first = converter.load(outputs / "flax")
    before = np.asarray(first.decode(LATENT))
    other = converter.load(tmp_path / "other")
    np.testing.assert_array_equal(np.asarray(first.decode(LATENT)), before)
    assert not np.allclose(np.asarray(other.decode(LATENT)), before)


def test_orbax_reads_the_flax_output_as_the_readme_says(outputs, caplog):
    """Without this tool, Orbax's own loader reads the state, the same values, and warns of nothing."""
    import orbax.checkpoint.experimental.v1 as ocp

    state = nnx.to_pure_dict(nnx.state(converter.load(outputs / "flax")))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)
    with caplog.at_level("WARNING"):
        loaded = ocp.load(outputs / "flax" / "state", abstract, checkpointable_name="state")
    assert not caplog.records
    assert jax.tree.structure(loaded) == jax.tree.structure(state)
    for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(state)):
        np.testing.assert_array_equal(got, want)


def test_the_flax_output_is_laid_out_as_orbax_lays_it_out(outputs, tmp_path):
    """The writer writes Orbax's layout itself (Orbax's saves cost more than the bytes): the same files, each
    leaf's .zarray and bytes the same, the metadata the same but for the times, the folder it was committed in and
    the custom metadata (the manifest)."""
    state = nnx.to_pure_dict(nnx.state(converter.load(outputs / "flax")))
    _orbax_save(tmp_path / "state", state, **orbax_io.ORBAX_SAVING)
    ours, orbax = outputs / "flax" / "state", tmp_path / "state"
    note = "commit_success.txt"  # a note of the commit, which Orbax writes from some release on and reads never

    def files(folder):
        return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {note}

    assert files(ours) == files(orbax) and (ours / note).exists()
    metadata = {"_CHECKPOINT_METADATA", "state/_METADATA"}
    for name in sorted(files(orbax) - metadata):
        assert (ours / name).read_bytes() == (orbax / name).read_bytes(), name
    assert json.loads((ours / "state/_METADATA").read_text()) == json.loads((orbax / "state/_METADATA").read_text())
    unsaid = ("init_timestamp_nsecs", "commit_timestamp_nsecs", "custom_metadata")
    checkpoints = [json.loads((folder / "_CHECKPOINT_METADATA").read_text()) for folder in (ours, orbax)]
    assert [{k: v for k, v in c.items() if k not in unsaid} for c in checkpoints] == [
        {k: v for k, v in checkpoints[1].items() if k not in unsaid}
    ] * 2


@pytest.mark.slow
def test_readme_torchax_snippet_works_for_a_bfloat16_output(outputs):
    vae = compile_model(converter.load(outputs / "tx"))
    latents = np.random.default_rng(0).standard_normal((1, 4, 2, 2, 2)).astype(np.float32)
    with vae.torchax_env:
        frames = vae.decode(to_jax_tensor(vae, latents)).sample
        from_jax = vae.decode(to_jax_tensor(vae, jnp.asarray(latents))).sample
    assert frames.dtype == torch.bfloat16 and tuple(frames.shape) == (1, 3, 5, 16, 16)
    assert np.array_equal(np.asarray(frames.jax().astype(jnp.float32)), np.asarray(from_jax.jax().astype(jnp.float32)))


def test_compile_model_leaves_the_model_as_it_is(outputs):
    """The wrapper runs on its own copy of the weights, 3D kernels stored (kT, kH, kW, C, O): the PyTorch model
    stays on CPU with its weights unchanged, usable as before."""
    model = converter.load(outputs / "tx")
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    vae = compile_model(model)
    with vae.torchax_env:
        vae.decode(to_jax_tensor(vae, np.ones((1, 4, 2, 2, 2), np.float32)))
    after = model.state_dict()
    assert all(after[name].device.type == "cpu" and torch.equal(after[name], before[name]) for name in before)
    kernels = {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, torch.nn.Conv3d)}
    assert kernels and all(
        vae.params[name].shape == (*m.kernel_size, m.in_channels // m.groups, m.out_channels)
        for name, m in kernels.items()
    )


TOO_BIG = """
import resource, sys
import numpy as np
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import converter
vae = converter.load(sys.argv[1])
try:
    vae.decode(np.zeros((1, 1, 2048, 2048, 4), np.float32))
except MemoryError as e:
    print("MemoryError:", e)
"""


def test_a_decode_that_cannot_fit_says_to_tile(outputs):
    """Out of memory (here a 4 GB address-space limit, for a 16384x16384 frame) is a MemoryError that says to tile,
    raised by decode itself, not later where the result is first read."""
    result = subprocess.run([sys.executable, "-c", TOO_BIG, str(outputs / "flax")], capture_output=True, text=True)
    assert "MemoryError: the decoder step of a (1, 1, 2048, 2048, 4) chunk does not fit in memory" in result.stdout, (
        result.stderr[-2000:]
    )
    assert "vae.enable_tiling()" in result.stdout


def test_a_step_returns_its_cache_only_where_a_later_chunk_takes_it(outputs, monkeypatch):
    """A one-frame decode (an image's one chunk) returns no cache; of three chunks, each returns its cache, the last
    too (the second's step, rather than another compiled): in both frameworks' runners."""
    from converter.models.common import steps_flax

    flax_steps, jitted = [], steps_flax.step

    def recording(part, mesh, model, x, cache, inputs, keep_cache):
        out, new_cache = jitted(part, mesh, model, x, cache, inputs, keep_cache)
        flax_steps.append((keep_cache, new_cache is None))
        return out, new_cache

    monkeypatch.setattr(steps_flax, "step", recording)
    vae = converter.load(outputs / "flax")
    vae.decode(LATENT[:, :1])
    vae.decode(LATENT)
    assert flax_steps == [(False, True), (True, False), (True, False), (True, False)]

    model, torch_steps = converter.load(outputs / "tx"), []
    chunk_step = model.chunk_step

    def recording_chunk_step(part, x, cache, inputs, keep_cache=True):
        out, new_cache = chunk_step(part, x, cache, inputs, keep_cache)
        torch_steps.append((keep_cache, new_cache is None))
        return out, new_cache

    monkeypatch.setattr(model, "chunk_step", recording_chunk_step)
    latent = torch.from_numpy(LATENT).permute(0, 4, 1, 2, 3).to(torch.bfloat16)
    model.decode(latent[:, :, :1])
    model.decode(latent)
    assert torch_steps == flax_steps
