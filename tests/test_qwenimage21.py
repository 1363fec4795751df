"""Qwen-Image 2.1's VAE beyond the generic tests (which take its small configs, sizes and tiling case from
models/qwenimage21/testing.py): its keys are Wan's with 2-D kernels, so a checkpoint of it named as Wan or Qwen-Image,
and theirs named as it, are refused with the command to use, with a config.json or from the kernels alone; diffusers
reads the torchax output; both models take the one frame diffusers' does."""

from __future__ import annotations

import shutil

import diffusers
import numpy as np
import pytest
import torch

import converter
from converter.errors import InputError
from converter.registry import FAMILIES
from tests.helpers import fails, run_cli, save_diffusers, small

QWEN21, WAN, QWEN = FAMILIES["qwenimage21"], FAMILIES["wan"], FAMILIES["qwenimage"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A small diffusers checkpoint of each class sharing Wan's key names, in a folder named after its family."""
    root = tmp_path_factory.mktemp("classes")
    for family, which in ((QWEN21, "default-arch"), (WAN, "wan2.2-layout"), (QWEN, "default-arch")):
        save_diffusers(family, root / family.name, small(family, which)[1])
    return root


@pytest.mark.parametrize(
    ("held", "named", "hint"),
    [
        ("qwenimage21", "wan2.2", "qwen-image-2.1"),
        ("qwenimage21", "qwen-image", "qwen-image-2.1"),
        ("wan", "qwen-image-2.1", "wan2.2"),
        ("qwenimage", "qwen-image-2.1", "qwen-image"),
    ],
)
def test_a_class_named_as_another_is_refused_with_its_command(checkpoints, tmp_path, held, named, hint):
    out = tmp_path / "out"
    args = ["--to", "flax", "--out", out, "--no-validate"]
    fails([named, "--source", checkpoints / held, *args], InputError.exit_code, f"`vae-convert {hint}`", out=out)
    # the weights file alone: the kernels' rank tells the classes apart (Qwen-Image's weights are Wan 2.1's)
    bare = tmp_path / "alone" / "vae.safetensors"
    bare.parent.mkdir()
    shutil.copy(checkpoints / held / "diffusion_pytorch_model.safetensors", bare)
    told = "wan2.1" if held == "qwenimage" else hint
    fails([named, "--source", bare, *args], InputError.exit_code, f"`vae-convert {told}`", out=out)


def test_diffusers_reads_the_torchax_output_and_the_models_take_one_frame(checkpoints, tmp_path):
    name, _ = small(QWEN21, "default-arch")
    run_cli(name, "--source", checkpoints / "qwenimage21", "--to", "torchax", "--out", tmp_path / "tx", "--no-validate")
    read = diffusers.AutoencoderKLQwenImage21.from_pretrained(tmp_path / "tx").eval()
    reference = diffusers.AutoencoderKLQwenImage21.from_pretrained(checkpoints / "qwenimage21").eval()
    z = torch.randn(1, 4, 1, 3, 2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(read.decode(z).sample, reference.decode(z).sample)
    run_cli(name, "--source", checkpoints / "qwenimage21", "--to", "flax", "--out", tmp_path / "flax", "--no-validate")
    flax_model, torch_model = converter.load(tmp_path / "flax"), converter.load(tmp_path / "tx")
    assert type(flax_model).__name__ == type(torch_model).__name__ == "AutoencoderKLQwenImage21"
    two_frames = np.zeros((1, 2, 2, 2, 4), np.float32)  # (B, T, H, W, C)
    with pytest.raises(ValueError, match=r"decode: takes 1 frame\(s\)"):
        flax_model.decode(two_frames)
    with pytest.raises(ValueError, match=r"encode: takes 1 frame\(s\)"):
        torch_model.encode(torch.zeros(1, 4, 2, 32, 32))
