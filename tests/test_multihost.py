"""A multi-process JAX job, as TPU pods and GPU clusters run one process per host: 2 processes of 4 CPU devices on
loopback (gloo collectives). A converted output loaded onto meshes that span both processes decodes, plain and tiled,
to the single-process results once gathered."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import converter
from converter.registry import FAMILIES
from tests.helpers import REPO, with_simulated_devices

pytestmark = pytest.mark.slow  # a 2-process JAX job

PROCESSES, DEVICES_EACH = 2, 4
RTOL = 1e-5  # relative to the output's scale, as tests/test_sharding.py


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out, results, channels, timeout=300) -> list[subprocess.CompletedProcess]:
    """Starts every process of the job; each still running after `timeout` is killed by its PID."""
    env = {
        **with_simulated_devices(DEVICES_EACH),
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    port = _free_port()
    worker = REPO / "tests" / "multihost_worker.py"
    processes = [
        subprocess.Popen(
            [sys.executable, worker, out, str(port), str(PROCESSES), str(rank), results, str(channels)],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(PROCESSES)
    ]
    deadline, outputs = time.monotonic() + timeout, []
    try:
        for process in processes:
            try:
                output, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
            outputs.append((process.returncode, output))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return outputs


def test_a_two_process_job_decodes_as_one_process(wan_small_outputs, tmp_path):
    flax_output = wan_small_outputs["flax"]
    model = converter.load(flax_output)
    channels = FAMILIES["wan"].validation_latent_shape(model.config)[1]
    results = tmp_path / "results.npz"
    outputs = _launch(flax_output, results, channels)
    for code, output in outputs:
        assert code == 0, output[-4000:]
    got = np.load(results)

    z = np.random.default_rng(0).standard_normal((2, 3, 4, 8, channels)).astype(np.float32)
    for name, frames in (("decode 1x8", z), ("decode 2x4", z[:, :1])):
        expected = np.asarray(model.decode(frames))
        assert got[name].shape == expected.shape
        assert np.abs(got[name] - expected).max() <= RTOL * max(1.0, np.abs(expected).max()), name
    model.enable_tiling(
        tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24, tile_sample_stride_width=24
    )
    tiled = np.asarray(model.decode(z[:, :1, :3, :6]))
    assert np.abs(got["tiled decode 2x1"] - tiled).max() <= RTOL * max(1.0, np.abs(tiled).max())
