"""Benchmarks: `python -m bench.run` (see bench/run.py)."""

import os


def xla_flags_with_devices(count: int) -> str:
    """XLA_FLAGS for a child process with `count` simulated CPU devices, this process's other flags kept."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
