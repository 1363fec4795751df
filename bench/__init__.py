"""Benchmarks: `python -m bench.run` (see bench/run.py)."""

import argparse
import json
import os
from pathlib import Path


def xla_flags_with_devices(count: int) -> str:
    """XLA_FLAGS for a child process with `count` simulated CPU devices, this process's other flags kept."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()


def diffusers_class_of(folder) -> type:
    """diffusers' class of a diffusers checkpoint or torchax output folder (config.json's `_class_name`), wherever
    diffusers keeps it (a vocoder's is beside its pipeline)."""
    from converter.registry import family_for_class

    return family_for_class(json.loads((Path(folder) / "config.json").read_text())["_class_name"]).diffusers_class()


def diffusers_decode(model, z, **inputs):
    """A diffusers model's decode as its pipelines call it: `decode(z).sample`, or, for a class that is a decoder
    only (a vocoder), `model(z)`."""
    return model.decode(z, **inputs).sample if hasattr(model, "decode") else model(z, **inputs)


def arguments_or_task(parser: argparse.ArgumentParser, tasks: dict) -> argparse.Namespace | None:
    """A benchmark script's arguments; or, where it was started as one of its own tasks in a fresh process (`--task
    NAME JSON`), None: the task has run and its result is printed, the last line, which the parent reads."""
    parser.add_argument("--task", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if not args.task:
        return args
    print(json.dumps(tasks[args.task](**json.loads(rest[0]))))
    return None
