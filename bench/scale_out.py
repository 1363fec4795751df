"""Scale-out: the models in a multi-process JAX job, measured, and on larger meshes, compiled.

    python -m bench.scale_out            # full-size Wan 2.1: the 2-process job, and 720p/1080p on 8-64 devices
    python -m bench.scale_out --smoke    # small widths and sizes, for the test suite

1. The job: a converted output loaded onto a (1, 8) mesh and decoded, in one process of 8 CPU devices and in a job of
   2 processes x 4 devices on loopback (docs/multihost.md), side by side in one run. Each process is a fresh one;
   times are after imports; the job's are process 0's.
2. On paper: one decode step of a 81-frame clip at 720p and 1080p compiled, never run, for meshes of 8, 16, 32 and 64
   simulated devices (width over "tp" where it divides the latent, the rest over "dp" with that batch), with XLA's
   memory analysis per device and the bytes each step moves through collectives, read from the compiled HLO.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import arguments_or_task, xla_flags_with_devices

REPO = Path(__file__).resolve().parent.parent
MODEL = "wan2.1"
LATENT, SMOKE_LATENT = (1, 3, 30, 40), (1, 3, 4, 8)  # (B, T, H, W) of the decoded latent; width over 8 devices
STEADY_ROUNDS = 3
# (name, frames, height, width) of the clips compiled on paper, and the meshes tried for each
CLIPS = {"720p": (81, 720, 1280), "1080p": (81, 1080, 1920)}
SMOKE_CLIPS = {"64x128": (9, 64, 128)}
MESH_DEVICES = (8, 16, 32, 64)
SMOKE_MESH_DEVICES = (8, 16)
COLLECTIVES = ("collective-permute", "all-gather", "all-reduce", "reduce-scatter", "all-to-all")
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1, "f64": 8, "s64": 8}


# -- tasks, each in a fresh process ---------------------------------------------------------------------------


def task_member(path: str, latent: list, port: int, processes: int, rank: int) -> dict:
    """One process of the job (or the single process): joins the job, loads onto a (1, all devices) mesh, decodes
    once (compiling) and STEADY_ROUNDS more times, gathers; times after imports."""
    import jax

    started = time.perf_counter()
    if processes > 1:
        jax.distributed.initialize(
            f"127.0.0.1:{port}", processes, rank, initialization_timeout=120, heartbeat_timeout_seconds=20
        )
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh

    import converter

    joined = time.perf_counter()
    mesh = Mesh(np.array(jax.devices()).reshape(1, -1), ("dp", "tp"))
    vae = converter.load(path, mesh=mesh)
    jax.block_until_ready(jax.tree.leaves(nnx.state(vae)))
    loaded = time.perf_counter()
    channels = vae.config.z_dim
    z = np.random.default_rng(0).standard_normal((*latent, channels)).astype(np.float32)
    jax.block_until_ready(vae.decode(z, mesh=mesh))
    first = time.perf_counter()
    steady = []
    for _ in range(STEADY_ROUNDS):
        begin = time.perf_counter()
        out = jax.block_until_ready(vae.decode(z, mesh=mesh))
        steady.append(time.perf_counter() - begin)
    begin = time.perf_counter()
    whole = converter.gather(out)
    gathered = time.perf_counter() - begin
    result = {
        "processes": processes,
        "devices": jax.device_count(),
        "join_seconds": joined - started,
        "load_seconds": loaded - joined,
        "first_decode_seconds": first - loaded,
        "steady_decode_seconds": statistics.median(steady),
        "gather_seconds": gathered,
        "output": list(whole.shape),
    }
    if processes > 1:
        jax.distributed.shutdown()
    print(json.dumps(result), flush=True)
    os._exit(0)  # past a clean shutdown, the runtime's teardown can hang (docs/multihost.md)


def task_paper(model: str, clip: list, devices: int, smoke: bool) -> dict:
    """One decode of the clip compiled, not run, on a mesh of `devices`: per step shape, XLA's memory analysis per
    device and the bytes its collectives move per device; the steady step (the largest) is reported."""
    import functools

    import jax
    import numpy as np
    from flax import nnx

    from bench.run import CompileOnlyStep
    from converter.models.common import steps_flax
    from converter.registry import config_from_dict, get_model, small_config
    from converter.targets import TARGETS

    entry = get_model(model)
    config = config_from_dict(entry.family, {**entry.config, **(small_config(entry) if smoke else {})})
    graphdef, abstract = nnx.split(TARGETS["flax"].empty_model(entry.family, config, "float32").model)
    frames, height, width = clip
    ratio_t, ratio_s = 4, 8  # Wan 2.1's compression
    latent_w = width // ratio_s
    tp = max(d for d in range(1, devices + 1) if devices % d == 0 and latent_w % d == 0)
    dp = devices // tp
    mesh = jax.make_mesh((dp, tp), ("dp", "tp"), devices=jax.devices()[:devices])
    latent = jax.ShapeDtypeStruct(
        (dp, 1 + (frames - 1) // ratio_t, height // ratio_s, latent_w, config.z_dim), np.float32
    )

    def run(state, z):
        return nnx.merge(graphdef, state).decode(z, mesh=mesh)

    original = steps_flax.step
    steps_flax.step = recorder = CompileOnlyStep(original)
    try:
        jax.eval_shape(functools.partial(run), abstract, latent)
    finally:
        steps_flax.step = original
    compiled, seconds = max(recorder.compiled.values(), key=lambda item: item[0].memory_analysis().temp_size_in_bytes)
    memory = compiled.memory_analysis()
    moved = collective_bytes(compiled.as_text())
    return {
        "mesh": [dp, tp],
        "latent": list(latent.shape),
        "latent_columns_per_device": latent_w // tp,
        "compile_seconds": seconds,
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "collective_bytes": moved,
    }


def collective_bytes(hlo: str) -> dict[str, int]:
    """Bytes each kind of collective produces per device in a compiled (per-device) HLO module: the result shapes of
    its collective instructions (a tuple's elements summed)."""
    moved = dict.fromkeys(COLLECTIVES, 0)
    for line in hlo.splitlines():
        match = re.match(r"\s*(?:ROOT )?%\S+ = (.+?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(", line)
        if match:
            moved[match.group(2)] += sum(
                _DTYPE_BYTES.get(dtype, 4) * _product(dims)
                for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", match.group(1))
            )
    return moved


def _product(dims: str) -> int:
    out = 1
    for d in filter(None, dims.split(",")):
        out *= int(d)
    return out


TASKS = {"member": task_member, "paper": task_paper}


# -- orchestration --------------------------------------------------------------------------------------------


def _child_env(devices: int) -> dict:
    from converter.api import COMPILE_CACHE_ENV
    from converter.structure_cache import STRUCTURE_CACHE_ENV

    env = {k: v for k, v in os.environ.items() if k != COMPILE_CACHE_ENV}
    return {
        **env,
        STRUCTURE_CACHE_ENV: "off",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": xla_flags_with_devices(devices),
    }


def _spawn(name: str, simulated: int, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.scale_out", "--task", name, json.dumps(kwargs)],
        cwd=REPO,
        env=_child_env(simulated),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(process: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise RuntimeError("a scale-out task ran past its time") from None
    if process.returncode != 0:
        raise RuntimeError(f"a scale-out task failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(smoke: bool, work: Path) -> dict:
    source, out = work / "source", work / "flax"
    small = ["--small"] if smoke else []
    for args in (
        ("random-checkpoint", MODEL, source, *small),
        (MODEL, "--source", source, "--to", "flax", "--out", out, "--no-validate"),
    ):
        subprocess.run([sys.executable, "-m", "converter", *map(str, args)], cwd=REPO, check=True, capture_output=True)
    latent = list(SMOKE_LATENT if smoke else LATENT)
    member = {"path": str(out), "latent": latent, "port": 0, "processes": 1, "rank": 0}
    results = {"job": {"one process, 8 devices": _result(_spawn("member", 8, **member), 1800)}}
    port = _free_port()
    job = [_spawn("member", 4, **{**member, "port": port, "processes": 2, "rank": rank}) for rank in range(2)]
    try:
        outcomes = [_result(process, 1800) for process in job]
    finally:
        for process in job:
            if process.poll() is None:
                process.kill()
    results["job"]["2 processes x 4 devices"] = outcomes[0]
    results["paper"] = {}
    for clip_name, clip in (SMOKE_CLIPS if smoke else CLIPS).items():
        for devices in SMOKE_MESH_DEVICES if smoke else MESH_DEVICES:
            print(f"  compiling {clip_name} on {devices} devices ...", file=sys.stderr)
            paper = _spawn("paper", devices, model=MODEL, clip=list(clip), devices=devices, smoke=smoke)
            results["paper"][f"{clip_name} {devices}"] = {"clip": clip_name, "devices": devices, **_result(paper, 3600)}
    return results


def markdown(results: dict) -> str:
    size = lambda n: f"{n / 2**30:.2f} GB" if n >= 2**30 else f"{n / 2**20:.1f} MB"  # noqa: E731
    lines = [
        f"# Scale-out ({results['mode']}, {results['date']})",
        "",
        f"Machine: {results['device']}.",
        "",
        f"{MODEL} ({'small widths' if results['mode'] == 'smoke' else 'full size'}), a converted output loaded onto a "
        f"(1, 8) mesh and a latent of {tuple(results['latent'])} (B, T, H, W) decoded; times after imports, the "
        "job's those of process 0, steady the median of 3:",
        "",
        "| run | join | load | first decode | steady decode | gather |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results["job"].items():
        lines.append(
            f"| {name} | {r['join_seconds']:.2f} s | {r['load_seconds']:.3f} s | {r['first_decode_seconds']:.1f} s | "
            f"{r['steady_decode_seconds']:.2f} s | {r['gather_seconds']:.3f} s |"
        )
    one, two = results["job"]["one process, 8 devices"], results["job"]["2 processes x 4 devices"]
    lines += [
        "",
        f"Load in the job over one process: {two['load_seconds'] / one['load_seconds']:.2f}x; steady decode "
        f"{two['steady_decode_seconds'] / one['steady_decode_seconds']:.2f}x.",
        "",
        "On paper: the steady decode step of each clip (its latent: (B, T, H, W, C)) compiled for each mesh (Flax, "
        "float32), per device: XLA's memory analysis, and the bytes the step's collectives produce (halo columns: "
        "collective-permute).",
        "",
        "| clip | latent | devices | mesh (dp, tp) | latent columns per device | compile | arguments | temporaries "
        "| collective-permute | all-gather | all-reduce |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["paper"].values():
        c = r["collective_bytes"]
        lines.append(
            f"| {r['clip']} | {tuple(r['latent'])} | {r['devices']} | {tuple(r['mesh'])} | "
            f"{r['latent_columns_per_device']} | "
            f"{r['compile_seconds']:.1f} s | {size(r['argument_bytes'])} | {size(r['temp_bytes'])} | "
            f"{size(c['collective-permute'])} | {size(c['all-gather'])} | {size(c['all-reduce'])} |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small widths and sizes")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = arguments_or_task(parser, TASKS)
    if args is None:
        return
    from bench.run import _device

    with tempfile.TemporaryDirectory(prefix="vae-convert-scale-out-") as work:
        results = {
            "device": _device(),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "mode": "smoke" if args.smoke else "full",
            "latent": list(SMOKE_LATENT if args.smoke else LATENT),
            **measure(args.smoke, Path(work)),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "scale-out-smoke" if args.smoke else "scale-out"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
