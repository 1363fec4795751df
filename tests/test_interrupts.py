"""Ctrl-C or SIGTERM at any moment of a conversion, validation included, ends with exit 130 and leaves nothing (or,
once the final rename is done, the complete output, as the error line says)."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, environment_without_compile_cache, manifest, only

pytestmark = pytest.mark.slow  # conversions signalled at many moments


RUNS = 4


def _start(source, out):
    # without the suite's compilation cache: each run compiles as the calibration did, and a killed one cannot leave
    # a half-written entry behind
    return subprocess.Popen(
        [sys.executable, "-m", "converter", "wan2.1", "--source", str(source), "--to", "flax", "--out", str(out)],
        cwd=REPO,
        env=environment_without_compile_cache(),
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
            duration *= 0.8  # a calibration slowed by other work would otherwise put every later moment past the end
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


NOISY_TEARDOWN = """
import os, signal, sys, threading, time
from converter import output
from converter.__main__ import _interrupted

failing = threading.Event()


def writer():  # a writer thread whose files vanish under it, as Orbax's do when the handler removes the work folder
    failing.wait()
    while True:
        print("Traceback (most recent call last):", file=sys.stderr, flush=True)
        time.sleep(0.001)


class Folder:
    def abandon(self):
        failing.set()
        time.sleep(0.2)
        return True


output._IN_PROGRESS.add(Folder())
threading.Thread(target=writer, daemon=True).start()
signal.signal(signal.SIGTERM, _interrupted)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(10)
"""


def test_the_error_line_is_all_an_interrupt_prints():
    """Other threads failing while the handler undoes the run do not bury its error line."""
    done = subprocess.run([sys.executable, "-c", NOISY_TEARDOWN], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr == "error: interrupted; nothing was written\n"
