"""The way back: diffusers -> flax -> diffusers is bit-exact; a Flax model changed as a fine-tune would change it,
saved with `converter.save` and exported, decodes and encodes in diffusers like the Flax model; dtypes; bad input
gets one line and leaves nothing."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import converter
from converter.registry import FAMILIES
from tests.helpers import (
    fails,
    family_cases,
    family_params,
    first_family_only,
    manifest,
    run_cli,
    run_in_process,
    runner,
    save_diffusers,
    small,
)

WEIGHTS = "diffusion_pytorch_model.safetensors"
ATOL = 1e-4
# the small configs each family names for it (models/<family>/testing.py)
CASES = family_cases(lambda testing: {which: which for which in testing.export})


@pytest.fixture(scope="module", params=family_params(CASES, first_family_only))
def diffusers_source(request, tmp_path_factory):
    family, which, _ = CASES[request.param]
    name, config = small(family, which)
    path = tmp_path_factory.mktemp(request.param) / "vae"
    model = save_diffusers(family, path, config)
    return name, path, model


@pytest.mark.parametrize("fmt", ["orbax", "safetensors"])
def test_round_trip_is_bit_exact(diffusers_source, tmp_path, fmt):
    name, source, _ = diffusers_source
    # the rules both ways, not the process: in this one (test_fine_tuned_model... runs the CLI as a user would)
    convert = (name, "--source", source, "--to", "flax", "--format", fmt, "--out", tmp_path / "flax", "--no-validate")
    run_in_process(*convert, check=True)
    run_in_process("export", tmp_path / "flax", "--out", tmp_path / "back", "--no-validate", check=True)
    original, back = load_file(source / WEIGHTS), load_file(tmp_path / "back" / WEIGHTS)
    assert set(back) == set(original)
    for key, tensor in original.items():
        assert back[key].dtype == tensor.dtype and back[key].shape == tensor.shape, key
        assert back[key].tobytes() == tensor.tobytes(), key
    with safe_open(tmp_path / "back" / WEIGHTS, "np") as f:
        provenance = json.loads(f.metadata()["vae_convert"])
    assert provenance["source"]["origin"] == str(tmp_path / "flax")
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == json.loads(
        (tmp_path / "flax" / "config.json").read_text()
    )


@pytest.mark.slow
def test_fine_tuned_model_exports_and_runs_in_diffusers(tmp_path):
    """Every parameter moved, as training moves them; saved from memory, exported, read by diffusers. Wan 2.2's
    layout (the other cases' rules are proven bit-exact by the round trip)."""
    import diffusers

    name, config = small(FAMILIES["wan"], "wan2.2-layout")
    reference = save_diffusers(FAMILIES["wan"], tmp_path / "vae", config)
    run_cli(name, "--source", tmp_path / "vae", "--to", "flax", "--out", tmp_path / "flax", "--no-validate")
    vae = converter.load(tmp_path / "flax")
    state = nnx.state(vae)
    leaves, treedef = jax.tree.flatten(state)
    rng = np.random.default_rng(0)  # numpy, not jax.random: one eager jax.random call per leaf shape compiles each
    moved = [leaf + 0.02 * rng.standard_normal(leaf.shape, np.float32) for leaf in leaves]
    nnx.update(vae, jax.tree.unflatten(treedef, moved))
    converter.save(vae, tmp_path / "tuned")
    assert manifest(tmp_path / "tuned")["source"]["saved_from"] == "memory"

    result = run_cli("export", tmp_path / "tuned", "--out", tmp_path / "back")
    assert "validation 3/3 ✓" in result.stdout
    assert manifest(tmp_path / "back")["validation"]["preview"]["file"] == "validation.png"
    assert (tmp_path / "back" / "validation.png").stat().st_size > 0
    exported = type(reference).from_pretrained(tmp_path / "back").eval()
    assert isinstance(exported, getattr(diffusers, reference.__class__.__name__))
    flax_runner = runner("flax", vae)
    config = exported.config
    channels = config.get("z_dim") or config.get("latent_channels")
    z = torch.randn(1, channels, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    x = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        decoded = exported.decode(z).sample.numpy()
        mean = exported.encode(x).latent_dist.mean.numpy()
    assert np.abs(flax_runner.decode(z.numpy()) - decoded).max() <= ATOL
    assert np.abs(flax_runner.encode(x.numpy())[0] - mean).max() <= ATOL
    # and the fine-tune is really in there: the original weights decode otherwise
    with torch.no_grad():
        assert np.abs(reference.decode(z).sample.numpy() - decoded).max() > 100 * ATOL


@pytest.mark.slow
def test_bfloat16_output_exports_as_bfloat16_or_float32(wan_small, tmp_path):
    source, _ = wan_small
    run_cli(
        "wan2.1", "--source", source, "--to", "flax", "--dtype", "bfloat16", "--out", tmp_path / "flax", "--no-validate"
    )
    run_cli("export", tmp_path / "flax", "--out", tmp_path / "bf16", "--no-validate")  # the bits are compared
    run_cli("export", tmp_path / "flax", "--out", tmp_path / "fp32", "--dtype", "float32", "--no-validate")
    original = {k: torch.from_numpy(v) for k, v in load_file(source / WEIGHTS).items()}
    with safe_open(tmp_path / "bf16" / WEIGHTS, "pt") as bf16, safe_open(tmp_path / "fp32" / WEIGHTS, "pt") as fp32:
        for key, tensor in original.items():
            rounded = tensor.to(torch.bfloat16)
            assert torch.equal(bf16.get_tensor(key), rounded), key
            assert fp32.get_tensor(key).dtype == torch.float32 and torch.equal(fp32.get_tensor(key), rounded.float())
    assert manifest(tmp_path / "bf16")["dtype"] == "bfloat16" and manifest(tmp_path / "fp32")["dtype"] == "float32"


def test_either_target_exports_bit_exact_and_to_a_lower_dtype_validated(wan_small_outputs, tmp_path):
    """Export runs any output's rules backwards, the torchax output's too (its keys are diffusers' already); to a
    lower dtype, validation compares with the output's model on weights rounded to it, as a conversion compares
    (each target to one of the two: the rounding is one piece of code)."""
    lower = {"flax": "bfloat16", "torchax": "float16"}
    for target, folder in wan_small_outputs.items():
        run_in_process("export", folder, "--out", tmp_path / target, "--no-validate", check=True)
        flax_back = load_file(tmp_path / target / WEIGHTS)
        if target == "torchax":
            original = load_file(folder / WEIGHTS)
            assert flax_back.keys() == original.keys()
            assert all(flax_back[k].tobytes() == v.tobytes() for k, v in original.items())
        out = tmp_path / f"{target}-{lower[target]}"
        run_in_process("export", folder, "--out", out, "--dtype", lower[target], check=True)
        assert manifest(out)["validation"]["ok"] and manifest(out)["dtype"] == lower[target]


def _flax_safetensors_output(source, folder):
    run_cli("wan2.1", "--source", source, "--to", "flax", "--format", "safetensors", "--out", folder, "--no-validate")
    return folder


def _edit_leaves(folder, edit):
    path = folder / "flax_model.safetensors"
    leaves = load_file(path)
    edit(leaves)
    save_file(leaves, path)


def test_bad_input_gets_one_line_and_leaves_nothing(wan_small, tmp_path):
    source, _ = wan_small
    out = tmp_path / "out"
    fails(["export", source, "--out", out], 3, "not a vae-convert output", out=out)

    other_family = _flax_safetensors_output(source, tmp_path / "family")
    record = manifest(other_family)
    (other_family / "vae_convert.json").write_text(json.dumps({**record, "family": "cogvideox"}))
    fails(["export", other_family, "--out", out], 3, "config.json is for AutoencoderKLWan", "family cogvideox", out=out)

    missing = _flax_safetensors_output(source, tmp_path / "missing")
    _edit_leaves(missing, lambda leaves: leaves.pop("decoder.conv_out.bias"))
    fails(["export", missing, "--out", out], 3, "1 leaf(s) missing", "decoder.conv_out.bias", out=out)

    extra = _flax_safetensors_output(source, tmp_path / "extra")
    _edit_leaves(extra, lambda leaves: leaves.update({"decoder.extra.kernel": np.zeros(3, np.float32)}))
    fails(["export", extra, "--out", out], 3, "1 unexpected", "decoder.extra.kernel", out=out)
