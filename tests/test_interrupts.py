"""Ctrl-C or SIGTERM at any moment of a conversion, validation included, ends with exit 130 and leaves nothing (or,
once the final rename is done, the complete output, as the error line says)."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time

from tests.helpers import REPO, manifest, only

RUNS = 10


def _start(source, out):
    return subprocess.Popen(
        [sys.executable, "-m", "converter", "wan2.1", "--source", str(source), "--to", "flax", "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_interrupts_at_moments_spread_over_the_run(wan_small, tmp_path):
    source, _ = wan_small
    shutil.copytree(source, tmp_path / "source")
    started = time.monotonic()
    calibration = _start(tmp_path / "source", tmp_path / "calibration")
    assert calibration.wait(timeout=300) == 0, calibration.stderr.read()
    duration = time.monotonic() - started
    shutil.rmtree(tmp_path / "calibration")
    rng = random.Random(0)
    outcomes = []
    while len(outcomes) < RUNS:
        # one random moment in each of RUNS equal slices of the run, from just after start-up (imports) to well
        # inside validation, which ends it
        slice_start = 0.05 + 0.75 * len(outcomes) / RUNS
        moment = (slice_start + rng.uniform(0, 0.75 / RUNS)) * duration
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        process = _start(tmp_path / "source", tmp_path / "out")
        time.sleep(moment)
        if process.poll() is not None:  # this run was quicker than the calibration: no moment to interrupt
            shutil.rmtree(tmp_path / "out")
            continue
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=300)
        outcomes.append((round(moment, 2), sig.name, process.returncode))
        assert process.returncode == 130, (outcomes, stderr[-2000:])
        assert "error: interrupted" in stderr and "Traceback" not in stderr, stderr[-2000:]
        if "was already complete and stays" in stderr:  # the signal came after the final rename (a quicker run)
            assert manifest(tmp_path / "out")["validation"]["ok"]
            shutil.rmtree(tmp_path / "out")
        only(tmp_path, "source")
