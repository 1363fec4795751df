"""One command that measures conversion, loading, decode and encode, and writes a Markdown table and JSON.

    python -m bench.run                 # full-size Wan 2.1, Wan 2.2 and CogVideoX (random weights)
    python -m bench.run --smoke         # small widths, for the test suite (about a minute)
    python -m bench.run --conversion-only   # every model's whole conversion process against the naive script

Every measurement runs in a fresh process, so peak memory and first-call (compile) times are its own. Checkpoints
are made with `vae-convert random-checkpoint` (the real architectures, random weights): timings do not depend on the
values. The models measured are the first model name of each VAE variant (converter/registry.py).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import arguments_or_task, diffusers_class_of, diffusers_decode, xla_flags_with_devices
from bench.flops import encoded_shape

REPO = Path(__file__).resolve().parent.parent


def cases(smoke: bool, names: list[str] | None = None) -> dict:
    """model -> (latent it decodes, sample it encodes or None for a decoder alone), channels-first: the named models,
    else the first model of each variant (Wan 2.1, Wan 2.2, CogVideoX...). A video model: its validation latent and
    64x64-pixel videos of its validation frame count; any other model at the size its pipelines make
    (FamilySpec.native_size: an image, a spectrogram, a waveform) and the latent that encodes to (a decoder alone:
    its input at that size); smoke: the first model at small widths, 4x4 latents and 32x32 videos (other models:
    their validation's sizes)."""
    from converter.registry import config_from_dict, first_of_each_variant, get_model, small_config

    entries = [get_model(name) for name in names] if names else first_of_each_variant()
    result = {}
    for entry in entries[:1] if smoke else entries:
        family = entry.family
        config = config_from_dict(family, {**entry.config, **(small_config(entry) if smoke else {})})
        latent = list(family.validation_latent_shape(config))
        sample = family.validation_sample_shape and list(family.validation_sample_shape(config))
        native = list(family.native_size)
        video = len(native) == 3 and native[0] > 1  # its full size is the compile-only rows'
        if video and smoke:
            latent[-2:], sample[-2:] = [4, 4], [32, 32]
        elif video:
            sample[-2:] = [64, 64]
        elif not smoke and sample is None:
            latent[-len(native) :] = native
        elif not smoke:
            sample[-len(native) :] = native
            latent = encoded_shape(entry.qualified, sample)
        result[entry.qualified] = (tuple(latent), sample and tuple(sample))
    return result


def scaled(shapes: tuple, factor: int) -> tuple:
    """A video row's (latent, video) `factor` times as high and wide; any other row as it is."""
    latent, video = shapes
    if factor == 1 or video is None or len(video) != 5:
        return shapes
    return tuple((*s[:-2], *(side * factor for side in s[-2:])) for s in (latent, video))


# -- measurements, each run in its own process via `python -m bench.run --task ...` --------------------------


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak so far) of this process, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def import_everything():
    """Everything a conversion imports, before the memory baseline is taken."""
    import flax.nnx  # noqa: F401
    import jax  # noqa: F401
    import orbax.checkpoint  # noqa: F401
    import torch  # noqa: F401

    from converter import pipeline, sources, targets, validate  # noqa: F401
    from converter.registry import FAMILIES

    for family in FAMILIES.values():
        family.flax_model(), family.torch_model()


def task_convert(source: str, out: str, model: str, target: str) -> dict:
    from converter.pipeline import Request, convert
    from converter.registry import get_model
    from converter.targets import TARGETS

    import_everything()
    baseline = rss_mb("VmRSS")
    started = time.perf_counter()
    convert(
        Request(
            model=get_model(model),
            target=TARGETS[target],
            out=Path(out),
            source=source,
            offline=True,
            force=True,
            validate=False,
        )
    )
    return {"seconds": time.perf_counter() - started, "peak_above_baseline_mb": rss_mb("VmHWM") - baseline}


def task_naive(source: str, out: str, model: str) -> dict:
    """The approach we replace: read every tensor into memory, transpose them all, then save them all."""
    import numpy as np
    import orbax.checkpoint as ocp

    from converter import mapping, targets
    from converter.registry import get_model
    from converter.safetensors_io import SafetensorsFile

    family = get_model(model).family
    rules = mapping.load_mapping(mapping.MAPPINGS_DIR / family.mapping_file).rules("flax")
    import_everything()
    baseline = rss_mb("VmRSS")
    started = time.perf_counter()
    weights = SafetensorsFile(Path(source) / "diffusion_pytorch_model.safetensors")
    loaded = {k: np.array(weights[k]) for k in weights.keys()}
    converted = {}
    for key, array in loaded.items():
        rule, match = next((r, m) for r in rules if (m := r.pattern.fullmatch(key)))
        converted[rule.target_key(match)] = np.ascontiguousarray(mapping.apply_ops(rule.ops, array))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(Path(out) / targets.TARGETS["flax"].weight_files["orbax"], mapping.nested(converted))
    return {"seconds": time.perf_counter() - started, "peak_above_baseline_mb": rss_mb("VmHWM") - baseline}


# the naive conversion as a user would write it, run as a whole process (imports included): only what it needs
NAIVE_SCRIPT = """
import sys
from pathlib import Path
import numpy as np
import orbax.checkpoint as ocp
from safetensors.numpy import load_file
from converter import mapping
from converter.registry import get_model
rules = mapping.load_mapping(mapping.MAPPINGS_DIR / get_model(sys.argv[1]).family.mapping_file).rules("flax")
converted = {}
for key, array in load_file(Path(sys.argv[2]) / "diffusion_pytorch_model.safetensors").items():
    rule, match = next((r, m) for r in rules if (m := r.pattern.fullmatch(key)))
    converted[rule.target_key(match)] = np.ascontiguousarray(mapping.apply_ops(rule.ops, array))
with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(Path(sys.argv[3]).absolute() / "state", mapping.nested(converted))
"""


WHOLE_PROCESS_RUNS = 7


def whole_process(model: str, source: Path, work: Path, runs: int) -> dict:
    """Seconds of whole processes as users run them, imports included: `vae-convert MODEL --to flax` (no
    validation) and the naive script, in alternating pairs so both meet the same machine; the median of each."""
    out = work / "whole-process"
    commands = {
        "vae-convert": [sys.executable, "-m", "converter", model, "--source", source, "--to", "flax", "--out", out]
        + ["--no-validate"],
        "naive": [sys.executable, "-c", NAIVE_SCRIPT, model, source, out],
    }
    seconds = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()
            subprocess.run(list(map(str, command)), cwd=REPO, env=_environment(), check=True, capture_output=True)
            seconds[name].append(time.perf_counter() - started)
    shutil.rmtree(out, ignore_errors=True)
    return {name: statistics.median(times) for name, times in seconds.items()} | {"runs": runs}


def task_load(path: str, how: str) -> dict:
    """Seconds from a converted output to a ready model, after imports: `converter.load` ("vae-convert"), its parts
    ("parts": the model's abstract structure, mapping the weights, JAX starting its backend, placing the weights and
    building), or
    diffusers' `from_pretrained` of a torchax output (the same weights, in diffusers' format)."""
    import jax

    import converter
    from converter.output import collection_paused, read_output

    import_everything()  # the model code too, as diffusers' class is imported before its from_pretrained

    def ready(model):  # a Flax model is a pytree of its arrays
        return model if hasattr(model, "parameters") else jax.block_until_ready(model)

    if how == "diffusers":
        cls = diffusers_class_of(path)
        started = time.perf_counter()
        cls.from_pretrained(path)
        return {"seconds": time.perf_counter() - started}
    if how == "vae-convert":
        started = time.perf_counter()
        ready(converter.load(path))
        return {"seconds": time.perf_counter() - started}
    out = read_output(path)
    parts, started = {}, time.perf_counter()
    with collection_paused():  # as converter.load does
        empty = out.target.empty_model(out.family, out.config, out.dtype)
        parts["structure"], started = time.perf_counter() - started, time.perf_counter()
        weights = out.target.read_weights(out)
        parts["weights"], started = time.perf_counter() - started, time.perf_counter()
        jax.devices()  # JAX starts its backend on first use, once per process, whatever it is used for
        parts["jax start"], started = time.perf_counter() - started, time.perf_counter()
        ready(out.target.build(empty, weights, out.path))
        parts["build"] = time.perf_counter() - started
    return parts


def task_loads(loads: list[dict]) -> list[dict]:
    """Several loads in one process (the smoke mode's), each finding the structure cache its `structures` names."""
    from converter.structure_cache import STRUCTURE_CACHE_ENV

    results = []
    for load in loads:
        os.environ[STRUCTURE_CACHE_ENV] = load.pop("structures")
        results.append(task_load(**load))
    return results


# Each load is timed in this many fresh processes, the median kept: the first load in a process is the one that
# counts, and one process's differs from the next by more than the loads compared differ.
LOAD_RUNS = 3


# Steady calls: the best of this many per implementation, the implementations taking turns in one process
# (--steady-only: one, so that every family at its full size is measured within an hour on 2 cores).
STEADY_ROUNDS = 3
STEADY_ONLY_ROUNDS = 1


def task_run(impl: str, path: str, latent: list, video: list, cache: str | None) -> dict:
    """The first decode and encode of one implementation in a fresh process (for jitted ones, compiling):
    flax / torchax (jitted) or torch / diffusers (eager)."""
    import converter

    if cache:
        converter.enable_compile_cache(cache)
    calls = _calls(impl, path, latent, video)
    return {part: {"first": _seconds_of(call)} for part, call in calls.items()}


def task_steady(paths: dict, latent: list, video: list, cache: str, rounds: int) -> dict:
    """Steady calls of every implementation in one process, taking turns: each round decodes (then encodes) twice
    with each, timing the second, starting with the next one each round, so a change in the machine's speed, which
    between processes is larger than the gaps measured, reaches them all alike. {impl: {"decode": best, "encode":
    best}}; the Flax steps come from the flax run's compilation cache."""
    import converter

    converter.enable_compile_cache(cache)
    calls = {impl: _calls(impl, path, latent, video) for impl, path in paths.items()}
    # two calls each first: the first compiles (or reads the cache), and the Flax models' second is still slower
    # than the ones after it
    for parts in calls.values():
        for _ in range(2):
            for call in parts.values():
                call()
    impls = list(calls)
    best = {impl: {part: float("inf") for part in parts} for impl, parts in calls.items()}
    for r in range(rounds):
        for part in best[impls[0]]:
            for impl in impls[r % len(impls) :] + impls[: r % len(impls)]:
                # each timed call follows one of its own: right after another implementation's, the memory and
                # caches it left slow the next one down (docs/performance.md, Design decisions)
                calls[impl][part]()
                best[impl][part] = min(best[impl][part], _seconds_of(calls[impl][part]))
    return best


def _seconds_of(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _calls(impl: str, path: str, latent: list, video: list | None) -> dict:
    """{"decode": call, "encode": call (none for a decoder alone)} of one implementation on a fixed latent and
    sample, numpy in and out."""
    import numpy as np
    import torch

    import converter
    from converter.models.common.protocol import encoded
    from converter.registry import config_from_dict, family_for_class
    from converter.targets import TARGETS
    from converter.validate import decode_inputs

    rng = np.random.default_rng(0)
    z = rng.standard_normal(latent).astype(np.float32)
    x = None if video is None else rng.uniform(-1, 1, video).astype(np.float32)
    raw = json.loads((Path(path) / "config.json").read_text())
    family = family_for_class(raw["_class_name"])
    inputs = decode_inputs(family, config_from_dict(family, raw))  # LTX's timestep (and noise seed), as validation
    if impl in TARGETS:
        runner = TARGETS[impl].runner(converter.load(path))
        return _encoding({"decode": lambda: runner.decode(z, **inputs)}, x, lambda: runner.encode(x))
    if impl == "diffusers":
        model = diffusers_class_of(path).from_pretrained(path).eval()
    else:
        model = converter.load(path)
    # eager PyTorch on the GPU where there is one; numpy in and out, as the jitted runners take and give
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    zt, xt = (None if v is None else torch.from_numpy(v).to(device) for v in (z, x))
    # diffusers draws its noise itself (from torch's global generator): it takes the timestep only
    conditions = {name: torch.from_numpy(value).to(device) for name, value in inputs.items() if name != "noise"}

    def decode():
        with torch.no_grad():
            diffusers_decode(model, zt, **conditions).cpu().numpy()

    def encode():
        with torch.no_grad():
            encoded(model.encode(xt))[0].cpu().numpy()

    return _encoding({"decode": decode}, x, encode)


def _encoding(calls: dict, x, encode) -> dict:
    """calls with the encode of x beside the decode, where there is a sample to encode (a decoder alone has none)."""
    return calls if x is None else {**calls, "encode": encode}


# The compile-only measurements: each family's native video (FamilySpec.native_size; smoke: the small model and a
# small video) in each layout, on 8 simulated devices.
SMOKE_VIDEO = (1, 3, 9, 64, 64)
LAYOUTS = {"one device": None, "tiled": None, "mesh (1, 8)": (1, 8), "mesh (2, 4)": (2, 4)}
SMOKE_LAYOUTS = ("one device", "mesh (1, 8)")
SIMULATED_DEVICES = 8


class CompileOnlyStep:
    """Stands in for the Flax models' jitted chunk step (models/common/steps_flax.py) while a whole encode or
    decode is traced with `jax.eval_shape`: each new step signature is lowered and compiled, never run, and zeros
    of its output shapes go back into the trace. The cache of each step is laid out as the previous step's
    compiled outputs are, as in a real run."""

    def __init__(self, step, device=None):
        """`device`: the sharding of a step on no mesh (bench/program.py's compile-only GPU); None: the default."""
        self.step, self.device, self.compiled, self.cache_layout = step, device, {}, {}
        self.calls = collections.Counter()  # calls of each compiled step in the encode or decode

    def __call__(self, part, mesh, model, x, cache, inputs, keep_cache):
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        from converter.models.common.sharding import activation_spec

        def spec(value, sharding=None):
            return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)

        replicated, activations = (
            (NamedSharding(mesh, P()), NamedSharding(mesh, activation_spec(x.ndim))) if mesh else (self.device,) * 2
        )
        key = (part, tuple(x.shape), cache is None, keep_cache)
        self.calls[key] += 1
        if key not in self.compiled:
            args = (
                jax.tree.map(lambda v: spec(v, replicated), model),
                spec(x, activations),
                None if cache is None else jax.tree.map(spec, cache, self.cache_layout[part]),
                jax.tree.map(lambda v: spec(v, replicated), inputs),
            )
            started = time.perf_counter()
            compiled = self.step.lower(part, mesh, *args, keep_cache).compile()
            self.compiled[key] = (compiled, time.perf_counter() - started)
        compiled, _ = self.compiled[key]
        self.cache_layout[part] = compiled.output_shardings[1]
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), compiled.out_info)


def _cache_frames(out_info) -> tuple[int, int]:
    """(frames held by the largest cache entry, bytes of the whole cache) of a step's outputs (B, T, H, W, C); (0, 0)
    for a model that keeps none (HunyuanVideo runs a clip whole)."""
    import jax

    leaves = jax.tree.leaves(out_info[1])
    return max((leaf.shape[1] for leaf in leaves), default=0), sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)


def task_compile(model: str, layouts: list[str], smoke: bool, size: list[int] | None = None) -> dict:
    """Every encode and decode step of the video compiled in each layout, none run (one process, so the imports and
    the abstract model are paid once): {layout: the layout's measurements}."""
    return {layout: _compile_layout(model, layout, smoke, size) for layout in layouts}


def _compile_layout(model: str, layout: str, smoke: bool, size: list[int] | None = None) -> dict:
    """Per part: the step shapes, the compile time, XLA's memory analysis per device (the largest over the steps)
    and the causal cache (all devices)."""
    result = {"batch": (LAYOUTS[layout] or (1,))[0]}
    for part, video, recorder in compiled_steps(model, layout, smoke, size):
        compiled = [c for c, _ in recorder.compiled.values()]
        memory = [c.memory_analysis() for c in compiled]
        frames, cache_bytes = max(_cache_frames(c.out_info) for c in compiled)
        result[part] = {
            "input": list(video.shape),
            "steps": len(compiled),
            "compile_seconds": sum(s for _, s in recorder.compiled.values()),
            "max_step_compile_seconds": max(s for _, s in recorder.compiled.values()),
            "argument_bytes": max(m.argument_size_in_bytes for m in memory),
            "output_bytes": max(m.output_size_in_bytes for m in memory),
            "temp_bytes": max(m.temp_size_in_bytes for m in memory),
            "cache_frames": frames,
            "cache_bytes": cache_bytes,
            "gflop": sum(_flops(c) for c in compiled) / 1e9,
        }
    return result


def compiled_steps(model: str, layout: str, smoke: bool, size=None, dtype: str = "float32", device=None):
    """Yields (part, its input, the CompileOnlyStep that compiled its steps) for the encoder, then the decoder (which
    takes the encoder's latent): the model's whole encode and decode of the family's native video in `layout`,
    traced with its weights in `dtype`, each step compiled for `device` (a sharding; None: the default device)."""
    import jax
    from flax import nnx

    from converter.models.common import steps_flax
    from converter.models.common.protocol import encoded
    from converter.registry import config_from_dict, get_model, small_config
    from converter.targets import TARGETS
    from converter.validate import decode_inputs

    entry = get_model(model)
    config = config_from_dict(entry.family, {**entry.config, **(small_config(entry) if smoke else {})})
    graphdef, abstract = nnx.split(TARGETS["flax"].empty_model(entry.family, config, dtype).model)
    mesh_shape = LAYOUTS[layout]
    mesh = jax.make_mesh(mesh_shape, ("dp", "tp"), devices=jax.devices()[:SIMULATED_DEVICES]) if mesh_shape else None
    batch = mesh_shape[0] if mesh_shape else 1  # a batch "dp" splits
    channels = entry.family.validation_sample_shape(config)[1]
    *sizes, h, w = SMOKE_VIDEO[2:] if smoke else entry.family.native_size
    if size:  # --compile-size: another height and width than the native video's
        h, w = size
    if mesh_shape:  # the latent's width must split over "tp": the native width rounded up to where it does
        ratio = entry.family.validation_sample_shape(config)[-1] // entry.family.validation_latent_shape(config)[-1]
        w = -(-w // (ratio * mesh_shape[1])) * ratio * mesh_shape[1]
    # channels-last, of the model's rank (an image's without frames)
    sizes = sizes if entry.family.frame_axis else []
    video = jax.ShapeDtypeStruct((batch, *sizes, h, w, channels), dtype)
    inputs = decode_inputs(entry.family, config)

    def run(part, state, x):
        vae = nnx.merge(graphdef, state)
        if layout == "tiled":
            vae.enable_tiling()
        else:  # whole frames, whatever the family's default (MiniMax-H3 tiles unless told not to)
            vae.disable_tiling()
        return encoded(vae.encode(x, mesh=mesh))[0] if part == "encoder" else vae.decode(x, mesh=mesh, **inputs)

    original = steps_flax.step
    try:
        for part in ("encoder", "decoder"):
            steps_flax.step = recorder = CompileOnlyStep(original, device)
            out = jax.eval_shape(functools.partial(run, part), abstract, video)
            yield part, video, recorder
            video = out
    finally:
        steps_flax.step = original


def _flops(compiled) -> float:
    """XLA's count of floating-point operations in one call of a compiled step (per device on a mesh)."""
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis  # a list of one in older JAX
    return float(analysis.get("flops", 0.0))


def task_matmul_rate(size: int = 2048, calls: int = 5) -> dict:
    """This CPU's matrix-multiply rate under XLA: the best of several float32 (size, size) products, GFLOP/s. What a
    convolution-bound model could reach at most; the models' steady times are set against it."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size), np.float32))
    product = jax.jit(lambda x: x @ x)
    product(a).block_until_ready()
    best = min(_seconds_of(lambda: product(a).block_until_ready()) for _ in range(calls))
    return {"size": size, "gflops": 2 * size**3 / best / 1e9}


TASKS = {
    "convert": task_convert,
    "matmul_rate": task_matmul_rate,
    "naive": task_naive,
    "load": task_load,
    "loads": task_loads,
    "run": task_run,
    "steady": task_steady,
    "compile": task_compile,
}


# -- orchestration ----------------------------------------------------------------------------------------


_SPENT: dict[str, float] = {}  # wall seconds per task name (imports included) for the model being measured


def _environment(env: dict | None = None) -> dict:
    """A child process's environment: a compilation cache only where a task names one (the first calls it times are
    compiling), and no structure cache but the one a task names (the user's left as it is)."""
    from converter.api import COMPILE_CACHE_ENV
    from converter.structure_cache import STRUCTURE_CACHE_ENV

    return {
        **{k: v for k, v in os.environ.items() if k != COMPILE_CACHE_ENV},
        STRUCTURE_CACHE_ENV: "off",
        **(env or {}),
    }


def _task(name: str, env: dict | None = None, **kwargs) -> dict:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--task", name, json.dumps(kwargs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=_environment(env),
    )
    if result.returncode != 0:
        raise RuntimeError(f"bench task {name} {kwargs} failed:\n{result.stderr[-3000:]}")
    spent = time.perf_counter() - started
    _SPENT[name] = _SPENT.get(name, 0.0) + spent
    print(
        f"  {name} {' '.join(str(v) for k, v in kwargs.items() if k in ('impl', 'target', 'how', 'layouts'))}: "
        f"{spent:.1f} s",
        file=sys.stderr,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _loads(loads: dict, smoke: bool, work: Path) -> dict:
    """{name: load task's result}, each load in LOAD_RUNS fresh processes, the median of each time it reports; in
    smoke mode all of them in one process, once (what is tested there is that each runs, not its time). Each finds
    the structure cache its `structures` names, or by default an empty one of its own, as the first load of a
    model's config does."""
    from converter.structure_cache import STRUCTURE_CACHE_ENV

    if smoke:
        empty = {name: str(work / f"structures-{i}") for i, name in enumerate(loads)}
        loads = [{"structures": empty[name], **load} for name, load in loads.items()]
        return dict(zip(empty, _task("loads", loads=loads)))
    results = {}
    for name, load in loads.items():
        structures = load.pop("structures", None)
        runs = []
        for _ in range(LOAD_RUNS):
            with tempfile.TemporaryDirectory() as empty:
                runs.append(_task("load", env={STRUCTURE_CACHE_ENV: structures or empty}, **load))
        results[name] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return results


def _vae_convert(*args):
    subprocess.run(
        [sys.executable, "-m", "converter", *map(str, args)],
        cwd=REPO,
        env=_environment(),
        check=True,
        capture_output=True,
    )


FLAX_SAFETENSORS = ("--to", "flax", "--format", "safetensors", "--no-validate")


def measure_model(
    model: str, shapes: tuple, work: Path, smoke: bool, layouts: list[str], compile_only=False, size=None,
    steady_only=False, conversion_only=False,
) -> dict:  # fmt: skip
    latent, video = shapes
    _SPENT.clear()
    shapes = {"latent": list(latent), "video": video and list(video)}
    if compile_only:  # no weights: compiling needs the abstract model only
        return {"compile": _compile(model, layouts, smoke, size), "bench_seconds": dict(_SPENT)}
    made = time.perf_counter()
    source = work / f"{model}-source"
    _vae_convert("random-checkpoint", model, source, *(["--small"] if smoke else []))
    if steady_only:
        return _steady_only(model, source, work, shapes)
    weights = source / "diffusion_pytorch_model.safetensors"
    size_mb = weights.stat().st_size / 1e6
    if conversion_only:
        _SPENT["checkpoint"] = time.perf_counter() - made
        whole = whole_process(model, source, work, 1 if smoke else WHOLE_PROCESS_RUNS)
        _SPENT["whole process"] = time.perf_counter() - made - _SPENT["checkpoint"]
        return {"checkpoint_mb": size_mb, "whole process": whole, "bench_seconds": dict(_SPENT)}
    started = time.perf_counter()
    shutil.copyfile(weights, work / "copy.safetensors")
    copy_s = time.perf_counter() - started
    (work / "copy.safetensors").unlink()
    _SPENT["checkpoint"] = time.perf_counter() - made
    result = {"checkpoint_mb": size_mb, "copy_seconds": copy_s, "convert": {}, "run": {}, "shapes": shapes}
    for target in ("flax", "torchax"):
        result["convert"][target] = _task(
            "convert", source=str(source), out=str(work / f"{model}-{target}"), model=model, target=target
        )
    flax_safetensors = work / f"{model}-flax-safetensors"  # for its load only: it converts as torchax does
    _vae_convert("convert", model, "--source", source, "--out", flax_safetensors, *FLAX_SAFETENSORS)
    flax, torchax = str(work / f"{model}-flax"), str(work / f"{model}-torchax")
    kept = str(work / f"{model}-structures")  # the Flax loads again, finding the structure an earlier load kept
    loads = {
        "flax": dict(path=flax, how="vae-convert"),
        "flax parts": dict(path=flax, how="parts"),
        "flax safetensors": dict(path=str(flax_safetensors), how="vae-convert"),
        "torchax": dict(path=torchax, how="vae-convert"),
        "keeping the structure": dict(path=flax, how="vae-convert", structures=kept),
        "flax kept structure": dict(path=flax, how="vae-convert", structures=kept),
        "flax safetensors kept structure": dict(path=str(flax_safetensors), how="vae-convert", structures=kept),
        **({"diffusers": dict(path=torchax, how="diffusers")} if _has_diffusers() else {}),
    }
    result["load"] = _loads(loads, smoke, work)
    del result["load"]["keeping the structure"]
    # after the loads, which find the outputs as the conversions left them, with no other process's memory between
    result["convert"]["naive"] = _task("naive", source=str(source), out=str(work / f"{model}-naive"), model=model)
    result["whole process"] = whole_process(model, source, work, 1 if smoke else WHOLE_PROCESS_RUNS)
    cache = work / f"{model}-jax-cache"
    # the eager reference: diffusers, or the torchax output's own PyTorch model run eagerly (smoke, no diffusers)
    eager = "diffusers" if _has_diffusers() and not smoke else "torch"
    runs = {"flax": work / f"{model}-flax", "torchax": work / f"{model}-torchax", eager: work / f"{model}-torchax"}
    if smoke:
        runs.pop("torchax")
    for impl, path in runs.items():
        # flax's run fills an empty compilation cache, which the flax+cache run and the steady calls then find
        result["run"][impl] = _task(
            "run", impl=impl, path=str(path), latent=latent, video=video, cache=str(cache) if impl == "flax" else None
        )
    if not smoke:  # what the cache saves is the first call's compiling: its steady calls are flax's
        result["run"]["flax+cache"] = _task(
            "run", impl="flax", path=str(runs["flax"]), latent=latent, video=video, cache=str(cache)
        )
    paths = {impl: str(path) for impl, path in runs.items()}
    steady = _task("steady", paths=paths, latent=latent, video=video, cache=str(cache), rounds=STEADY_ROUNDS)
    for impl, parts in steady.items():
        for part, seconds in parts.items():
            result["run"][impl][part]["steady"] = seconds
    if video is not None and len(video) > 3:  # a waveform's or a decoder's calls are its whole story
        result["compile"] = _compile(model, layouts, smoke, size)
    result["bench_seconds"] = dict(_SPENT)
    return result


def _steady_only(model: str, source: Path, work: Path, shapes: dict) -> dict:
    """The steady calls alone (each family's rate, bench/flops.py): converted without timing, diffusers' model read
    from the torchax output, the steps compiled in the steady process itself."""
    paths = {}
    for target in ("flax", "torchax"):
        paths[target] = str(work / f"{model}-{target}")
        _vae_convert(model, "--source", source, "--to", target, "--out", paths[target], "--no-validate")
    paths["diffusers"] = paths["torchax"]
    steady = _task("steady", paths=paths, **shapes, cache=str(work / f"{model}-jax-cache"), rounds=STEADY_ONLY_ROUNDS)
    return {
        "shapes": shapes,
        "run": {impl: {part: {"steady": seconds} for part, seconds in parts.items()} for impl, parts in steady.items()},
        "bench_seconds": dict(_SPENT),
    }


def _compile(model: str, layouts: list[str], smoke: bool, size: list[int] | None = None) -> dict:
    devices = {"XLA_FLAGS": xla_flags_with_devices(SIMULATED_DEVICES)}
    fitting = [layout for layout in layouts if _fits(LAYOUTS[layout])]
    return _task("compile", env=devices, model=model, layouts=fitting, smoke=smoke, size=size) if fitting else {}


def _fits(mesh_shape: tuple | None) -> bool:
    """Whether the backend has the devices a mesh needs: a CPU simulates them, one GPU cannot."""
    import jax

    return mesh_shape is None or jax.default_backend() == "cpu" or jax.device_count() >= SIMULATED_DEVICES


def _has_diffusers() -> bool:
    import importlib.util

    return importlib.util.find_spec("diffusers") is not None


def _device() -> str:
    import jax

    devices = jax.devices()
    kind = devices[0].device_kind if devices else "none"
    return f"{platform.machine()}, {os.cpu_count()} CPU cores{_cpu()}, JAX backend {jax.default_backend()} ({kind})"


def _cpu() -> str:
    """The CPU as Linux names it, its cache and its widest vector units: one code's timings on this project's
    machine move between days by more than changes move them (docs/performance.md, Design decisions); these say which
    CPU ran."""
    try:
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return ""
    fields = {
        key.strip(): value.strip() for key, value in (line.split(":", 1) for line in info.splitlines() if ":" in line)
    }
    flags = fields.get("flags", "").split()
    vectors = [f for f in ("avx512f", "amx_tile") if f in flags] or [f for f in ("avx2",) if f in flags]
    cache = [f"cache {fields['cache size']}"] if "cache size" in fields else []
    parts = [p for p in (fields.get("model name"), *cache, *vectors) if p]
    return f" ({', '.join(parts)})" if parts else ""


def _cell(measured: dict, model: dict) -> str:
    """Conversion time and peak memory above the baseline, also as a multiple of the checkpoint's size."""
    peak = measured["peak_above_baseline_mb"]
    return f"{measured['seconds']:.2f} s, +{peak:.0f} MB ({peak / model['checkpoint_mb']:.2f}x)"


def markdown(results: dict) -> str:
    lines = [f"Machine: {results['device']}; {results['date']}; mode: {results['mode']}.", *_rate_line(results), ""]
    if results.get("steady only"):
        return "\n".join(lines + steady_table(results) + time_spent(results)) + "\n"
    if results.get("conversion only"):
        return "\n".join(lines + whole_process_table(results["models"]) + time_spent(results)) + "\n"
    measured = {model: r for model, r in results["models"].items() if "convert" in r}
    if not measured:  # compile-only
        return "\n".join(lines + compile_table(results)[1:] + time_spent(results)) + "\n"
    lines += [
        "| model | checkpoint | copy | vae-convert flax | vae-convert torchax | naive (read all, transpose, save) |",
        "|---|---|---|---|---|---|",
    ]
    for model, r in measured.items():
        c = r["convert"]
        lines.append(
            f"| {model} | {r['checkpoint_mb']:.0f} MB | {r['copy_seconds']:.2f} s | {_cell(c['flax'], r)} | "
            f"{_cell(c['torchax'], r)} | {_cell(c['naive'], r)} |"
        )
    lines += [
        "",
        "Conversion time is after imports; memory is peak RSS above the process's RSS after imports.",
        "",
        *whole_process_table(measured),
        "",
    ]
    lines += [
        "| model | first load flax (Orbax) | its parts: structure, weights, JAX start, build | first load flax "
        "(safetensors) | the two, later loads | load torchax | diffusers from_pretrained |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, r in measured.items():
        load, parts = r["load"], r["load"]["flax parts"]
        diffusers = f"{load['diffusers']['seconds']:.3f} s" if "diffusers" in load else "-"
        lines.append(
            f"| {model} | {load['flax']['seconds']:.3f} s | {parts['structure']:.3f} s, {parts['weights']:.3f} s, "
            f"{parts['jax start']:.3f} s, {parts['build']:.3f} s | {load['flax safetensors']['seconds']:.3f} s | "
            f"{load['flax kept structure']['seconds']:.3f} s, {load['flax safetensors kept structure']['seconds']:.3f}"
            f" s | {load['torchax']['seconds']:.3f} s | {diffusers} |"
        )
    smoke = results["mode"] == "smoke"
    runs = "every load once, all in one process (smoke)" if smoke else f"each the median of {LOAD_RUNS} fresh processes"
    lines += [
        "",
        "Seconds from an output folder to a ready model, after imports (the model code included), "
        f"{runs}. Parts of the "
        "Flax load: the abstract model (nnx.eval_shape), the weights (each Orbax leaf's data file mapped, or read "
        "when under 64 KB), JAX starting its backend (once per process, on first use), placing the weights (on CPU "
        "in place) and building the model. Every load here maps the weights, as from_pretrained does: "
        "their pages are read on first use. First load: a process that finds no model structure kept (an empty "
        "structure cache), as the first load of a config does; later loads: the two Flax loads in a process that "
        "finds the abstract model kept by an earlier load (the structure cache, on by default).",
        "",
    ]
    lines += [
        "| model | implementation | decode first | decode steady | encode first | encode steady | decode vs "
        "diffusers |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, r in measured.items():
        reference = r["run"]["diffusers" if "diffusers" in r["run"] else "torch"]["decode"]["steady"]
        for impl, t in r["run"].items():
            decode, encode = t["decode"], t.get("encode", {})  # none for a decoder alone
            ratio = f"{reference / decode['steady']:.2f}x" if "steady" in decode else "-"
            lines.append(
                f"| {model} | {impl} | {decode['first']:.2f} s | {_seconds(decode.get('steady'))} | "
                f"{_seconds(encode.get('first'))} | {_seconds(encode.get('steady'))} | {ratio} |"
            )
    lines += [
        "",
        "first = first call in a fresh process (compiles for jitted models); steady = best of "
        f"{STEADY_ROUNDS} later calls, each after one of its own, the implementations taking turns in one process; "
        "flax: its first call also writes the steps into an empty persistent compilation cache; "
        "flax+cache = first call in another process finding them there (its steady calls are flax's); "
        "the last column is diffusers' steady decode time over this one's (above 1 is faster).",
        *_share_of_rate(results),
    ]
    return "\n".join(lines + compile_table(results) + time_spent(results)) + "\n"


def steady_table(results: dict) -> list[str]:
    """The steady calls of a --steady-only run, with their rates."""
    lines = ["| model | implementation | decode steady | encode steady |", "|---|---|---|---|"]
    for model, r in results["models"].items():
        for impl, t in r["run"].items():
            lines.append(
                f"| {model} | {impl} | {_seconds(t['decode']['steady'])} | "
                f"{_seconds(t.get('encode', {}).get('steady'))} |"
            )
    return lines + [
        "",
        f"steady = the best of {STEADY_ONLY_ROUNDS} call(s) after two warm-up calls and one of its own, the "
        "implementations taking turns in one process.",
        *_share_of_rate(results),
    ]


def _rate_line(results: dict) -> list[str]:
    if "matmul" not in results:
        return []
    m = results["matmul"]
    return [
        "",
        f"Matrix-multiply rate: {m['gflops']:.0f} GFLOP/s (XLA, the best float32 ({m['size']}, {m['size']}) product; "
        "each model is set against the best measured just before and after it).",
    ]


def _share_of_rate(results: dict) -> list[str]:
    """Each implementation's steady calls against the matrix-multiply rate: the operations of the same input counted
    2 per multiply-add (bench/flops.py), over the time, as a share of the rate; XLA's own count of the one-device
    steps beside it, which leaves operations out."""
    from bench.flops import count, matmul_rate

    if "matmul" not in results:
        return []
    rows = []
    for model, r in results["models"].items():
        if "shapes" not in r or not r.get("run"):
            continue
        rate = matmul_rate(results, model)
        gflop = count(model, r["shapes"]["latent"], r["shapes"]["video"], small=results.get("mode") == "smoke")
        one = r.get("compile", {}).get("one device")
        same_input = one and _channels_first(one["encoder"]["input"]) == r["shapes"]["video"]
        for impl, timings in r["run"].items():
            shares = [
                f"{part} {gflop[part]:,.0f} GFLOP"
                + (f" (XLA counts {one[step]['gflop']:,.0f})" if same_input and impl in ("flax", "torchax") else "")
                + f" in {timings[part]['steady']:.2f} s = {gflop[part] / timings[part]['steady'] / rate:.0%}"
                for part, step in (("decode", "decoder"), ("encode", "encoder"))
                if part in gflop and timings.get(part, {}).get("steady")
            ]
            if shares:
                rows.append(f"{model} {impl}: {', '.join(shares)}")
    if not rows:
        return []
    return [
        "",
        "Steady calls against the matrix-multiply rate (operations counted 2 per multiply-add, bench/flops.py): "
        + "; ".join(rows)
        + ".",
    ]


def _channels_first(shape: list[int]) -> list[int]:
    return [shape[0], shape[-1], *shape[1:-1]]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def compile_table(results: dict) -> list[str]:
    """The compile-only measurements: per model, layout and part, and the split of temporaries over (1, 8)."""
    if not any(r.get("compile") for r in results["models"].values()):
        return []
    on_cpu = "JAX backend cpu" in results["device"]
    devices = f"{SIMULATED_DEVICES} simulated CPU devices" if on_cpu else "compiled for the one GPU: no meshes"
    lines = [
        "",
        "Compiled, not run: every encode and decode step of each model's native video, the encoder's input, on a "
        "mesh its width rounded up to split over 'tp' "
        f"(Flax, float32; {devices}). Memory is XLA's analysis per device, the "
        "largest over the steps; the cache is the causal cache a step passes on, over all devices; GFLOP is XLA's "
        "count of one call of each distinct step, summed (a tiled call runs its steps once per tile).",
        "",
        "| model | layout | batch | part | input (channels-last) | step shapes | compile, slowest step | arguments "
        "| outputs | temporaries | cache | GFLOP of the steps, per device |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    splits = []
    for model, r in results["models"].items():
        for layout, m in r.get("compile", {}).items():
            for part in ("encoder", "decoder"):
                p = m[part]
                cache = f"{_size(p['cache_bytes'])}, {p['cache_frames']} frames" if p["cache_frames"] else "none"
                gflop = f"{p['gflop']:.0f}" if "gflop" in p else "-"  # "-": results from before the column
                lines.append(
                    f"| {model} | {layout} | {m['batch']} | {part} | {tuple(p['input'])} | {p['steps']} | "
                    f"{p['compile_seconds']:.1f} s, {p['max_step_compile_seconds']:.1f} s | "
                    f"{_size(p['argument_bytes'])} | {_size(p['output_bytes'])} | {_size(p['temp_bytes'])} | {cache} | "
                    f"{gflop} |"
                )
        if {"one device", "mesh (1, 8)"} <= set(r.get("compile", {})):
            one, split = r["compile"]["one device"], r["compile"]["mesh (1, 8)"]
            splits += [
                f"{model} {part} {one[part]['temp_bytes'] / split[part]['temp_bytes']:.1f}x"
                for part in ("encoder", "decoder")
            ]
    if splits:
        lines += ["", "Temporaries per device, one device over mesh (1, 8): " + ", ".join(splits) + "."]
    return lines


def whole_process_table(measured: dict) -> list[str]:
    """Each model's whole conversion process against the naive script's."""
    lines = [
        "| model | checkpoint | whole process: vae-convert flax (no validation) | naive script | speed over the naive "
        "script |",
        "|---|---|---|---|---|",
    ]
    for model, r in measured.items():
        whole = pairs = r["whole process"]
        lines.append(
            f"| {model} | {r['checkpoint_mb']:.0f} MB | {whole['vae-convert']:.2f} s | {whole['naive']:.2f} s | "
            f"{whole['naive'] / whole['vae-convert']:.2f}x |"
        )
    return lines + [
        "",
        "Whole processes as a user runs them, imports included (the naive script imports only what it needs), the "
        f"median of {pairs['runs']} alternating pairs, no structure cache (each process the first conversion of its "
        "config).",
    ]


def time_spent(results: dict) -> list[str]:
    """The benchmark's own wall time, per model and kind of task (each task a fresh process, imports included)."""
    spent = {model: r["bench_seconds"] for model, r in results["models"].items() if "bench_seconds" in r}
    if not spent:
        return []
    total = sum(sum(s.values()) for s in spent.values())
    per_model = "; ".join(
        f"{model} {sum(s.values()) / 60:.1f} min (" + ", ".join(f"{k} {v:.0f} s" for k, v in s.items()) + ")"
        for model, s in spent.items()
    )
    return ["", f"This benchmark ran {total / 60:.1f} min: {per_model}."]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--models", nargs="*", help="default: all (one in --smoke)")
    parser.add_argument("--layouts", nargs="*", choices=list(LAYOUTS), help="compile-only layouts; default: all")
    parser.add_argument("--smoke", action="store_true", help="small widths, about a minute")
    parser.add_argument("--compile-only", action="store_true", help="only the compile-only rows (no weights)")
    parser.add_argument("--steady-only", action="store_true", help="only the steady calls: each family's rate")
    parser.add_argument(
        "--conversion-only", action="store_true", help="only the whole conversion process against the naive script"
    )
    parser.add_argument(
        "--spatial-scale",
        type=int,
        default=1,
        metavar="K",
        help="with --steady-only: the video rows' latent and video K times as high and wide (rates past fixed costs)",
    )
    parser.add_argument(
        "--compile-size", nargs=2, type=int, metavar=("HEIGHT", "WIDTH"), help="compile-only rows at this size"
    )
    args = arguments_or_task(parser, TASKS)
    if args is None:
        return
    if args.spatial_scale > 1 and not args.steady_only:
        parser.error("--spatial-scale goes with --steady-only")
    with tempfile.TemporaryDirectory(prefix="vae-convert-bench-") as work:
        results = {
            "device": _device(),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "mode": "smoke" if args.smoke else "compile-only" if args.compile_only else "full",
            "steady only": args.steady_only,
            "conversion only": args.conversion_only,
            "models": {},
        }
        # the matrix rate measured before and after each model, its own the better of its two: one measurement
        # alone has been seen a third low on this machine's slower minutes
        rate_before = None if args.smoke or args.conversion_only else _task("matmul_rate")
        measured = {
            model: scaled(shapes, args.spatial_scale) for model, shapes in cases(args.smoke, args.models).items()
        }
        # the results' file: the first mode asked for, else the full run's
        modes = {"steady": args.steady_only, "conversion": args.conversion_only, "smoke": args.smoke}
        name = next((mode for mode, asked in modes.items() if asked), "latest")
        name += f"-x{args.spatial_scale}" if args.spatial_scale > 1 else ""
        for model in measured:
            print(f"measuring {model} ...", file=sys.stderr)
            layouts = args.layouts if args.layouts is not None else SMOKE_LAYOUTS if args.smoke else list(LAYOUTS)
            model_work = Path(work) / model
            model_work.mkdir()
            results["models"][model] = measure_model(
                model, measured[model], model_work, args.smoke, layouts, args.compile_only, args.compile_size,
                args.steady_only, args.conversion_only,
            )  # fmt: skip
            if rate_before:
                rate_after = _task("matmul_rate")
                best = results["models"][model]["matmul"] = max(rate_before, rate_after, key=lambda m: m["gflops"])
                results["matmul"] = max(results.get("matmul", best), best, key=lambda m: m["gflops"])
                rate_before = rate_after
            shutil.rmtree(model_work)  # its files would crowd the next model's out of the page cache
            # written after each model: a long run that stops keeps what it measured
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
            (args.out / f"{name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
