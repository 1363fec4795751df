"""Compilation: one compile per chunk shape, and the persistent cache (off by default; with VAE_CONVERT_COMPILE_CACHE
set, the first process fills it and a second process compiles nothing new, nor builds the Flax model's structure)."""

import pickle
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

import converter
from converter import targets
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


@pytest.fixture(scope="module")
def flax_outputs(wan_small, tmp_path_factory):
    """Flax outputs of the small Wan checkpoint in float32 and bfloat16."""
    source, _ = wan_small
    root = tmp_path_factory.mktemp("structures")
    for dtype in ("float32", "bfloat16"):
        run_cli("wan2.1", "--source", source, "--to", "flax", "--dtype", dtype, "--out", root / dtype, "--no-validate")
    return root / "float32", root / "bfloat16"


def _load_afresh(out, cache, monkeypatch):
    """converter.load with the cache in `cache`, as a new process would (nothing kept in memory)."""
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(cache))
    targets._STRUCTURES.clear()
    return converter.load(out)


def _structures(cache):
    return sorted((cache / targets.STRUCTURE_CACHE).iterdir())


def _decoded(vae):
    return np.asarray(vae.decode(np.linspace(-1, 1, 2 * 4 * 4 * 4, dtype=np.float32).reshape(1, 2, 4, 4, 4)))


def test_a_later_load_takes_the_model_structure_from_the_cache(flax_outputs, tmp_path, monkeypatch):
    out, _ = flax_outputs
    cache = tmp_path / "cache"
    first = _load_afresh(out, cache, monkeypatch)
    [entry] = _structures(cache)
    with monkeypatch.context() as building:
        building.setattr("flax.nnx.eval_shape", lambda *_: pytest.fail("the structure was built, not read"))
        again = _load_afresh(out, cache, monkeypatch)
    np.testing.assert_array_equal(_decoded(again), _decoded(first))
    # damaged, or kept by an earlier version (its graphdef and abstract state): made anew and kept again
    for kept in (b"damaged", pickle.dumps(nnx.split(again))):
        entry.write_bytes(kept)
        np.testing.assert_array_equal(_decoded(_load_afresh(out, cache, monkeypatch)), _decoded(first))
        assert targets._read_structure(entry) is not None


def test_each_structure_has_its_own_entry(flax_outputs, tmp_path, monkeypatch):
    """An entry is named by what the structure is made from: here the dtype, and the model code."""
    out, out_bf16 = flax_outputs
    cache = tmp_path / "cache"
    _load_afresh(out, cache, monkeypatch)
    _load_afresh(out_bf16, cache, monkeypatch)
    assert len(_structures(cache)) == 2
    monkeypatch.setattr(targets, "_models_digest", lambda: "the model code after an edit")
    _load_afresh(out, cache, monkeypatch)
    assert len(_structures(cache)) == 3


def test_a_cache_that_cannot_keep_structures_is_warned_of(flax_outputs, tmp_path, monkeypatch):
    out, _ = flax_outputs
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / targets.STRUCTURE_CACHE).write_text("a file where the folder would go")
    with pytest.warns(UserWarning, match="structure is not kept"):
        vae = _load_afresh(out, cache, monkeypatch)
    assert _decoded(vae).shape[1] > 2


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
