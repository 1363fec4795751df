"""Bad input gets one clear line on stderr, its own exit code, and nothing at --out (no temporary leftovers). These
paths need no process of their own (no signal, no Hub, no crash): the CLI runs in the test's process."""

from __future__ import annotations

import functools
import json
import shutil

import pytest

from converter.errors import InputError, OutputError
from tests.helpers import earlier_output, edited_copy, fails, manifest, run_cli

WEIGHTS = "diffusion_pytorch_model.safetensors"
fails = functools.partial(fails, in_process=True)


def _variant(wan_small, tmp_path, edit):
    source, _ = wan_small
    return edited_copy(source, tmp_path / "variant", edit)


def test_unknown_source_key(wan_small, tmp_path):
    import torch

    source = _variant(wan_small, tmp_path, lambda s: s.update({"encoder.extra_block.weight": torch.zeros(2)}))
    fails(
        ["wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "encoder.extra_block.weight",
        "AutoencoderKLWan does not have",
        out=tmp_path / "out",
    )


def test_missing_source_key(wan_small, tmp_path):
    source = _variant(wan_small, tmp_path, lambda s: s.pop("decoder.up_blocks.1.resnets.2.conv2.bias"))
    fails(
        ["wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "decoder.up_blocks.1.resnets.2.conv2.bias",
        "missing from the checkpoint",
        out=tmp_path / "out",
    )


def test_shape_mismatch(wan_small, tmp_path):
    def edit(state):
        state["encoder.down_blocks.10.conv1.weight"] = state["encoder.down_blocks.10.conv1.weight"][:, :-1].contiguous()

    source = _variant(wan_small, tmp_path, edit)
    fails(
        ["wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "disagree",
        "encoder.down_blocks.10.conv1.weight",
        "[32, 31, 3, 3, 3]",
        out=tmp_path / "out",
    )


@pytest.mark.parametrize("content", [b"", b"hello, this is not a checkpoint", b"\xff" * 64])
def test_not_a_checkpoint(tmp_path, content):
    bogus = tmp_path / "model.safetensors"
    bogus.write_bytes(content)
    fails(
        ["wan2.1", "--source", bogus, "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "not a safetensors file",
        out=tmp_path / "out",
    )


def test_truncated_checkpoint(wan_small, tmp_path):
    source, _ = wan_small
    data = (source / WEIGHTS).read_bytes()
    (tmp_path / WEIGHTS).write_bytes(data[: len(data) // 2])
    shutil.copy(source / "config.json", tmp_path / "config.json")
    fails(
        ["wan2.1", "--source", tmp_path / WEIGHTS, "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "truncated",
        out=tmp_path / "out",
    )


def test_other_family_weights(wan_small, tmp_path):
    """A lone weights file of another family (no config to tell): the keys say which family it is."""
    source, _ = wan_small
    shutil.copy(source / WEIGHTS, tmp_path / "weights.safetensors")
    fails(
        ["cogvideox-2b", "--source", tmp_path / "weights.safetensors", "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "is a checkpoint of AutoencoderKLWan (diffusers",
        "vae-convert wan2.1",
        out=tmp_path / "out",
    )


def test_other_family_config(wan_small, tmp_path):
    source, _ = wan_small
    folder = tmp_path / "cog"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "_class_name": "AutoencoderKLCogVideoX"}))
    fails(
        ["wan2.1", "--source", folder, "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "AutoencoderKLCogVideoX",
        "try `vae-convert cogvideox-2b`",  # a command that exists
        out=tmp_path / "out",
    )


def test_missing_source(tmp_path):
    fails(
        ["wan2.1", "--source", tmp_path / "nowhere", "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "nowhere",
        out=tmp_path / "out",
    )


def test_existing_out_needs_force(wan_small, tmp_path):
    source, _ = wan_small
    out = earlier_output(tmp_path / "out", "old")
    result = run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", out, "--no-validate", check=False)
    assert result.returncode == OutputError.exit_code and "--force" in result.stderr
    assert (out / "old.txt").read_text() == "old"
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", out, "--no-validate", "--force")
    assert not (out / "old.txt").exists() and manifest(out)["target"] == "torchax"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
