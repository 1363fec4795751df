"""LTX-2's vocoders beyond the generic tests (which take their small configs, mel sizes and Lightricks' single-file
layouts from models/ltx2vocoder/testing.py): `vocoder(mel)` called as diffusers calls it, the stored filters loaded
rather than recomputed, and the configs diffusers' class cannot run refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import converter
from converter.registry import FAMILIES
from tests.helpers import fails, runner

VOCODER, BWE = FAMILIES["ltx2vocoder"], FAMILIES["ltx2vocoderbwe"]


def test_torchax_vocoder_is_called_as_diffusers_calls_it(default_arch):
    """`vocoder(mel)` and, with `time_last`, the mel bins before the frames; on JAX through torchax as in PyTorch."""
    converted = default_arch(BWE)
    model = converter.load(converted.outputs["torchax"])
    mel = torch.randn(1, 2, 5, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = converted.reference(mel)
        assert torch.allclose(model(mel), expected, atol=1e-5)
        assert torch.allclose(model(mel.transpose(2, 3), time_last=True), expected, atol=1e-5)
    assert np.abs(runner("torchax", model).decode(mel.numpy()) - expected.numpy()).max() <= 1e-4


def test_the_stored_filters_are_loaded_not_recomputed(default_arch):
    """The checkpoint's anti-aliasing filters and mel filterbank are what the models run: changing one changes the
    waveform, in both targets as in diffusers."""
    converted = default_arch(BWE)
    flax = converter.load(converted.outputs["flax"])
    mel = np.random.default_rng(0).standard_normal((1, 2, 5, 16)).astype(np.float32)
    before = runner("flax", flax).decode(mel)
    flax.vocoder.act_out.upsample.filter[...] = flax.vocoder.act_out.upsample.filter[...] * 0.5
    assert np.abs(runner("flax", flax).decode(mel) - before).max() > 1e-3


@pytest.mark.parametrize(
    ("family", "change", "needle"),
    [
        (VOCODER, dict(antialias=True), "antialias with act_fn leaky_relu"),
        (BWE, dict(bwe_upsample_kernel_sizes=[6, 32]), "differ by an odd number"),
        (BWE, dict(window_length=32), "window_length = filter_length"),
    ],
)
def test_configs_diffusers_cannot_run_are_refused(default_arch, tmp_path, family, change, needle):
    """A leaky ReLU anti-aliased (diffusers nests its filters one deeper per activation), an extender whose waveform
    is not T x hop long, or a shorter STFT window (diffusers' sum of the two waveforms would not fit): exit 3."""
    converted = default_arch(family)
    source = tmp_path / "vocoder"
    shutil.copytree(converted.source, source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    fails([converted.name, "--source", source, "--to", "flax", "--out", out], 3, needle, out=out, in_process=True)
