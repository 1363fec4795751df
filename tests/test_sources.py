"""Source resolution against real huggingface_hub code, offline, on a cache laid out as huggingface_hub lays it
out; and bf16 sources converted without a detour through float32."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch

from converter.safetensors_io import SafetensorsFile
from tests.conftest import WAN
from tests.helpers import manifest, run_cli, save_diffusers

REPO_ID = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"  # the registry's repo for `wan2.1`


def _hub_cache(cache, vae_folder, commit="0123456789abcdef0123456789abcdef01234567"):
    """models--org--name/{refs/main, blobs/<hash>, snapshots/<commit>/vae/<file> -> blob}."""
    repo = cache / ("models--" + REPO_ID.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / commit / "vae"
    snapshot.mkdir(parents=True)
    for file in vae_folder.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    return commit


def test_registry_model_resolves_from_the_hub_cache_offline(wan_small, tmp_path, monkeypatch):
    source, _ = wan_small
    commit = _hub_cache(tmp_path / "hub", source)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run_cli("wan2.1", "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    digest = hashlib.sha256((source / "diffusion_pytorch_model.safetensors").read_bytes()).hexdigest()
    assert manifest(tmp_path / "out")["source"] == {
        "origin": REPO_ID,
        "files": ["diffusion_pytorch_model.safetensors"],
        "revision": commit,
        "sha256": {"diffusion_pytorch_model.safetensors": digest},
        "verified": "sha256 equal to the Hub's",
        "format": "diffusers",
    }


@pytest.mark.slow
def test_bf16_source_stays_bf16_bit_for_bit(tmp_path):
    model = save_diffusers(WAN, tmp_path / "vae", WAN.testing().small_configs["default-arch"])
    model.to(torch.bfloat16).save_pretrained(tmp_path / "vae-bf16")
    result = run_cli(
        "wan2.1",
        "--source",
        tmp_path / "vae-bf16",
        "--to",
        "flax",
        "--format",
        "safetensors",
        "--out",
        tmp_path / "out",
        "--no-validate",  # the bits are compared
    )
    assert "auto -> bfloat16" in result.stderr
    source = SafetensorsFile(tmp_path / "vae-bf16" / "diffusion_pytorch_model.safetensors")
    out = SafetensorsFile(tmp_path / "out" / "flax_model.safetensors")
    kernel = out["encoder.down_blocks.10.conv1.kernel"]
    assert kernel.dtype.name == "bfloat16"
    expected = source["encoder.down_blocks.10.conv1.weight"].transpose(2, 3, 4, 1, 0)
    assert np.array_equal(kernel.view(np.uint16), expected.view(np.uint16))


def test_manifest_records_absolute_source_paths(wan_small, tmp_path):
    source, _ = wan_small
    import shutil

    shutil.copytree(source, tmp_path / "vae")
    run_cli("wan2.1", "--source", "vae", "--to", "torchax", "--out", "out", "--no-validate", cwd=tmp_path)
    recorded = manifest(tmp_path / "out")["source"]
    assert recorded["origin"] == str(tmp_path / "vae") and recorded["sha256"]


def test_dry_run_with_hf_hub_offline_uses_the_cache(wan_small, tmp_path, monkeypatch):
    source, _ = wan_small
    _hub_cache(tmp_path / "hub", source)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run_cli("wan2.1", "--to", "flax", "--out", tmp_path / "out", "--dry-run")
    assert "cached  vae/diffusion_pytorch_model.safetensors" in result.stdout and "plan: " in result.stdout


def test_newcomer_output_has_no_warnings_and_help_lists_the_models(tmp_path):
    model = save_diffusers(WAN, tmp_path / "vae", WAN.testing().small_configs["default-arch"])
    model.to(torch.bfloat16).save_pretrained(tmp_path / "vae-bf16")
    result = run_cli("wan2.1", "--source", tmp_path / "vae-bf16", "--to", "torchax", "--out", tmp_path / "out")
    assert "Warning" not in result.stderr, result.stderr
    assert "wan2.1" in run_cli("--help").stdout


def test_a_release_split_by_part_is_read_from_either_file_or_its_folder(tmp_path):
    """Files `<stem>_encoder.*` and `<stem>_decoder.*` (TAESD's release) hold one part each, under keys that collide
    (`0.weight` in both): each file's keys are read under its part's name, whichever file or the folder is named."""
    from safetensors.torch import save_file

    from converter.errors import InputError
    from converter.registry import MODELS
    from converter.sources import resolve

    for part, value in (("encoder", 1.0), ("decoder", 2.0)):
        save_file({"0.weight": torch.full((2,), value)}, tmp_path / f"tiny_{part}.safetensors")
    entry = MODELS["sd1.5"]
    for named in (tmp_path, tmp_path / "tiny_encoder.safetensors", tmp_path / "tiny_decoder.safetensors"):
        weights = resolve(entry, str(named), None, offline=True).open_weights()
        assert {k: float(weights[k][0]) for k in weights.specs} == {"encoder.0.weight": 1.0, "decoder.0.weight": 2.0}
    (tmp_path / "tiny_decoder.safetensors").rename(tmp_path / "tiny_decoder.bak")
    with pytest.raises(InputError, match="tiny_decoder.safetensors is missing beside it"):
        resolve(entry, str(tmp_path / "tiny_encoder.safetensors"), None, offline=True)
    for part in ("encoder", "decoder"):
        save_file({"0.weight": torch.zeros(2)}, tmp_path / f"other_{part}.safetensors")
    with pytest.raises(InputError, match=r"several releases split by part \(other, tiny\)"):
        resolve(entry, str(tmp_path), None, offline=True)
