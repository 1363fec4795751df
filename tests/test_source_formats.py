"""Original release files (each family's formats: Wan2.1_VAE.pth, Wan2.2_VAE.pth, CogVideoX's SAT
3d-vae.pt), written from a diffusers model by renaming its keys with the pairings in tests/data/source-formats/
(the oracle for keys): through the CLI they convert to exactly what the diffusers-format checkpoint converts to, and
what does not fit is refused in one line, leaving nothing behind."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from converter.errors import InputError, MappingError, UsageError
from converter.mapping import MAPPINGS_DIR
from converter.registry import FAMILIES
from tests.helpers import fails, family_cases, family_params, manifest, run_cli, run_in_process, save_diffusers
from tests.original_files import (
    FORMATS,
    as_converted_by_diffusers,
    assert_same_tensors,
    output_tensors,
    released_config,
    write_original,
)

WAN, COGVIDEOX = FAMILIES["wan"], FAMILIES["cogvideox"]


# every family's original formats; the first family's first one shows the module's basic behaviour
CASES = family_cases(lambda testing: testing.original_files)


@pytest.fixture(scope="module", params=family_params(CASES, fast=lambda family, fmt: fmt == next(iter(FORMATS))))
def released(request, tmp_path_factory):
    """(format, model name, config.json of the small widths, the original file, the diffusers folder)."""
    fmt = CASES[request.param][1]
    family, case = FORMATS[fmt]
    model_name, config = released_config(fmt)
    root = tmp_path_factory.mktemp(fmt)
    model = as_converted_by_diffusers(save_diffusers(family, root / "diffusers", config), fmt)
    model.save_pretrained(root / "diffusers")
    extra = {case.training_key: torch.randn(64, 3, 4, 4)} if case.training_key else None
    original = write_original(model.state_dict(), fmt, root / "release" / case.file_name, extra=extra)
    return fmt, model_name, root / "diffusers" / "config.json", original, root / "diffusers"


@pytest.mark.parametrize("target", ["flax", "torchax"])
def test_original_file_converts_as_its_diffusers_checkpoint(released, tmp_path, target):
    fmt, model_name, config, original, diffusers_folder = released
    validate = () if FORMATS[fmt][1].validated_target == target else ("--no-validate",)
    args = ("--source", original, "--config", config, "--to", target, "--out", tmp_path / "o", *validate)
    result = run_in_process(model_name, *args, check=True)
    reference = ("--source", diffusers_folder, "--to", target, "--out", tmp_path / "d", "--no-validate")
    run_in_process(model_name, *reference, check=True)  # what to compare with, not what is tested
    assert_same_tensors(output_tensors(tmp_path / "o"), output_tensors(tmp_path / "d"))
    info = manifest(tmp_path / "o")
    if not validate:
        family = FORMATS[fmt][0]
        assert info["validation"]["ok"] and len(info["validation"]["checks"]) == 1 + len(family.encode_outputs)
    assert info["source"]["format"] == fmt and f"source format: {fmt}" in result.stderr
    if FORMATS[fmt][1].training_key:  # SAT's discriminator is named, counted and reported, not converted
        assert info["source"]["dropped"] == {"training-discriminator": {"tensors": 1, "bytes": 64 * 3 * 4 * 4 * 4}}
        assert "dropped 1 tensor(s) by rule training-discriminator" in result.stderr


@pytest.fixture(scope="module")
def wan21_state(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan21")
    return save_diffusers(WAN, root / "vae", WAN.testing().small_configs["default-arch"]).state_dict(), root / "vae"


def _convert(model, source, out, *extra):
    return [model, "--source", source, "--to", "torchax", "--out", out, *extra]


def test_sat_file_without_its_wrapper(tmp_path):
    state = save_diffusers(COGVIDEOX, tmp_path / "vae", COGVIDEOX.testing().small_configs["default-arch"]).state_dict()
    bare = write_original(state, "cogvideox-sat", tmp_path / "3d-vae.pt", wrapper=None)
    out = tmp_path / "out"
    config = tmp_path / "vae" / "config.json"
    fails(_convert("cogvideox-2b", bare, out, "--config", config), InputError.exit_code, "'state_dict'", out=out)


def test_key_no_rule_knows(wan21_state, tmp_path):
    state, folder = wan21_state
    extra = {"decoder.upsamples.0.residual.0.scale": torch.ones(8)}
    source = write_original(state, "wan2.1-original", tmp_path / "Wan2.1_VAE.pth", extra=extra)
    out = tmp_path / "out"
    args = _convert("wan2.1", source, out, "--config", folder / "config.json")
    fails(args, InputError.exit_code, "'decoder.upsamples.0.residual.0.scale'", "matched by no rule", out=out)


def test_other_family_original_file(tmp_path):
    state = save_diffusers(COGVIDEOX, tmp_path / "vae", COGVIDEOX.testing().small_configs["default-arch"]).state_dict()
    source = write_original(state, "cogvideox-sat", tmp_path / "3d-vae.pt")
    out = tmp_path / "out"
    fails(_convert("wan2.1", source, out), InputError.exit_code, "cogvideox-sat", "`vae-convert cogvideox-2b`", out=out)


def test_forced_format_of_another_family(wan21_state, tmp_path):
    state, _ = wan21_state
    source = write_original(state, "wan2.1-original", tmp_path / "Wan2.1_VAE.pth")
    out = tmp_path / "out"
    args = _convert("wan2.1", source, out, "--source-format", "cogvideox-sat")
    fails(args, UsageError.exit_code, "--source-format cogvideox-sat", "wan2.1-original", out=out)


def test_drop_rule_that_would_swallow_a_model_key(wan21_state, tmp_path):
    """A mapping whose drop rule also matches model keys: refused as a mapping fault, whatever the file."""
    state, folder = wan21_state
    text = (MAPPINGS_DIR / "wan.yaml").read_text()
    greedy = "    drop:\n      - name: greedy\n        match: 'decoder\\.head\\..+'\n"
    anchor = "  wan2.2-original:\n"
    (tmp_path / "wan.yaml").write_text(text.replace(anchor, greedy + "\n" + anchor))
    source = write_original(state, "wan2.1-original", tmp_path / "Wan2.1_VAE.pth")
    out = tmp_path / "out"
    args = _convert("wan2.1", source, out, "--config", folder / "config.json", "--mapping", tmp_path / "wan.yaml")
    fails(args, MappingError.exit_code, "drop rule would swallow", "'decoder.head.0.gamma'", out=out)


def test_original_file_in_a_release_folder_ignores_the_config_beside_it(wan21_state, tmp_path):
    """The original repos keep the diffusion model's config.json beside the VAE file: it is not the VAE's config."""
    state, folder = wan21_state
    release = tmp_path / "Wan2.1-T2V-1.3B"
    release.mkdir()
    (release / "config.json").write_text(json.dumps({"_class_name": "WanModel", "dim": 1536}))
    source = write_original(state, "wan2.1-original", release / "Wan2.1_VAE.pth")
    shutil.copy(folder / "config.json", tmp_path / "vae-config.json")
    args = _convert("wan2.1", source, tmp_path / "out", "--config", tmp_path / "vae-config.json", "--no-validate")
    run_cli(*args)
    assert manifest(tmp_path / "out")["source"]["format"] == "wan2.1-original"
