"""Wan's own cases beyond the generic tests (which take Wan's small configs, tiling and mesh cases and original
formats from models/wan/testing.py): ComfyUI's 16-bit repackaging of the original file, and an original file of one
Wan VAE named as the other."""

from __future__ import annotations

import pytest
import torch

from converter.errors import InputError
from converter.registry import FAMILIES
from tests.helpers import fails, manifest, run_cli, save_diffusers
from tests.original_files import (
    FORMATS,
    as_released,
    assert_same_tensors,
    output_tensors,
    released_config,
    write_original,
)

WAN = FAMILIES["wan"]


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])
def test_comfyui_16_bit_safetensors_stays_16_bit(tmp_path, dtype):
    """ComfyUI's repackaged wan_2.1_vae.safetensors: Wan 2.1's original keys, 16-bit (validated in bfloat16)."""
    from safetensors.torch import save_file

    model = save_diffusers(WAN, tmp_path / "vae", WAN.testing().small_configs["default-arch"]).to(dtype)
    model.save_pretrained(tmp_path / "vae-16")
    save_file(as_released(model.state_dict(), "wan2.1-original"), tmp_path / "wan_2.1_vae.safetensors")
    config = tmp_path / "vae" / "config.json"
    args = ("--config", config, "--to", "flax", "--format", "safetensors")
    validate = () if dtype == torch.bfloat16 else ("--no-validate",)
    result = run_cli(
        "wan2.1", "--source", tmp_path / "wan_2.1_vae.safetensors", *args, "--out", tmp_path / "o", *validate
    )
    run_cli("wan2.1", "--source", tmp_path / "vae-16", *args, "--out", tmp_path / "d", "--no-validate")
    name = str(dtype).removeprefix("torch.")
    assert f"auto -> {name}" in result.stderr and manifest(tmp_path / "o")["dtype"] == name
    if not validate:
        assert manifest(tmp_path / "o")["validation"]["ok"]
    assert_same_tensors(output_tensors(tmp_path / "o"), output_tensors(tmp_path / "d"))


@pytest.mark.parametrize(
    ("fmt", "named", "hint"), [("wan2.2-original", "wan2.1", "wan2.2"), ("wan2.1-original", "wan2.2", "wan2.1")]
)
def test_original_file_of_the_other_wan_variant(tmp_path, fmt, named, hint):
    family, case = FORMATS[fmt]
    state = save_diffusers(family, tmp_path / "vae", released_config(fmt)[1]).state_dict()
    source = write_original(state, fmt, tmp_path / case.file_name)
    out = tmp_path / "out"
    fails(
        [named, "--source", source, "--to", "torchax", "--out", out],
        InputError.exit_code,
        f"({fmt})",
        f"`vae-convert {hint}`",
        out=out,
    )
