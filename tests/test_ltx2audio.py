"""LTX-2's audio VAE beyond the generic tests (which take its small configs, spectrogram sizes, and its audio inside
Lightricks' single files from models/ltx2audio/testing.py): a pipeline component named on the command line, either
way; a component a model has not is a usage error."""

from __future__ import annotations

import pytest

from converter.registry import FAMILIES
from tests.helpers import fails, manifest, run_in_process

AUDIO = FAMILIES["ltx2audio"]


def test_the_audio_vae_is_a_component_of_the_ltx2_names(default_arch, tmp_path):
    """`--component audio_vae` and `ltx-2:audio_vae` say the same; the output says which component it is."""
    source = default_arch(AUDIO).source
    for args in (("ltx-2", "--component", "audio_vae"), ("ltx-2.3:audio_vae",)):
        out = tmp_path / args[0]
        result = run_in_process(*args, "--source", source, "--to", "torchax", "--out", out, "--no-validate")
        assert result.returncode == 0, result.stderr
        assert manifest(out)["component"] == "audio_vae" and manifest(out)["family"] == "ltx2audio"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("sd1.5", "--component", "audio_vae"), "sd1.5 has no audio_vae component (its components: vae)"),
        (("ltx-video:vocoder",), "ltx-video has no vocoder component (its components: vae)"),
        (("ltx-2:audio_vae", "--component", "vae"), "name two components"),
    ],
)
def test_a_component_the_model_has_not_is_a_usage_error(tmp_path, args, needle):
    out = tmp_path / "out"
    fails([*args, "--source", tmp_path, "--to", "flax", "--out", out], 2, needle, out=out, in_process=True)
