"""The benchmark's smoke mode runs end to end and reports every measurement (the full run is bench/run.py)."""

import json
import subprocess
import sys

from tests.helpers import REPO


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
    assert wan["load_flax"]["seconds"] > 0
    for impl in ("flax", "torch"):
        timings = wan["run"][impl]
        assert all(timings[step][k] > 0 for step in ("decode", "encode") for k in ("first", "steady"))
    table = (tmp_path / "smoke.md").read_text()
    assert "| wan2.1 | flax |" in table and "vae-convert torchax" in table
