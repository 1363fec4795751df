"""The tiny VAEs (TAESD, TAESDXL, TAESD3, TAEF1) beyond the generic tests (which take their small configs, image
sizes, tiling case, mesh and original release from models/autoencodertiny/testing.py): latents scale to TAESD's
8-bit range as diffusers scales them; a release split by part converts from either of its files, its config read from
its tensors, and a 16-channel one named as a 4-channel model is refused with the right command; configs diffusers'
model cannot run are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import converter
from converter.registry import FAMILIES
from tests.helpers import fails, manifest, run_cli, save_diffusers, small
from tests.original_files import write_original

TINY = FAMILIES["autoencodertiny"]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """A small TAESD saved by diffusers, converted to each target: (the diffusers model, {target: loaded model})."""
    root = tmp_path_factory.mktemp("tiny")
    name, config = small(TINY, "default-arch")
    reference = save_diffusers(TINY, root / "vae", config)
    for target in ("flax", "torchax"):
        run_cli(name, "--source", root / "vae", "--to", target, "--out", root / target, "--no-validate")
    return reference, {target: converter.load(root / target) for target in ("flax", "torchax")}


def test_latents_scale_to_taesd_s_8_bit_range_as_diffusers_scales_them(outputs):
    reference, models = outputs
    z = torch.linspace(-4, 4, 2 * 4 * 3 * 5).reshape(2, 4, 3, 5)
    with torch.no_grad():
        scaled, unscaled = reference.scale_latents(z).numpy(), reference.unscale_latents(z).numpy()
    channels_last = np.moveaxis(z.numpy(), 1, -1)
    assert np.array_equal(np.moveaxis(np.asarray(models["flax"].scale_latents(channels_last)), -1, 1), scaled)
    assert np.allclose(np.moveaxis(np.asarray(models["flax"].unscale_latents(channels_last)), -1, 1), unscaled)
    assert torch.equal(models["torchax"].scale_latents(z), torch.from_numpy(scaled))


def test_a_split_release_converts_from_either_file_as_its_tensors_say(tmp_path):
    """A TAESD3-like release (16 latent channels, other widths) with no config: from its decoder file under taesd3 it
    converts and validates with the config its tensors give; named taesd (4 channels) it is refused with taesd3's
    command."""
    config = dict(small(TINY, "16-channels")[1], **TINY.testing().original_files["taesd"].config_changes)
    config.update(act_fn="relu", encoder_block_out_channels=[8] * 4, decoder_block_out_channels=[8] * 4)
    model = save_diffusers(TINY, tmp_path / "diffusers", config)
    first = write_original(model.state_dict(), "taesd", tmp_path / "release" / "taesd3.safetensors")
    decoder_file = first.with_name("taesd3_decoder.safetensors")
    result = run_cli("taesd3", "--source", decoder_file, "--to", "flax", "--out", tmp_path / "o")
    assert "encoder_block_out_channels" in result.stderr  # the widths, inferred from the tensors and said
    info = manifest(tmp_path / "o")
    assert info["validation"]["ok"] and info["source"]["files"] == ["taesd3_encoder.safetensors", decoder_file.name]
    assert json.loads((tmp_path / "o" / "config.json").read_text())["encoder_block_out_channels"] == [8] * 4
    fails(["taesd", "--source", tmp_path / "release", "--to", "flax", "--out", tmp_path / "x"], 3,
          "TAESD3/TAEF1", "vae-convert taesd3", out=tmp_path / "x")  # fmt: skip


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (dict(encoder_block_out_channels=[8, 16, 16, 16]), "encoder_block_out_channels must hold one width"),
        (dict(upsample_fn="bilinear"), "upsample_fn 'bilinear' is not supported"),
        (dict(num_decoder_blocks=[1, 1, 1]), "decoder_block_out_channels and num_decoder_blocks differ in length"),
    ],
)
def test_configs_diffusers_model_cannot_run_are_refused(tmp_path, change, needle):
    folder = tmp_path / "vae"
    save_diffusers(TINY, folder, small(TINY, "default-arch")[1])
    config = {**json.loads((folder / "config.json").read_text()), **change}
    (folder / "config.json").write_text(json.dumps(config))
    fails(["taesd", "--source", folder, "--to", "flax", "--out", tmp_path / "o"], 3, needle, out=tmp_path / "o")
