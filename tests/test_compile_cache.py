"""Compilation: one compile per chunk shape, and the persistent cache (off by default; with VAE_CONVERT_COMPILE_CACHE
set, the first process fills it and a second process compiles nothing new)."""
import os
import subprocess
import sys

import pytest

from tests.conftest import COG_SMALL, REPO, WAN_SMALL, run_cli, save_diffusers

DECODE = """
import sys, numpy as np, converter
vae = converter.load(sys.argv[1])
vae.decode(np.zeros((1, 2, 4, 4, 4), np.float32))
"""


def _decode_in_new_process(out, cache):
    env = {k: v for k, v in os.environ.items() if k != "VAE_CONVERT_COMPILE_CACHE"}
    if cache:
        env["VAE_CONVERT_COMPILE_CACHE"] = str(cache)
    subprocess.run([sys.executable, "-c", DECODE, str(out)], cwd=REPO, env=env, check=True)


def _entries(cache):
    return {p.name for p in cache.rglob("*") if p.is_file()} if cache.exists() else set()


def test_second_process_hits_the_cache(wan_small, tmp_path):
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    cache = tmp_path / "cache"
    _decode_in_new_process(tmp_path / "out", None)
    assert not cache.exists()  # off by default
    _decode_in_new_process(tmp_path / "out", cache)
    first = _entries(cache)
    assert len(first) >= 2  # the first decode step (no history yet) and the steady step
    _decode_in_new_process(tmp_path / "out", cache)
    assert _entries(cache) == first  # nothing compiled anew


@pytest.mark.parametrize("model, diffusers_class, config, frames", [
    ("wan2.1", "AutoencoderKLWan", WAN_SMALL, 6),  # one latent frame a step
    ("cogvideox-2b", "AutoencoderKLCogVideoX", COG_SMALL, 13),  # a first batch of 3, then batches of 2
])
def test_one_compile_per_chunk_shape(tmp_path, model, diffusers_class, config, frames):
    """A whole video compiles two steps (the first chunk, with no history, and the steady chunk), not one per chunk."""
    import numpy as np

    import converter
    from models.steps_flax import step

    save_diffusers(diffusers_class, tmp_path / "vae", config)
    run_cli(model, "--source", tmp_path / "vae", "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    vae = converter.load(tmp_path / "out")
    before = step._cache_size()
    vae.decode(np.zeros((1, frames, 3, 5, 4), np.float32))  # a size no other test compiles
    assert step._cache_size() - before == 2
    vae.decode(np.ones((1, frames, 3, 5, 4), np.float32))
    assert step._cache_size() - before == 2  # and nothing new for another video of the same size
