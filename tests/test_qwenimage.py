"""Qwen-Image's VAE beyond the generic tests (which take its small configs, frames, tiling and mesh cases from
models/qwenimage/testing.py, and tell its checkpoints from Wan's): it is Wan 2.1's architecture under its own class,
so what must hold is that Wan-Video's original file stays Wan's, and that outputs, saved models and exports keep their
class."""

from __future__ import annotations

import json

import diffusers
import numpy as np
import pytest
import torch

import converter
from converter.errors import InputError
from converter.registry import FAMILIES
from tests.helpers import fails, manifest, run_cli, save_diffusers, small
from tests.original_files import write_original

QWEN, WAN = FAMILIES["qwenimage"], FAMILIES["wan"]


def test_wan_video_s_original_file_named_as_qwen_image_is_refused(tmp_path):
    """Wan-Video's original file holds a Wan 2.1 VAE, whatever class shares its keys (the diffusers checkpoints of
    the two classes are told apart by the generic tests)."""
    wan = save_diffusers(WAN, tmp_path / "wan", small(WAN, "default-arch")[1])
    original = write_original(wan.state_dict(), "wan2.1-original", tmp_path / "Wan2.1_VAE.pth")
    out = tmp_path / "out"
    fails(["qwen-image", "--source", original, "--to", "flax", "--out", out], InputError.exit_code,
          "`vae-convert wan2.1`", out=out)  # fmt: skip


@pytest.mark.slow
def test_outputs_saved_models_and_exports_keep_the_class(tmp_path):
    name, config = small(QWEN, "other-config")  # 4 input channels: Qwen-Image-Layered's
    reference = save_diffusers(QWEN, tmp_path / "vae", config)
    run_cli(name, "--source", tmp_path / "vae", "--to", "torchax", "--out", tmp_path / "tx", "--no-validate")
    read = diffusers.AutoencoderKLQwenImage.from_pretrained(tmp_path / "tx").eval()
    z = torch.randn(1, 4, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(read.decode(z).sample, reference.decode(z).sample)
    run_cli(name, "--source", tmp_path / "vae", "--to", "flax", "--out", tmp_path / "flax", "--no-validate")
    vae = converter.load(tmp_path / "flax")
    assert type(vae).__name__ == "AutoencoderKLQwenImage"
    converter.save(vae, tmp_path / "saved")
    assert manifest(tmp_path / "saved")["family"] == "qwenimage"
    run_cli("export", tmp_path / "saved", "--out", tmp_path / "back", "--no-validate")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["_class_name"] == "AutoencoderKLQwenImage"
    exported = diffusers.AutoencoderKLQwenImage.from_pretrained(tmp_path / "back").eval()
    for key, tensor in reference.state_dict().items():
        assert np.array_equal(exported.state_dict()[key].numpy(), tensor.numpy()), key
