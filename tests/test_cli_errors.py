"""Bad input gets one clear line on stderr, its own exit code, and nothing at --out (no temporary leftovers)."""
from __future__ import annotations

import json
import shutil

import pytest

from converter.errors import InputError, OutputError
from tests.conftest import earlier_output, edited_copy, manifest, run_cli

WEIGHTS = "diffusion_pytorch_model.safetensors"


def _variant(wan_small, tmp_path, edit):
    source, _ = wan_small
    return edited_copy(source, tmp_path / "variant", edit)


def _assert_fails_cleanly(args, out, code, *needles):
    result = run_cli(*args, "--out", out, check=False)
    assert result.returncode == code, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in error_lines[0], error_lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return error_lines[0]


def test_unknown_source_key(wan_small, tmp_path):
    import torch

    source = _variant(wan_small, tmp_path, lambda s: s.update({"encoder.extra_block.weight": torch.zeros(2)}))
    _assert_fails_cleanly(["wan2.1", "--source", source, "--to", "flax"], tmp_path / "out",
                          InputError.exit_code, "encoder.extra_block.weight", "AutoencoderKLWan does not have")


def test_missing_source_key(wan_small, tmp_path):
    source = _variant(wan_small, tmp_path, lambda s: s.pop("decoder.up_blocks.1.resnets.2.conv2.bias"))
    _assert_fails_cleanly(["wan2.1", "--source", source, "--to", "torchax"], tmp_path / "out",
                          InputError.exit_code, "decoder.up_blocks.1.resnets.2.conv2.bias", "missing from the checkpoint")


def test_shape_mismatch(wan_small, tmp_path):
    def edit(state):
        state["encoder.down_blocks.10.conv1.weight"] = state["encoder.down_blocks.10.conv1.weight"][:, :-1].contiguous()

    source = _variant(wan_small, tmp_path, edit)
    _assert_fails_cleanly(["wan2.1", "--source", source, "--to", "flax"], tmp_path / "out",
                          InputError.exit_code, "disagree", "encoder.down_blocks.10.conv1.weight", "[32, 31, 3, 3, 3]")


@pytest.mark.parametrize("content", [b"", b"hello, this is not a checkpoint", b"\xff" * 64])
def test_not_a_checkpoint(tmp_path, content):
    bogus = tmp_path / "model.safetensors"
    bogus.write_bytes(content)
    _assert_fails_cleanly(["wan2.1", "--source", bogus, "--to", "flax"], tmp_path / "out",
                          InputError.exit_code, "not a safetensors file")


def test_truncated_checkpoint(wan_small, tmp_path):
    source, _ = wan_small
    data = (source / WEIGHTS).read_bytes()
    (tmp_path / WEIGHTS).write_bytes(data[: len(data) // 2])
    shutil.copy(source / "config.json", tmp_path / "config.json")
    _assert_fails_cleanly(["wan2.1", "--source", tmp_path / WEIGHTS, "--to", "flax"], tmp_path / "out",
                          InputError.exit_code, "truncated")


def test_other_family_weights(wan_small, tmp_path):
    """A lone weights file of another family (no config to tell): the keys say which family it is."""
    source, _ = wan_small
    shutil.copy(source / WEIGHTS, tmp_path / "weights.safetensors")
    _assert_fails_cleanly(["cogvideox-2b", "--source", tmp_path / "weights.safetensors", "--to", "flax"],
                          tmp_path / "out", InputError.exit_code, "looks like a wan2.1 VAE", "vae-convert wan2.1")


def test_other_family_config(wan_small, tmp_path):
    source, _ = wan_small
    folder = tmp_path / "cog"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "_class_name": "AutoencoderKLCogVideoX"}))
    _assert_fails_cleanly(["wan2.1", "--source", folder, "--to", "flax"], tmp_path / "out",
                          InputError.exit_code, "AutoencoderKLCogVideoX")


def test_missing_source(tmp_path):
    _assert_fails_cleanly(["wan2.1", "--source", tmp_path / "nowhere", "--to", "flax"], tmp_path / "out",
                          InputError.exit_code, "nowhere")


def test_existing_out_needs_force(wan_small, tmp_path):
    source, _ = wan_small
    out = earlier_output(tmp_path / "out", "old")
    result = run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", out, "--no-validate", check=False)
    assert result.returncode == OutputError.exit_code and "--force" in result.stderr
    assert (out / "old.txt").read_text() == "old"
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", out, "--no-validate", "--force")
    assert not (out / "old.txt").exists() and manifest(out)["target"] == "torchax"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
