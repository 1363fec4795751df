"""The real Wan 2.1 VAE size (diffusers' default config, random weights saved by diffusers): both targets convert
with every key accounted for, and the validation decode/encode passes."""
from __future__ import annotations

import json

import pytest

from tests.conftest import manifest, run_cli, save_diffusers_wan


@pytest.fixture(scope="module")
def wan_full(tmp_path_factory):
    path = tmp_path_factory.mktemp("wan_full") / "vae"
    model = save_diffusers_wan(path, {})
    return path, model


@pytest.mark.parametrize("target", ["flax", "torchax"])
def test_full_size_converts_and_validates(wan_full, tmp_path, target):
    source, model = wan_full
    out = tmp_path / target
    result = run_cli("wan2.1", "--source", source, "--to", target, "--out", out)
    info = manifest(out)
    checks = info["validation"]["checks"]
    assert {c["output"] for c in checks} == {"decode", "encode.mean", "encode.logvar"}
    assert all(c["ok"] and c["max_abs"] <= c["tol"] for c in checks)
    state = model.state_dict()
    parameters = sum(v.numel() for v in state.values())
    assert f"{len(state)} tensors, {parameters / 1e6:.1f}M parameters" in result.stdout
    assert info["source"]["sha256"] and info["dtype"] == "float32"
    assert json.loads((out / "config.json").read_text())["_class_name"] == "AutoencoderKLWan"


def test_torchax_output_reads_in_diffusers(wan_full, tmp_path):
    """What --to torchax writes is diffusers' own format: AutoencoderKLWan.from_pretrained reads it, exactly."""
    import torch
    from diffusers import AutoencoderKLWan

    source, model = wan_full
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate",
            "--dtype", "bfloat16")
    reloaded = AutoencoderKLWan.from_pretrained(tmp_path / "out", torch_dtype=torch.bfloat16)
    for key, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor.to(torch.bfloat16)), key
