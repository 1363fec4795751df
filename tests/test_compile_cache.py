"""Compilation: one compile per chunk shape, and the persistent cache (off by default; with VAE_CONVERT_COMPILE_CACHE
set, the first process fills it and a second process compiles nothing new). The structure cache (on by default): a
later process takes the Flax model's structure from it instead of building the modules."""

import pickle
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

import converter
from converter import structure_cache
from converter.api import COMPILE_CACHE_ENV
from converter.registry import FAMILIES
from converter.structure_cache import STRUCTURE_CACHE_ENV
from tests.helpers import (
    REPO,
    compiled_steps,
    decode_inputs,
    environment_without_compile_cache,
    input_shape,
    per_family,
    run_cli,
    run_in_process,
)

DECODE = """
import sys, numpy as np, converter
vae = converter.load(sys.argv[1])
vae.decode(np.zeros((1, 2, 4, 4, 4), np.float32))
"""


def _decode_in_new_process(out, cache):
    env = {**environment_without_compile_cache(), COMPILE_CACHE_ENV: str(cache)}
    subprocess.run([sys.executable, "-c", DECODE, str(out)], cwd=REPO, env=env, check=True)


def _entries(cache):
    return {p.name for p in cache.rglob("*") if p.is_file()} if cache.exists() else set()


@pytest.mark.slow
def test_second_process_hits_the_cache(wan_small, tmp_path, monkeypatch):
    source, _ = wan_small
    # a conversion's validation uses the cache too (what a second process finds there: below)
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "conversions"))
    run_cli("wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out", "--no-preview")
    assert _entries(tmp_path / "conversions")
    cache = tmp_path / "cache"
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
        args = ("--source", source, "--to", "flax", "--dtype", dtype, "--out", root / dtype, "--no-validate")
        run_in_process("wan2.1", *args, check=True)
    return root / "float32", root / "bfloat16"


def _load_afresh(out, monkeypatch, cache=None):
    """converter.load as a new process would make it (nothing kept in memory), the structure cache in `cache` (None:
    as the environment says)."""
    if cache is not None:
        monkeypatch.setenv(STRUCTURE_CACHE_ENV, str(cache))
    structure_cache._STRUCTURES.clear()
    return converter.load(out)


def _structures(cache):
    return sorted(cache.iterdir())


def _decoded(vae):
    return np.asarray(vae.decode(np.linspace(-1, 1, 2 * 4 * 4 * 4, dtype=np.float32).reshape(1, 2, 4, 4, 4)))


def _counting_builds(monkeypatch) -> list:
    """nnx.eval_shape counted: one call per structure built."""
    builds, eval_shape = [], nnx.eval_shape
    monkeypatch.setattr("flax.nnx.eval_shape", lambda *a, **k: builds.append(1) or eval_shape(*a, **k))
    return builds


def test_a_later_load_takes_the_model_structure_from_the_cache(flax_outputs, tmp_path, monkeypatch):
    out, _ = flax_outputs
    cache = tmp_path / "cache"
    first = _load_afresh(out, monkeypatch, cache)
    [entry] = _structures(cache)
    assert entry.stat().st_mode & 0o777 == 0o600 and cache.stat().st_mode & 0o777 == 0o700
    with monkeypatch.context() as building:
        building.setattr("flax.nnx.eval_shape", lambda *_: pytest.fail("the structure was built, not read"))
        again = _load_afresh(out, monkeypatch, cache)
    np.testing.assert_array_equal(_decoded(again), _decoded(first))
    # damaged, kept by an earlier version (its graphdef and abstract state), or open to others' writing (unpickling
    # runs code): made anew and kept again
    for kept, mode in ((b"damaged", 0o600), (pickle.dumps(nnx.split(again)), 0o600), (entry.read_bytes(), 0o620)):
        entry.write_bytes(kept)
        entry.chmod(mode)
        with monkeypatch.context() as building:
            builds = _counting_builds(building)
            np.testing.assert_array_equal(_decoded(_load_afresh(out, monkeypatch, cache)), _decoded(first))
        assert builds == [1]
        assert structure_cache._read_structure(entry) is not None and entry.stat().st_mode & 0o777 == 0o600


def test_each_structure_has_its_own_entry(flax_outputs, tmp_path, monkeypatch):
    """An entry is named by what the structure is made from: here the dtype, and the model code."""
    out, out_bf16 = flax_outputs
    cache = tmp_path / "cache"
    _load_afresh(out, monkeypatch, cache)
    _load_afresh(out_bf16, monkeypatch, cache)
    assert len(_structures(cache)) == 2
    monkeypatch.setattr(structure_cache, "_models_digest", lambda: "the model code after an edit")
    _load_afresh(out, monkeypatch, cache)
    assert len(_structures(cache)) == 3


def test_the_structure_cache_is_in_the_users_cache_folder_unless_told(flax_outputs, tmp_path, monkeypatch):
    out, _ = flax_outputs
    monkeypatch.delenv(STRUCTURE_CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    _load_afresh(out, monkeypatch)
    assert len(_structures(tmp_path / "home" / ".cache" / "vae-convert" / "structures")) == 1
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    _load_afresh(out, monkeypatch)
    assert len(_structures(tmp_path / "xdg" / "vae-convert" / "structures")) == 1
    monkeypatch.setenv(STRUCTURE_CACHE_ENV, "off")
    with monkeypatch.context() as building:
        builds = _counting_builds(building)
        for _ in range(2):  # each load as a new process makes it: each builds, keeping nothing
            _decoded(_load_afresh(out, monkeypatch))
    assert builds == [1, 1]
    assert len(_structures(tmp_path / "xdg" / "vae-convert" / "structures")) == 1  # nothing written anywhere


def test_a_cache_that_cannot_keep_structures_is_noted(flax_outputs, tmp_path, monkeypatch, capsys):
    out, _ = flax_outputs
    cache = tmp_path / "cache"
    cache.write_text("a file where the folder would go")
    vae = _load_afresh(out, monkeypatch, cache)
    err = capsys.readouterr().err
    assert f"note: the model structure is not kept in {cache}" in err and STRUCTURE_CACHE_ENV in err
    assert _decoded(vae).shape[1] > 2


def test_a_compile_cache_that_cannot_keep_entries_is_one_note(flax_outputs, tmp_path):
    """JAX warns, two lines with its own file and line, for each entry it cannot write: one note for the process."""
    out, _ = flax_outputs
    cache = tmp_path / "cache"
    cache.write_text("a file where the folder would go")
    env = {**environment_without_compile_cache(), COMPILE_CACHE_ENV: str(cache)}
    result = subprocess.run([sys.executable, "-c", DECODE, str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"vae-convert: note: compiled steps are not kept in {cache} (File exists); set {COMPILE_CACHE_ENV} to another "
        f"folder"
    ]


CONVERT_WITHOUT_VALIDATION = """
import sys
from converter.cli import cli
try:
    cli.main([*sys.argv[1:], "--no-validate", "--force"], standalone_mode=False)
except SystemExit as e:
    assert not e.code, e.code
print(sorted(m for m in ("jax", "flax", "ml_dtypes", "torch") if m in sys.modules))
"""


def test_a_conversion_not_validated_needs_no_jax_once_the_cache_holds_its_leaves(wan_small, tmp_path):
    """The structure cache keeps each model's leaf shapes and dtypes beside its structure: a later float32 conversion
    that does not validate plans without building the model, and imports neither JAX, Flax nor ml_dtypes (their
    imports take about a second, more than converting a VAE); leaves kept damaged are made anew."""
    source, _ = wan_small
    env = {**environment_without_compile_cache(), STRUCTURE_CACHE_ENV: str(tmp_path / "cache")}
    args = ["wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out"]

    def imported():
        command = [sys.executable, "-c", CONVERT_WITHOUT_VALIDATION, *map(str, args)]
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True)
        return result.stdout.splitlines()[-1]

    assert imported() == "['flax', 'jax', 'ml_dtypes']"  # the first builds the model
    assert imported() == "[]"
    (kept,) = (tmp_path / "cache").glob(f"*{structure_cache.LEAVES_SUFFIX}")
    kept.write_text(kept.read_text()[:-9])
    assert imported() == "['flax', 'jax', 'ml_dtypes']"
    assert imported() == "[]"
    assert converter.load(tmp_path / "out").decode(np.zeros((1, 2, 4, 4, 4), np.float32)).shape[1] > 2


@pytest.mark.parametrize("setting", [None, structure_cache.OFF], ids=["unset", "off"])
def test_unset_or_off_keeps_no_compiled_steps(tmp_path, monkeypatch, setting):
    """Off by default; the word off says no cache, as for the structure cache: not a folder named off in the working
    directory."""
    import jax

    monkeypatch.chdir(tmp_path)
    if setting is None:
        monkeypatch.delenv(COMPILE_CACHE_ENV)
    else:
        monkeypatch.setenv(COMPILE_CACHE_ENV, setting)
    before = jax.config.jax_compilation_cache_dir
    assert not converter.enable_compile_cache()
    assert jax.config.jax_compilation_cache_dir == before and not any(tmp_path.iterdir())


@pytest.mark.parametrize("family", per_family(fast=lambda family: family.name == next(iter(FAMILIES))))
def test_one_compile_per_chunk_shape(default_arch, family):
    """A whole video compiles two steps (the first chunk, with no history, and the steady chunk), not one per chunk
    (LTX: one)."""
    import numpy as np

    import converter

    config = family.testing().small_configs["default-arch"]
    # the longest latent count the parity tests use: several chunks (Wan: one latent frame a step; CogVideoX: a
    # first batch with the remainder, then batches of 2)
    frames = max(family.testing().parity_frames[0])
    vae = converter.load(default_arch(family).outputs["flax"])
    # a size no other test compiles: its first size (a video's or an image's height, a sequence's length) longer
    # than any the family's testing data decodes, whole or tiled, the others the validation's (a vocoder's mel bins
    # are its config's)
    testing = family.testing()
    validation = family.validation_latent_shape(vae.config)
    first, *others = validation[3 if family.frame_axis else 2 :]
    longest = max(
        [sizes[0] for sizes in testing.parity_latent_sizes]
        + [case.latent[-2] for case in testing.tiling.values()]
        + [first]
    )
    latent = np.moveaxis(
        np.zeros(input_shape(family, 1, validation[1], frames, (longest + 1, *others)), np.float32), 1, -1
    )
    before = compiled_steps()
    vae.decode(latent, **decode_inputs(family, config)[0])
    steps = family.testing().decode_steps
    assert compiled_steps() - before == steps
    vae.decode(latent + 1, **decode_inputs(family, config)[0])
    assert compiled_steps() - before == steps  # and nothing new for another video of the same size
