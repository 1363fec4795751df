"""The benchmark's smoke mode runs end to end and reports every measurement (the full run is bench/run.py)."""

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow  # the benchmark's every task, each a fresh process


def test_benchmark_smoke_mode(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    results = json.loads((tmp_path / "smoke.json").read_text())
    wan = results["models"]["wan2.1"]
    assert set(wan["convert"]) == {"flax", "torchax", "naive"}
    assert all(m["seconds"] > 0 and m["peak_above_baseline_mb"] >= 0 for m in wan["convert"].values())
    assert wan["whole process"]["vae-convert"] > 0 and wan["whole process"]["naive"] > 0
    loads = ("flax", "flax safetensors", "flax kept structure", "flax safetensors kept structure", "torchax")
    assert all(wan["load"][how]["seconds"] > 0 for how in (*loads, "diffusers"))
    assert all(seconds > 0 for seconds in wan["load"]["flax parts"].values())
    for impl in ("flax", "torch"):
        timings = wan["run"][impl]
        assert all(timings[step][k] > 0 for step in ("decode", "encode") for k in ("first", "steady"))
    # compiled, never run: every step shape, XLA's memory analysis, and width split over "tp" on (1, 8)
    one, split = wan["compile"]["one device"], wan["compile"]["mesh (1, 8)"]
    for part in ("encoder", "decoder"):
        assert one[part]["steps"] == split[part]["steps"] == 2  # first chunk, then the rest
        assert one[part]["compile_seconds"] > 0 and one[part]["cache_frames"] == 2
        assert 0 < split[part]["temp_bytes"] < one[part]["temp_bytes"]
        assert one[part]["cache_bytes"] == split[part]["cache_bytes"]  # the same cache, split over devices
    table = (tmp_path / "smoke.md").read_text()
    assert "| wan2.1 | flax |" in table and "vae-convert torchax" in table and "| wan2.1 | mesh (1, 8) |" in table
    assert "whole process: vae-convert flax" in table
    # a full run's rows: diffusers is the eager reference (no torch row), flax+cache times first calls only
    from bench.run import markdown

    runs = wan["run"]
    runs["diffusers"] = runs.pop("torch")
    runs["flax+cache"] = {step: {"first": runs["flax"][step]["first"]} for step in ("decode", "encode")}
    full = markdown(results)
    assert "| wan2.1 | diffusers |" in full and "| torch |" not in full
    assert f"| wan2.1 | flax+cache | {runs['flax']['decode']['first']:.2f} s | - |" in full
