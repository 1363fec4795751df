"""The persistent compilation cache: off by default; with VAE_CONVERT_COMPILE_CACHE set, the first process fills it
and a second process compiles nothing new (every step is a cache hit)."""
import os
import subprocess
import sys

from tests.conftest import REPO, run_cli

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
