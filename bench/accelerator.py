"""The accelerator table: each model at the resolution its pipelines run, decoded and encoded by Flax, torchax,
diffusers eager and diffusers under `torch.compile`, in float32 and bfloat16, on the machine's accelerator:

    python -m bench.accelerator                       # every row: hours of a GPU (a row and dtype, 4-10 minutes)
    python -m bench.accelerator --rows wan2.1 sd1.5   # the rows of some models
    python -m bench.accelerator --rows "flux.2-dev 1024x1024" --dtypes bfloat16 --budget 500   # what a lease allows
    python -m bench.accelerator --smoke               # small widths and sizes, on any machine (the tests run it)

Per row and dtype: a random checkpoint of the real architecture (`vae-convert random-checkpoint`), converted to each
target in that dtype (no validation); then, each in a fresh process, every implementation's first decode and encode
(compiling, for the jitted ones and torch.compile) with the peak device memory it reached, each implementation with
caches of its own (XLA keeps its autotuning results in JAX's, so a first call must not find another's), the jitted
ones' first calls again in another process that finds the persistent compilation cache the first filled, and the
steady calls of all of them taking turns in one process (the best of the rounds, each timed call after one of its
own). The rate is the steady call's operations (counted as bench.flops counts them: 2 per multiply-add of the
reference model's convolutions, matrix products and attention) over its time. Results:
bench/results/accelerator.{md,json}, written after every task, so that a lease that ends mid-row leaves what was
measured; with --budget no task starts once the seconds are spent, and one running then is stopped and noted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import arguments_or_task, diffusers_class_of, diffusers_decode
from bench.flops import count, encoded_shape
from bench.run import REPO, _device, _environment, _seconds_of, _vae_convert


@dataclasses.dataclass(frozen=True)
class Row:
    model: str
    sample: tuple[int, ...]  # channels-first: (B, C, T, H, W) video or (B, C, H, W) image
    tiled: bool = False  # tiling on (MiniMax-H3 tiles whatever this says: it was released tiled)

    @property
    def name(self) -> str:
        return f"{self.model} {'x'.join(map(str, self.sample[2:]))}{' tiled' if self.tiled else ''}"


ROWS = (
    Row("wan2.1", (1, 3, 81, 720, 1280)),
    Row("wan2.2", (1, 3, 81, 704, 1280)),  # TI2V-5B's 720p
    Row("ltx-video", (1, 3, 121, 704, 1216)),
    Row("hunyuanvideo", (1, 3, 129, 720, 1280), tiled=True),
    Row("flux.1-dev", (1, 3, 1024, 1024)),
    Row("flux.2-dev", (1, 3, 1024, 1024)),
    Row("flux.1-dev", (1, 3, 2048, 2048), tiled=True),
    Row("flux.2-dev", (1, 3, 2048, 2048), tiled=True),
    Row("minimax-h3", (1, 3, 124, 768, 1344)),
)
# the small widths (random-checkpoint --small) with tiling on: every path but a video's, which bench.run's smoke mode
# takes; one row of tiles with a short last column, two tile shapes a part where a grid compiles four
SMOKE_ROWS = (Row("sd1.5", (1, 3, 24, 96), tiled=True),)
IMPLEMENTATIONS = ("flax", "torchax", "diffusers", "diffusers+compile")
JITTED = ("flax", "torchax")
DTYPES = ("float32", "bfloat16")
SMOKE_DTYPES = ("bfloat16",)  # the paths that differ from float32's are the casts; a second dtype doubles the time
STEADY_ROUNDS = 2


def _calls(impl: str, path: str, dtype: str, latent: list, sample: list, tiled: bool, smoke: bool) -> dict:
    """{"decode": call, "encode": call} of one implementation in `dtype` on fixed inputs already on the device, each
    call returning once its outputs are computed, left there: the model's time, not the host's copies (a 121-frame
    704x1216 video is 1.2 GB of float32 to move)."""
    import numpy as np
    import torch

    import converter
    from converter.models.common.protocol import encoded
    from converter.registry import config_from_dict, family_for_class
    from converter.targets import TARGETS
    from converter.validate import decode_inputs

    rng = np.random.default_rng(0)
    z, x = rng.standard_normal(latent).astype(np.float32), rng.uniform(-1, 1, sample).astype(np.float32)
    raw = json.loads((Path(path) / "config.json").read_text())
    family = family_for_class(raw["_class_name"])
    inputs = decode_inputs(family, config_from_dict(family, raw))  # LTX's timestep (and noise seed), as validation
    if impl in JITTED:
        import jax

        vae = converter.load(path)
        if tiled:
            vae.enable_tiling()
        runner = TARGETS[impl].runner(vae, native=True)  # in the output's own dtype, as users run it
        z_in, x_in = runner.model_input(z), runner.model_input(x)
        if impl == "flax":
            decode, encode = (lambda: vae.decode(z_in, **inputs)), (lambda: vae.encode(x_in))
        else:
            conditions = {k: runner.model_input(v) for k, v in inputs.items()}
            decode, encode = (
                (lambda: runner.vae.decode(z_in, **conditions).sample.jax()),
                (lambda: [t.jax() for t in encoded(runner.vae.encode(x_in))]),
            )
        return {"decode": lambda: jax.block_until_ready(decode()), "encode": lambda: jax.block_until_ready(encode())}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype)
    model = diffusers_class_of(path).from_pretrained(path, torch_dtype=torch_dtype).eval().to(device)
    if tiled:
        model.enable_tiling()
    zt, xt = (torch.from_numpy(v).to(device, torch_dtype) for v in (z, x))
    # diffusers draws its noise itself (from torch's global generator): it takes the timestep only
    conditions = {k: torch.from_numpy(v).to(device, torch_dtype) for k, v in inputs.items() if k != "noise"}
    decode, encode = (lambda t: diffusers_decode(model, t, **conditions)), (lambda t: encoded(model.encode(t)))
    if impl == "diffusers+compile":  # as users compile it; in smoke mode without inductor's C++ build
        backend = "eager" if smoke else "inductor"
        decode, encode = torch.compile(decode, backend=backend), torch.compile(encode, backend=backend)

    def run(call, t):
        with torch.no_grad():
            out = call(t)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    return {"decode": lambda: run(decode, zt), "encode": lambda: run(encode, xt)}


def _peak_bytes(impl: str) -> int | None:
    """The peak device memory of this process so far: JAX's or PyTorch's allocator's (None on a CPU)."""
    if impl in JITTED:
        import jax

        stats = jax.local_devices()[0].memory_stats() or {}
        return stats.get("peak_bytes_in_use")
    import torch

    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None


def _use_compile_cache(impl: str, cache: str | None) -> None:
    """This process's compilation cache: JAX's persistent cache for the jitted ones (XLA keeps its autotuning results
    beside the executables), inductor's for torch.compile; None: none kept."""
    if cache is None:
        return
    if impl == "diffusers+compile":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    else:
        import converter

        converter.enable_compile_cache(cache)


def task_first(impl: str, cache: str | None, **call) -> dict:
    """One implementation's first decode and encode in a fresh process, and the peak device memory they reached."""
    _use_compile_cache(impl, cache)
    calls = _calls(impl, **call)
    return {**{part: _seconds_of(c) for part, c in calls.items()}, "peak_bytes": _peak_bytes(impl)}


def task_steady(paths: dict, cache: str, rounds: int, **call) -> dict:
    """Steady calls of every implementation in one process, taking turns (bench.run.task_steady's way)."""
    _use_compile_cache("diffusers+compile" if "diffusers+compile" in paths else "flax", cache)
    calls = {impl: _calls(impl, path, **call) for impl, path in paths.items()}
    for parts in calls.values():
        for _ in range(2):  # the first compiles (or reads the cache); the second may still be slower
            for c in parts.values():
                c()
    impls, best = list(calls), {impl: {"decode": float("inf"), "encode": float("inf")} for impl in calls}
    for r in range(rounds):
        for part in ("decode", "encode"):
            for impl in impls[r % len(impls) :] + impls[: r % len(impls)]:
                calls[impl][part]()
                best[impl][part] = min(best[impl][part], _seconds_of(calls[impl][part]))
    return best


TASKS = {"first": task_first, "steady": task_steady}


class OutOfTime(Exception):
    """The --budget is spent: the table keeps what was measured."""


class Clock:
    """The seconds a run may take (None: no limit); a task is given what is left."""

    def __init__(self, budget: float | None):
        self.deadline = None if budget is None else time.monotonic() + budget

    def left(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise OutOfTime
        return left


def _task(name: str, clock: Clock, **kwargs) -> dict:
    command = [sys.executable, "-m", "bench.accelerator", "--task", name, json.dumps(kwargs)]
    # JAX takes three quarters of a GPU's memory at its start unless told not to: PyTorch shares the steady process
    env = _environment({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    started, what = time.monotonic(), f"{name} {kwargs.get('impl') or ', '.join(kwargs['paths'])} {kwargs['dtype']}"
    try:
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=clock.left())
    except subprocess.TimeoutExpired:
        raise OutOfTime from None
    print(f"  {what}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"accelerator task {name} {kwargs.get('impl', '')} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(row: Row, work: Path, smoke: bool, dtypes: list[str], clock: Clock, measured: dict, save) -> None:
    """Fills `measured` (the row's results) task by task, calling `save` after each."""
    clock.left()  # a budget already spent makes no checkpoint
    source = work / "source"
    _vae_convert("random-checkpoint", row.model, source, *(["--small"] if smoke else []))
    latent = encoded_shape(row.model, list(row.sample), small=smoke)
    gflop = count(row.model, latent, list(row.sample), small=smoke)
    measured.update({"latent": latent, "sample": list(row.sample), "gflop": gflop, "dtypes": {}})
    for dtype in dtypes:
        clock.left()
        paths = {"diffusers": source, "diffusers+compile": source}
        for target in JITTED:
            paths[target] = work / f"{target}-{dtype}"
            args = ("--source", source, "--to", target, "--dtype", dtype, "--out", paths[target], "--no-validate")
            _vae_convert(row.model, *args)
        call = dict(dtype=dtype, latent=latent, sample=list(row.sample), tiled=row.tiled, smoke=smoke)
        paths = {impl: str(path) for impl, path in paths.items()}
        rounds = 1 if smoke else STEADY_ROUNDS
        m = measured["dtypes"][dtype] = {"first": {}, "cached": {}, "steady": {}}

        # Each implementation its own caches, new for the row: a first call finds no other's autotuning. JAX keys a
        # cache's entries by its folder's path (XLA's autotuning folder inside it is a compile option), so the jitted
        # ones take turns at one path, each one's entries moved aside after its calls, all of them back for the
        # steady process. torch.compile's tasks come last, its own compiling the likeliest to fail: a failure stops
        # the row, keeping the rest.
        jax_cache, kept = work / f"jax-cache-{dtype}", []
        for impl in JITTED:
            # the cached call is the first one again (smoke: its path has run already)
            for when in ("first",) if smoke else ("first", "cached"):
                m[when][impl] = _task("first", clock, impl=impl, path=paths[impl], cache=str(jax_cache), **call)
                save()
            if jax_cache.is_dir():
                kept.append(jax_cache.rename(work / f"{impl}-jax-cache-{dtype}"))
        m["first"]["diffusers"] = _task("first", clock, impl="diffusers", path=paths["diffusers"], cache=None, **call)
        save()
        for folder in kept:
            shutil.copytree(folder, jax_cache, dirs_exist_ok=True)
        # torch.compile's tracing asks for the current accelerator, which torchax's "jax" device, once registered,
        # answers with a device PyTorch cannot use: the compiled model takes its turns with diffusers eager alone
        eager = {impl: paths[impl] for impl in ("flax", "torchax", "diffusers")}
        m["steady"].update(_task("steady", clock, paths=eager, cache=str(jax_cache), rounds=rounds, **call))
        save()
        compile_cache = str(work / f"inductor-cache-{dtype}")
        m["first"]["diffusers+compile"] = _task(
            "first", clock, impl="diffusers+compile", path=paths["diffusers"], cache=compile_cache, **call
        )
        save()
        compiled = {impl: paths[impl] for impl in ("diffusers+compile", "diffusers")}
        m["steady"]["diffusers+compile"] = _task(
            "steady", clock, paths=compiled, cache=compile_cache, rounds=rounds, **call
        )["diffusers+compile"]
        save()


def markdown(results: dict) -> str:
    lines = [
        f"Machine: {results['device']}; {results['date']}; {results['mode']}.",
        "",
        "| model | dtype | implementation | part | first | first, cache | steady | vs eager | vs compiled "
        "| peak memory | rate |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["rows"].items():
        for dtype, m in row.get("dtypes", {}).items():
            for impl in IMPLEMENTATIONS:
                first, cached, steady = (m[k].get(impl, {}) for k in ("first", "cached", "steady"))
                if not first:
                    continue
                peak = first["peak_bytes"]
                for part in ("decode", "encode"):
                    # the goals' terms: how many times faster than diffusers eager and than diffusers compiled
                    speedups = [
                        f"{m['steady'][other][part] / steady[part]:.2f}x"
                        if part in steady and part in m["steady"].get(other, {})
                        else "-"
                        for other in ("diffusers", "diffusers+compile")
                    ]
                    rate = f"{row['gflop'][part] / steady[part]:,.0f} GFLOP/s" if part in steady else "-"
                    lines.append(
                        f"| {name} | {dtype} | {impl} | {part} | {first[part]:.3f} s | "
                        f"{f'{cached[part]:.3f} s' if part in cached else '-'} | "
                        f"{f'{steady[part] * 1e3:.1f} ms' if part in steady else '-'} | {' | '.join(speedups)} | "
                        f"{'-' if peak is None else f'{peak / 2**30:.2f} GiB'} | {rate} |"
                    )
    lines += [
        "",
        "first = the first call in a fresh process (compiling, for the jitted ones and torch.compile), with the peak "
        "device memory that process reached; first, cache = a second fresh process finding the persistent "
        "compilation cache the first filled; steady = the best of the rounds, the implementations taking turns in "
        "one process; vs eager, vs compiled = diffusers' steady time eager and under torch.compile over this one's "
        "(above 1: faster); rate = the operations bench.flops counts over the steady time; - = not measured.",
        *(f"Not finished: {name}, {row['stopped']}." for name, row in results["rows"].items() if "stopped" in row),
    ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small widths and sizes, on any machine")
    parser.add_argument("--rows", nargs="*", help="these rows, by model or by name (default: all), in this order")
    parser.add_argument("--dtypes", nargs="*", choices=DTYPES, help="these dtypes (default: both), in this order")
    parser.add_argument("--budget", type=float, help="seconds: no task starts after them, a running one is stopped")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = arguments_or_task(parser, TASKS)
    if args is None:
        return
    table = SMOKE_ROWS if args.smoke else ROWS
    rows = [r for wanted in args.rows for r in table if wanted in (r.model, r.name)] if args.rows else table
    dtypes = args.dtypes or (SMOKE_DTYPES if args.smoke else DTYPES)
    results = {"device": _device(), "date": time.strftime("%Y-%m-%d %H:%M"), "rows": {}}
    results["mode"] = "smoke" if args.smoke else "full"
    name = "accelerator-smoke" if args.smoke else "accelerator"
    args.out.mkdir(parents=True, exist_ok=True)

    def save():
        (args.out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / f"{name}.md").write_text(markdown(results))

    clock = Clock(args.budget)
    for row in rows:
        print(f"measuring {row.name} ...", file=sys.stderr)
        measured = results["rows"][row.name] = {}
        try:
            with tempfile.TemporaryDirectory(prefix="vae-convert-accelerator-") as work:
                measure(row, Path(work), args.smoke, dtypes, clock, measured, save)
        except OutOfTime:
            measured["stopped"] = f"the budget of {args.budget:g} s was spent"
            save()
            break
        except (RuntimeError, subprocess.CalledProcessError) as error:
            if args.smoke:
                raise
            # a lease is short: the next row is measured; the log keeps the whole error
            print(error, getattr(error, "stderr", None) or "", file=sys.stderr)
            measured["stopped"] = f"failed: {str(error).strip().splitlines()[-1][:300]}"
            save()
    save()
    print(markdown(results))


if __name__ == "__main__":
    main()
