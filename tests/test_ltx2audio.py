"""LTX-2's audio VAE beyond the generic tests (which take its small configs, spectrogram sizes, and its audio inside
Lightricks' single files from models/ltx2audio/testing.py): a pipeline component named on the command line, either
way, in every LTX-2 name (tests/test_components.py has what any model with several components does)."""

from __future__ import annotations

from converter.registry import FAMILIES
from tests.helpers import manifest, run_in_process

AUDIO = FAMILIES["ltx2audio"]


def test_the_audio_vae_is_a_component_of_the_ltx2_names(default_arch, tmp_path):
    """`--component audio_vae` and `ltx-2:audio_vae` say the same; the output says which component it is."""
    source = default_arch(AUDIO).source
    for args in (("ltx-2", "--component", "audio_vae"), ("ltx-2.3:audio_vae",)):
        out = tmp_path / args[0]
        result = run_in_process(*args, "--source", source, "--to", "torchax", "--out", out, "--no-validate")
        assert result.returncode == 0, result.stderr
        assert manifest(out)["component"] == "audio_vae" and manifest(out)["family"] == "ltx2audio"
