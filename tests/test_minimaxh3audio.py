"""MiniMax-H3's audio VAE beyond the generic tests (which take its small configs and waveform lengths from
models/minimaxh3audio/testing.py): stereo as a batch of two as the pipeline runs it, the weight-normed convolutions
normalised (not their `weight_v` used as it is), ComfyUI's file (weight norm folded, the latents' statistics as
tensors), its validation drawn and sounded, its float32 outputs, and the configs diffusers' class cannot run
refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import converter
from converter.registry import FAMILIES
from tests.helpers import fails, runner

AUDIO = FAMILIES["minimaxh3audio"]


def test_stereo_runs_as_a_batch_of_two(default_arch):
    """The pipeline's stereo: two mono waveforms as a batch, encoded and decoded as diffusers does; the two channels
    stay apart (the causal attention runs along each, never across the batch). Flax: torchax lowers its attention
    to the same blocked attention."""
    converted = default_arch(AUDIO)
    waveform = torch.rand(2, 1, 200, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        mean = converted.reference.encode(waveform).latent_dist.mean
        expected = converted.reference.decode(mean).sample.numpy()
    drive = runner("flax", converter.load(converted.outputs["flax"]))
    got_mean, _ = drive.encode(waveform.numpy())
    assert np.abs(got_mean - mean.numpy()).max() <= 1e-4
    assert np.abs(drive.decode(mean.numpy()) - expected).max() <= 1e-4
    alone, _ = drive.encode(waveform[1:].numpy())
    assert np.abs(alone[0] - got_mean[1]).max() <= 1e-5


def test_weight_norm_is_applied_not_its_direction_alone(default_arch):
    """Scaling a convolution's `weight_v` leaves the waveform as it is (its norm is divided out); scaling its
    `weight_g` changes it."""
    converted = default_arch(AUDIO)
    vae = converter.load(converted.outputs["flax"])
    z = np.random.default_rng(0).standard_normal((1, 8, 3)).astype(np.float32)
    before = runner("flax", vae).decode(z)
    conv = vae.decoder.conv_pre
    conv.weight_v[...] = conv.weight_v[...] * 3.0
    assert np.abs(runner("flax", vae).decode(z) - before).max() <= 1e-5
    conv.weight_g[...] = conv.weight_g[...] * 3.0
    assert np.abs(runner("flax", vae).decode(z) - before).max() > 1e-3


def test_comfyuis_file_converts_to_the_model_it_was_folded_from(default_arch, tmp_path):
    """ComfyUI's file is diffusers' model with torch's remove_weight_norm run on each weight-normed convolution and
    the latents' statistics kept as tensors: it converts (and validates) to weights diffusers' class reads back as
    the model it was folded from, its statistics in the config."""
    from safetensors.torch import save_file

    from tests.helpers import run_in_process

    converted = default_arch(AUDIO)
    folded = type(converted.reference).from_pretrained(converted.source)
    for module in folded.modules():
        if hasattr(module, "weight_g"):
            torch.nn.utils.remove_weight_norm(module)
    width = converted.reference.config.latent_channels
    statistics = {"latents_mean": torch.randn(width) * 0.1, "latents_std": torch.rand(width) + 0.5}
    save_file({**folded.state_dict(), **statistics}, tmp_path / "audio_vae.safetensors")
    out = tmp_path / "out"
    result = run_in_process(converted.name, "--source", tmp_path / "audio_vae.safetensors", "--config",
                            converted.source / "config.json", "--to", "torchax", "--out", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "minimax-h3-audio-comfyui" in result.stdout + result.stderr
    back = type(converted.reference).from_pretrained(out).eval()
    assert {k: back.config[k] for k in statistics} == {k: v.double().tolist() for k, v in statistics.items()}
    waveform = torch.rand(1, 1, 157, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        expected, got = (m.encode(waveform).latent_dist.mean for m in (converted.reference, back))
        assert (got - expected).abs().max() <= 1e-5
        expected, got = (m.decode(expected).sample for m in (converted.reference, back))
        assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (dict(decoder_rates=[5, 2, 2, 1]), "decoder_rates must upsample by the encoder's hop (40)"),
        (dict(resblock_kernel_sizes=[3, 4, 7]), "resblock_kernel_sizes must be odd"),
        (dict(num_attention_heads=5), "multiple of num_attention_heads"),
    ],
)
def test_configs_diffusers_cannot_run_are_refused(default_arch, tmp_path, change, needle):
    """A decoder that does not undo the encoder's hop (diffusers refuses it too), an AMP block whose convolution
    shortens its input (diffusers fails adding them) or heads that do not split the width: exit 3, one line."""
    converted = default_arch(AUDIO)
    source = tmp_path / "audio_vae"
    shutil.copytree(converted.source, source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    fails([converted.name, "--source", source, "--to", "flax", "--out", out], 3, needle, out=out, in_process=True)


def test_a_validated_conversion_draws_and_sounds_both_sections(default_arch, tmp_path):
    """The CLI's validation encodes its test waveform and decodes its latent with both models; validation.png has
    the reconstruction (input, converted, reference, difference) above the decode, and validation.wav is written."""
    from PIL import Image

    from converter import preview
    from tests.helpers import manifest, run_in_process

    converted = default_arch(AUDIO)
    out = tmp_path / "out"
    result = run_in_process(converted.name, "--source", converted.source, "--to", "torchax", "--out", out)
    assert result.returncode == 0, result.stderr
    recorded = manifest(out)["validation"]
    assert recorded["ok"] and [c["output"] for c in recorded["checks"]] == ["decode", "encode.mean", "encode.logs"]
    image = Image.open(out / preview.FILE_NAME)
    assert image.size[1] == preview.Layout(0, 0).section_height(4) + preview.Layout(0, 0).section_height(3)
    assert set(recorded["preview"]["max_abs"]) == {"reconstruction", "decode"}
    assert (out / preview.SOUND_FILE_NAME).exists()


def test_a_bfloat16_output_stays_float32(default_arch, tmp_path):
    """diffusers keeps every module of this class in float32 (`_keep_in_fp32_modules`), so `--dtype bfloat16`
    writes every tensor float32 and the output validates and loads."""
    from safetensors import safe_open

    from tests.helpers import manifest, run_in_process

    converted = default_arch(AUDIO)
    out = tmp_path / "out"
    result = run_in_process(converted.name, "--source", converted.source, "--to", "torchax", "--dtype", "bfloat16",
                            "--out", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert manifest(out)["validation"]["ok"]
    with safe_open(out / "diffusion_pytorch_model.safetensors", "np") as weights:
        assert {weights.get_slice(k).get_dtype() for k in weights.keys()} == {"F32"}
    converter.load(out)
