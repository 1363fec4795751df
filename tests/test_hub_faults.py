"""The Hub as it really behaves, against the loopback Hub's injected faults: transient errors retried (the same output
as a clean run), corrupt bytes refused (downloaded or rotted in the cache), a silent Hub ended within the bound, and
publishing that never commits twice nor loses the local output."""

from __future__ import annotations

import hashlib
import shutil
import time

import pytest

from converter.errors import InputError, OutputError
from tests.conftest import WAN_REPO
from tests.helpers import fails, manifest, run_cli

WEIGHTS = "vae/diffusion_pytorch_model.safetensors"
API_INFO = rf"^/api/models/{WAN_REPO}/revision/"
RESOLVE_WEIGHTS = rf"/resolve/[^/]+/{WEIGHTS}$"


def _convert(out, *extra, **kwargs):
    return run_cli("wan2.1", "--to", "torchax", "--out", out, "--no-validate", *extra, **kwargs)


def _weights(out) -> bytes:
    return (out / "diffusion_pytorch_model.safetensors").read_bytes()


def _repo_info_requests(hub) -> int:
    return sum(1 for method, path in hub.requests if method == "GET" and "/revision/" in path)


def _weights_of_clean_run(wan_small, tmp_path) -> bytes:
    """The weights converted from the local checkpoint the Hub serves."""
    _convert(tmp_path / "clean", "--source", wan_small[0])
    return _weights(tmp_path / "clean")


def _blob(tmp_path):
    blobs = list((tmp_path / "hf-cache").glob("models--*/blobs/*"))
    return next(p for p in blobs if p.stat().st_size > 100_000)


@pytest.mark.parametrize(
    "method, path, options",
    [
        ("GET", API_INFO, {"status": 503, "times": 2}),
        pytest.param("GET", API_INFO, {"status": 429, "retry_after": "0.2"}, marks=pytest.mark.slow),
        pytest.param("HEAD", RESOLVE_WEIGHTS, {"status": 503, "times": 2}, marks=pytest.mark.slow),
        ("GET", RESOLVE_WEIGHTS, {"status": 502, "times": 2}),
        pytest.param("GET", RESOLVE_WEIGHTS, {"status": 429, "retry_after": "0"}, marks=pytest.mark.slow),
    ],
    ids=["api-503-twice", "api-429", "head-503-twice", "download-502-twice", "download-429"],
)
def test_transient_errors_are_retried_to_the_same_output(hub, wan_small, tmp_path, method, path, options):
    fault = hub.fault(method, path, "status", **options)
    started = time.monotonic()
    _convert(tmp_path / "out")
    assert fault.times == 0  # every injected failure was met, and retried past
    assert time.monotonic() - started < 30
    assert _weights(tmp_path / "out") == _weights_of_clean_run(wan_small, tmp_path)


def test_a_cut_download_is_resumed(hub, wan_small, tmp_path):
    hub.fault("GET", RESOLVE_WEIGHTS, "cut")
    _convert(tmp_path / "out")
    assert _weights(tmp_path / "out") == _weights_of_clean_run(wan_small, tmp_path)


def test_flipped_bytes_are_refused_then_fetched_anew(hub, tmp_path):
    hub.fault("GET", RESOLVE_WEIGHTS, "flip")
    true_digest = hashlib.sha256(hub.repos[WAN_REPO].files[WEIGHTS]).hexdigest()
    line = fails(
        ["wan2.1", "--to", "torchax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "diffusion_pytorch_model.safetensors is corrupt",
        f"the Hub's is {true_digest}",
        "run again to download it anew",
        out=tmp_path / "out",
    )
    assert line.count("sha256") == 1 and len(line.split("its sha256 is ")[1].split(",")[0]) == 64
    downloads = len(hub.downloads())
    _convert(tmp_path / "out")  # the corrupt copy was removed from the cache: fetched again, and it is right
    assert len(hub.downloads()) > downloads
    source = manifest(tmp_path / "out")["source"]
    assert source["sha256"]["diffusion_pytorch_model.safetensors"] == true_digest
    assert source["verified"] == "sha256 equal to the Hub's"
    assert "verified: sha256 equal to the Hub's" in run_cli("info", tmp_path / "out").stdout


def test_a_rotten_cached_blob_is_refused(hub, tmp_path):
    _convert(tmp_path / "first")
    blob = _blob(tmp_path)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    fails(
        ["wan2.1", "--to", "torchax", "--out", tmp_path / "out", "--offline"],
        InputError.exit_code,
        "is corrupt",
        out=tmp_path / "out",
    )
    assert not blob.exists()


def test_a_cache_of_plain_files_is_checked_against_the_hub_or_said_unchecked(hub, tmp_path, monkeypatch):
    """A cache copied dereferenced (or made where links are unsupported) names no digest: online the Hub is asked
    and tampered bytes are refused; offline the manifest and `info` say the file was not verified."""
    _convert(tmp_path / "first")
    plain = shutil.copytree(tmp_path / "hf-cache", tmp_path / "plain-cache")  # links followed: plain files
    weights = next(plain.glob(f"models--*/snapshots/*/{WEIGHTS}"))
    assert not weights.is_symlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(plain))
    _convert(tmp_path / "offline", "--offline")
    source = manifest(tmp_path / "offline")["source"]
    assert source["verified"].startswith("no: the cache names no Hub digest for diffusion_pytorch_model.safetensors")
    assert "verified: no: " in run_cli("info", tmp_path / "offline").stdout
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    fails(
        ["wan2.1", "--to", "torchax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "is corrupt",
        out=tmp_path / "out",
    )


def test_a_silent_hub_ends_within_the_bound(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("VAE_CONVERT_HUB_TIMEOUT", "0.5")
    monkeypatch.setenv("VAE_CONVERT_HUB_RETRY_SECONDS", "1")
    hub.fault("GET", API_INFO, "stall", times=100, seconds=5)
    started = time.monotonic()
    fails(
        ["wan2.1", "--to", "torchax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "did not answer",
        "within 0.5 s (VAE_CONVERT_HUB_TIMEOUT)",
        out=tmp_path / "out",
    )
    assert time.monotonic() - started < 15


def test_a_hub_that_keeps_failing_gives_up_with_one_line(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("VAE_CONVERT_HUB_RETRIES", "2")
    hub.fault("GET", API_INFO, "status", status=503, times=100)
    fails(
        ["wan2.1", "--to", "torchax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "503",
        "gave up after retries",
        out=tmp_path / "out",
    )
    assert _repo_info_requests(hub) == 3  # the first try and 2 retries


def test_client_errors_are_not_retried(hub, tmp_path):
    hub.fault("GET", API_INFO, "status", status=403, times=100)
    fails(["wan2.1", "--to", "torchax", "--out", tmp_path / "out"], InputError.exit_code, out=tmp_path / "out")
    assert _repo_info_requests(hub) == 1


@pytest.fixture
def published(hub, tmp_path, wan_small, monkeypatch):
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    monkeypatch.setenv("HF_TOKEN", "write-token")
    return tmp_path / "out"


@pytest.mark.parametrize("kind", ["status", "status-after"], ids=["503-not-landed", "504-after-landing"])
def test_publishing_retries_a_commit_without_committing_twice(hub, published, kind):
    hub.fault("POST", r"/commit/", kind, status=503 if kind == "status" else 504)
    hub.fault("POST", r"/api/repos/create", "status", status=502)  # creating the repo is safe to repeat
    result = run_cli("publish", published, "me/wan-tx")
    assert len(hub.commits) == 1 and len(hub.repos["me/wan-tx"].log) == 1
    assert hub.repos["me/wan-tx"].log[0]["id"] in result.stdout


def test_publishing_that_keeps_failing_keeps_the_output(hub, published, monkeypatch):
    monkeypatch.setenv("VAE_CONVERT_HUB_RETRIES", "2")
    before = {p.name: p.read_bytes() for p in published.iterdir()}
    hub.fault("POST", r"/commit/", "status", status=503, times=100)
    fails(["publish", published, "me/wan-tx"], OutputError.exit_code, "503", "gave up after retries")
    assert hub.commits == [] and {p.name: p.read_bytes() for p in published.iterdir()} == before
