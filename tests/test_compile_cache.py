"""Compilation: one compile per chunk shape, and the persistent cache (off by default; with VAE_CONVERT_COMPILE_CACHE
set, the first process fills it and a second process compiles nothing new)."""

import subprocess
import sys

import pytest

from converter.api import COMPILE_CACHE_ENV
from converter.registry import FAMILIES
from tests.helpers import REPO, compiled_steps, environment_without_compile_cache, run_cli, save_diffusers

DECODE = """
import sys, numpy as np, converter
vae = converter.load(sys.argv[1])
vae.decode(np.zeros((1, 2, 4, 4, 4), np.float32))
"""


def _decode_in_new_process(out, cache):
    env = environment_without_compile_cache()
    if cache:
        env[COMPILE_CACHE_ENV] = str(cache)
    subprocess.run([sys.executable, "-c", DECODE, str(out)], cwd=REPO, env=env, check=True)


def _entries(cache):
    return {p.name for p in cache.rglob("*") if p.is_file()} if cache.exists() else set()


def test_second_process_hits_the_cache(wan_small, tmp_path, monkeypatch):
    source, _ = wan_small
    # a conversion's validation uses the cache too (what a second process finds there: below)
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "conversions"))
    run_cli("wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out", "--no-preview")
    assert _entries(tmp_path / "conversions")
    cache = tmp_path / "cache"
    _decode_in_new_process(tmp_path / "out", None)
    assert not cache.exists()  # off by default
    _decode_in_new_process(tmp_path / "out", cache)
    first = _entries(cache)
    assert len(first) >= 2  # the first decode step (no history yet) and the steady step
    _decode_in_new_process(tmp_path / "out", cache)
    assert _entries(cache) == first  # nothing compiled anew


@pytest.mark.parametrize("family", list(FAMILIES.values()), ids=list(FAMILIES))
def test_one_compile_per_chunk_shape(tmp_path, family):
    """A whole video compiles two steps (the first chunk, with no history, and the steady chunk), not one per chunk."""
    import numpy as np

    import converter

    config = family.small_configs["default-arch"]
    # the longest latent count the parity tests use: several chunks (Wan: one latent frame a step; CogVideoX: a
    # first batch with the remainder, then batches of 2)
    frames = max(family.parity_frames[0])
    save_diffusers(family, tmp_path / "vae", config)
    run_cli(
        family.models[0].name, "--source", tmp_path / "vae", "--to", "flax", "--out", tmp_path / "out", "--no-validate"
    )
    vae = converter.load(tmp_path / "out")
    channels = family.validation_latent_shape(vae.config)[1]
    latent = np.zeros((1, frames, 3, 5, channels), np.float32)  # a size no other test compiles
    before = compiled_steps()
    vae.decode(latent)
    assert compiled_steps() - before == 2
    vae.decode(latent + 1)
    assert compiled_steps() - before == 2  # and nothing new for another video of the same size
