"""Every published vae/config.json in tests/data/configs (verbatim copies; Wan 2.2's reconstructed from a verbatim
re-save) plans with --dry-run under its model's name, beside weights of the shapes it implies. The weights are a
sparse file: only the safetensors header is written, so the 2.8 GB Wan 2.2 checkpoint costs no disk."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from converter.registry import MODELS, config_from_dict
from converter.targets import meta_torch
from tests.helpers import DATA, fails, run_in_process

CONFIGS = DATA / "configs"
CONFIG_FILES = sorted(CONFIGS.glob("*.json"))


# files named after the model rather than the repo their config was copied from
COPIED_FROM = {"Lightricks/LTX-Video-0.9.0": "diffusers/LTX-Video-0.9.0"}


def _model_of(path: Path) -> str:
    """The model name whose Hub repo the file was taken from (file names are the repo id with / as _)."""
    repo_id = path.name.removesuffix(".vae-config.json").removesuffix(".reconstructed").replace("_", "/", 1)
    repo_id = COPIED_FROM.get(repo_id, repo_id)
    names = [name for name, entry in MODELS.items() if entry.repo_id == repo_id]
    assert names, f"{path.name}: no model name for {repo_id}"
    return names[0]


def _ids(paths):
    return [p.name.split(".vae")[0] for p in paths]


def _source_folder(config_file: Path, folder: Path) -> Path:
    """config.json as published, and a float32 safetensors file of the shapes it implies, holding no data."""
    entry = MODELS[_model_of(config_file)]
    raw = json.loads(config_file.read_text())
    folder.mkdir()
    shutil.copy(config_file, folder / "config.json")
    header, offset = {}, 0
    for key, tensor in meta_torch(entry.family, config_from_dict(entry.family, raw)).state_dict().items():
        size = 4 * tensor.numel()
        header[key] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(folder / "diffusion_pytorch_model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        f.truncate(8 + len(encoded) + offset)
    return folder


def test_every_published_config_is_here():
    assert len(CONFIG_FILES) >= 5, f"expected the published configs in {CONFIGS}"


def test_a_config_of_a_class_not_converted_is_refused_by_name(wan_small, tmp_path):
    """Mochi's VAE config (a diffusers class no family converts) beside Wan weights."""
    source = shutil.copytree(wan_small[0], tmp_path / "vae")
    (source / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLMochi", "latent_channels": 12}))
    fails(
        ["wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out"],
        3,
        "config.json is for AutoencoderKLMochi, not AutoencoderKLWan",
        out=tmp_path / "out",
        in_process=True,
    )


@pytest.mark.parametrize("config_file", CONFIG_FILES, ids=_ids(CONFIG_FILES))
def test_published_config_plans_under_its_model_name(config_file, tmp_path):
    source = _source_folder(config_file, tmp_path / "vae")
    raw = json.loads(config_file.read_text())
    for target in ("flax", "torchax"):
        out = tmp_path / target
        # a plan needs no process of its own: in this one (helpers.run_in_process)
        result = run_in_process(_model_of(config_file), "--source", source, "--to", target, "--out", out, "--dry-run")
        assert "plan:" in result.stdout and "every key mapped" in result.stdout, result.stdout
        assert not out.exists()
        # keys the pinned diffusers no longer takes are said, and only those
        assert ("ignoring clip_output" in result.stdout) == ("clip_output" in raw), result.stdout


def test_a_wan22_checkpoint_named_as_wan21_is_refused(tmp_path):
    wan22 = next(p for p in CONFIG_FILES if _model_of(p) == "wan2.2")
    source = _source_folder(wan22, tmp_path / "vae")
    fails(
        ["wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out", "--dry-run"],
        3,
        "is a Wan 2.2 VAE, but wan2.1 names a Wan 2.1 VAE",
        "vae-convert wan2.2",
        out=tmp_path / "out",
        in_process=True,
    )
