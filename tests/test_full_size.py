"""Each family at its real size (diffusers' default config, random weights saved by diffusers): both targets convert
with every key accounted for and the validation decode/encode passes; the torchax output reads back in diffusers."""

from __future__ import annotations

import json

import pytest
import torch

from converter.registry import FAMILIES
from tests.helpers import manifest, run_cli, save_diffusers

# Each family at its default (real) size, under its first model name.
MODELS = {family.models[0].name: family for family in FAMILIES.values()}


@pytest.fixture(scope="module", params=list(MODELS))
def full_size(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "vae"
    return request.param, path, save_diffusers(MODELS[request.param], path, {})


@pytest.mark.parametrize("target", ["flax", "torchax"])
def test_full_size_converts_and_validates(full_size, tmp_path, target):
    model_name, source, model = full_size
    out = tmp_path / target
    result = run_cli(model_name, "--source", source, "--to", target, "--out", out)
    info = manifest(out)
    checks = info["validation"]["checks"]
    assert {c["output"] for c in checks} == {"decode", "encode.mean", "encode.logvar"}
    assert all(c["ok"] and c["max_abs"] <= c["tol"] for c in checks)
    state = model.state_dict()
    parameters = sum(v.numel() for v in state.values())
    assert f"{len(state)} tensors, {parameters / 1e6:.1f}M parameters" in result.stdout
    assert info["source"]["sha256"] and info["dtype"] == "float32"
    assert json.loads((out / "config.json").read_text())["_class_name"] == MODELS[model_name].class_name


def test_torchax_output_reads_in_diffusers(full_size, tmp_path):
    """What --to torchax writes is diffusers' own format: from_pretrained reads it, exactly."""
    import diffusers

    model_name, source, model = full_size
    run_cli(
        model_name,
        "--source",
        source,
        "--to",
        "torchax",
        "--out",
        tmp_path / "out",
        "--no-validate",
        "--dtype",
        "bfloat16",
    )
    reloaded = getattr(diffusers, MODELS[model_name].class_name).from_pretrained(
        tmp_path / "out", torch_dtype=torch.bfloat16
    )
    reloaded_state = reloaded.state_dict()
    for key, tensor in model.state_dict().items():
        assert torch.equal(reloaded_state[key], tensor.to(torch.bfloat16)), key
