"""Qwen-Image 2.1's VAE beyond the generic tests (which take its small configs, sizes and tiling case from
models/qwenimage21/testing.py, and tell its checkpoints from Wan's and Qwen-Image's, whose keys it shares with 2-D
kernels): both models take the one frame diffusers' does."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import converter
from converter.registry import FAMILIES
from tests.helpers import run_cli, save_diffusers, small

QWEN21 = FAMILIES["qwenimage21"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A small diffusers checkpoint of Qwen-Image 2.1, in a folder named after its family."""
    root = tmp_path_factory.mktemp("classes")
    save_diffusers(QWEN21, root / QWEN21.name, small(QWEN21, "default-arch")[1])
    return root


def test_the_models_take_the_one_frame_diffusers_takes(checkpoints, tmp_path):
    name, _ = small(QWEN21, "default-arch")
    for target in ("flax", "torchax"):
        out = tmp_path / target
        run_cli(name, "--source", checkpoints / "qwenimage21", "--to", target, "--out", out, "--no-validate")
    flax_model, torch_model = converter.load(tmp_path / "flax"), converter.load(tmp_path / "torchax")
    assert type(flax_model).__name__ == type(torch_model).__name__ == "AutoencoderKLQwenImage21"
    with pytest.raises(ValueError, match=r"decode: takes 1 frame\(s\)"):
        flax_model.decode(np.zeros((1, 2, 2, 2, 4), np.float32))  # (B, T, H, W, C)
    with pytest.raises(ValueError, match=r"encode: takes 1 frame\(s\)"):
        torch_model.encode(torch.zeros(1, 4, 2, 32, 32))


@pytest.mark.parametrize("factor", [None, 3])
def test_validation_sizes_images_by_the_architecture_not_scale_factor_spatial(checkpoints, tmp_path, factor):
    """scale_factor_spatial is diffusers' tiling ratio, typed int-or-null: a null or a wrong one no longer sizes the
    validation image (which once reached a reshape deep in the model), and encode says which sizes it takes."""
    source = tmp_path / "vae"
    shutil.copytree(checkpoints / "qwenimage21", source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "scale_factor_spatial": factor}))
    run_cli("qwen-image-2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out", "--no-preview")
    vae = converter.load(tmp_path / "out")
    with pytest.raises(ValueError, match="height and width must be positive multiples of 16"):
        vae.encode(np.zeros((1, 1, 24, 32, 4), np.float32))
