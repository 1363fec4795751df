"""Hub sources and publishing with real huggingface_hub code against a loopback Hub (HF_ENDPOINT), plus sharded
checkpoints and the model card."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from safetensors.torch import load_file, save_file

from converter.errors import InputError, OutputError
from converter.publish import model_card
from converter.safetensors_io import SafetensorsFile
from tests.conftest import WAN_REPO
from tests.fake_hub import Repo
from tests.helpers import fails, manifest, run_cli


def test_registry_model_fetches_only_the_vae_then_works_offline(hub, tmp_path):
    run_cli("wan2.1", "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    fetched = {path.split("/resolve/", 1)[1].split("/", 1)[1] for path in hub.downloads()}
    assert fetched == {"vae/config.json", "vae/diffusion_pytorch_model.safetensors"}
    assert manifest(tmp_path / "out")["source"]["revision"] == hub.repos[WAN_REPO].sha
    before = len(hub.requests)
    run_cli("wan2.1", "--to", "torchax", "--out", tmp_path / "again", "--no-validate", "--offline")
    assert len(hub.requests) == before  # the cache alone served it


def test_repo_id_source_with_revision(hub, tmp_path):
    run_cli("wan2.1", "--source", f"{WAN_REPO}@v1", "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    assert ("GET", f"/api/models/{WAN_REPO}/revision/v1") in hub.requests
    fails(
        ["wan2.1", "--source", WAN_REPO, "--revision", "v2", "--to", "flax", "--out", tmp_path / "out2"],
        InputError.exit_code,
        "revision 'v2' not found in Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
    )


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing-repo", "Hub repo nobody/nothing not found"),
        ("gated", "nobody/gated is gated: accept its terms"),
        ("no-vae", "nobody/no-vae@main has no VAE weights in its vae/ folder"),
    ],
)
def test_hub_errors(hub, tmp_path, case, message):
    hub.repos["nobody/gated"] = Repo({"vae/config.json": b"{}"}, gated=True)
    hub.repos["nobody/no-vae"] = Repo({"transformer/config.json": b"{}"})
    repo = {"missing-repo": "nobody/nothing", "gated": "nobody/gated", "no-vae": "nobody/no-vae"}[case]
    fails(["wan2.1", "--source", repo, "--to", "flax", "--out", tmp_path / "out"], InputError.exit_code, message)
    assert not (tmp_path / "out").exists()


def test_offline_with_nothing_cached(hub, tmp_path):
    fails(
        ["wan2.1", "--to", "flax", "--out", tmp_path / "out", "--offline"],
        InputError.exit_code,
        "not in the local Hugging Face cache and offline mode is on",
    )
    assert hub.requests == []


def test_dry_run_fetches_and_writes_nothing(hub, tmp_path):
    result = run_cli("wan2.1", "--to", "flax", "--out", tmp_path / "out", "--dry-run")
    assert "fetch   vae/diffusion_pytorch_model.safetensors" in result.stdout and "to fetch:" in result.stdout
    assert "transformer/" not in result.stdout
    assert hub.downloads() == [] and not (tmp_path / "out").exists() and not (tmp_path / "hf-cache").exists()
    run_cli("wan2.1", "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    result = run_cli("wan2.1", "--to", "flax", "--out", tmp_path / "out", "--dry-run")
    assert "cached  vae/diffusion_pytorch_model.safetensors" in result.stdout
    assert "plan: 194 tensors, every key mapped to a flax leaf" in result.stdout
    assert "exists; pass --force" in result.stdout and "a conversion would stop here" in result.stdout


def test_push_to_hub_commits_output_and_card(hub, tmp_path, wan_small, monkeypatch):
    source, _ = wan_small
    monkeypatch.setenv("HF_TOKEN", "write-token")
    result = run_cli(
        "wan2.1",
        "--source",
        source,
        "--to",
        "torchax",
        "--out",
        tmp_path / "out",
        "--push-to-hub",
        "my-org/wan-tx",
        "--private",
        "--commit-message",
        "first upload",
    )
    assert "write-token" not in result.stdout + result.stderr
    assert hub.created == [{"name": "wan-tx", "organization": "my-org", "visibility": "private"}]
    commit = hub.commits[-1]
    expected = {p.name for p in (tmp_path / "out").iterdir()} | {"README.md"}
    assert set(commit["files"]) == expected and commit["summary"] == "first upload"
    assert commit["authorization"] == "Bearer write-token"
    assert (
        commit["files"]["diffusion_pytorch_model.safetensors"]
        == (tmp_path / "out" / "diffusion_pytorch_model.safetensors").read_bytes()
    )
    card = commit["files"]["README.md"].decode()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["library_name"] == "diffusers" and {"jax", "torchax", "wan2.1"} <= set(meta["tags"])
    assert "✓ published" in result.stdout


def test_publish_existing_output_as_pull_request(hub, tmp_path, wan_small, monkeypatch):
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    monkeypatch.setenv("HF_TOKEN", "write-token")
    result = run_cli("publish", tmp_path / "out", "me/wan-flax", "--create-pr")
    assert hub.commits[-1]["create_pr"] and "/discussions/1" in result.stdout
    assert any(name.startswith("state/") for name in hub.commits[-1]["files"])  # the Orbax checkpoint's files


@pytest.mark.parametrize(
    "token, repo, message",
    [
        (None, "me/x", "needs a Hugging Face token"),
        ("read-token", "me/x", "is read-only"),
        ("write-token", "other-org/x", "cannot write to other-org/"),
    ],
)
def test_write_access_is_checked_before_converting(hub, tmp_path, wan_small, monkeypatch, token, repo, message):
    source, _ = wan_small
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    result = run_cli(
        "wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out", "--push-to-hub", repo, check=False
    )
    assert result.returncode == OutputError.exit_code and message in result.stderr, result.stderr
    assert "converting" not in result.stderr and not (tmp_path / "out").exists()
    assert hub.commits == []


def test_model_card_content():
    info = {
        "tool": "vae-convert",
        "version": "9.9",
        "family": "wan",
        "model": "wan2.1",
        "target": "flax",
        "format": "orbax",
        "dtype": "bfloat16",
        "source": {"origin": WAN_REPO, "files": ["x"], "revision": "abc123"},
        "mapping": {"file": "wan.yaml", "sha256": "f" * 64},
        "validation": {
            "checks": [
                {
                    "output": "decode",
                    "shape": [1, 3, 9, 64, 64],
                    "max_abs": 2e-6,
                    "mean_abs": 1e-7,
                    "tol": 1e-4,
                    "ok": True,
                }
            ]
        },
    }
    card = model_card(info, "me/wan-flax")
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["base_model"] == WAN_REPO and meta["library_name"] == "flax"
    assert {"jax", "flax", "orbax", "wan2.1"} <= set(meta["tags"])
    for fact in (
        "`abc123`",
        "vae-convert 9.9",
        "bfloat16",
        "`wan.yaml`",
        "| decode | 1x3x9x64x64 | 2.00e-06",
        'snapshot_download("me/wan-flax")',
        "converter.load(path)",
    ):
        assert fact in card, fact


def _shard(source, folder):
    """The small checkpoint split into two shards with a diffusers-style index."""
    state = load_file(source / "diffusion_pytorch_model.safetensors")
    keys = sorted(state)
    halves = {
        "diffusion_pytorch_model-00001-of-00002.safetensors": keys[: len(keys) // 2],
        "diffusion_pytorch_model-00002-of-00002.safetensors": keys[len(keys) // 2 :],
    }
    folder.mkdir()
    weight_map = {}
    for name, names in halves.items():
        save_file({k: state[k] for k in names}, folder / name)
        weight_map.update(dict.fromkeys(names, name))
    (folder / "config.json").write_bytes((source / "config.json").read_bytes())
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index, weight_map


def test_sharded_checkpoint_converts_like_the_single_file(wan_small, tmp_path):
    source, _ = wan_small
    index, _ = _shard(source, tmp_path / "sharded")
    run_cli("wan2.1", "--source", tmp_path / "sharded", "--to", "torchax", "--out", tmp_path / "a", "--no-validate")
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "b", "--no-validate")
    a = SafetensorsFile(tmp_path / "a" / "diffusion_pytorch_model.safetensors")
    b = SafetensorsFile(tmp_path / "b" / "diffusion_pytorch_model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a.keys())
    assert len(manifest(tmp_path / "a")["source"]["sha256"]) == 2


def test_sharded_index_disagreeing_with_shards(wan_small, tmp_path):
    source, _ = wan_small
    index, weight_map = _shard(source, tmp_path / "sharded")
    key = next(iter(weight_map))
    other = next(name for name in set(weight_map.values()) if name != weight_map[key])
    index.write_text(json.dumps({"weight_map": {**weight_map, key: other}}))
    fails(
        ["wan2.1", "--source", index, "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        f"index puts {key!r} in {other}",
    )


@pytest.mark.parametrize("kind", ["repo-root", "vae-folder", "single-file"])
def test_local_source_kinds(wan_small, tmp_path, kind):
    source, _ = wan_small
    root = tmp_path / "pipeline"
    (root / "vae").mkdir(parents=True)
    for p in source.iterdir():
        (root / "vae" / p.name).write_bytes(p.read_bytes())
    given = {
        "repo-root": root,
        "vae-folder": root / "vae",
        "single-file": root / "vae" / "diffusion_pytorch_model.safetensors",
    }[kind]
    run_cli("wan2.1", "--source", given, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    assert manifest(tmp_path / "out")["source"]["origin"] == str(given)


def test_publish_to_a_branch(hub, tmp_path, wan_small, monkeypatch):
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    monkeypatch.setenv("HF_TOKEN", "write-token")
    run_cli("publish", tmp_path / "out", "me/wan-tx", "--revision", "dev")
    assert ("POST", "/api/models/me/wan-tx/branch/dev") in hub.requests
    assert hub.commits[-1]["revision"] == "dev" and not hub.commits[-1]["create_pr"]
