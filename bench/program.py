"""What XLA would run for a VAE's encode and decode on an NVIDIA H200, read on a machine without one: every step of
the family's native video (or image) traced as a user's run traces it and compiled for the GPU that
bench/h200.txtpb describes (XLA's GpuTargetConfigProto, written from the H200's published figures) by JAX's CUDA
plugin, which compiles without a GPU or CUDA. From each optimised program: its kernels, its convolutions by the
dtype they run in, and the bytes every kernel reads and writes, added over the calls of the whole encode or decode,
with the time those bytes take at the device's bandwidth: a floor, with no overlap and no cache. A GPU's program
can be compared and changed between leases; its time waits for one (bench/accelerator.py).

    pip install jax-cuda12-plugin==<JAX's version> jax-cuda12-pjrt==<JAX's version>   # no GPU or CUDA needed
    pip install nvidia-cudnn-cu12   # for cuDNN's fused attention (models/common/attention.py); without it, blocked
    python -m bench.program --models flux.2-dev ltx-video --dtype bfloat16 --targets flax torchax
    python -m bench.program --smoke --platform cpu   # the host's own program, small widths (the tests run it)
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import sys
import time
from pathlib import Path

from bench.run import REPO, compiled_steps

TARGET_CONFIG = Path(__file__).with_name("h200.txtpb")
BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "f64": 8}
SHAPE = re.compile(r"\b(" + "|".join(BYTES) + r")\[([\d,]*)\]")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) ([\w-]+)\((.*)$")
# what no kernel runs for: names for buffers, or XLA's control flow (a loop's body is read in its place)
PRODUCTS = {"convolution", "dot"}
PRODUCT_CALL = re.compile(r"conv|gemm|matmul", re.I)  # cuDNN's, cuBLAS's and the CPU's library calls
FUSED_ATTENTION = re.compile(r"fmha")  # cuDNN's fused attention, its two products in one kernel
NOT_KERNELS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "after-all", "partition-id"}


def _bytes(shape: str) -> int:
    """The bytes of an HLO shape, a tuple's added up."""
    return sum(BYTES[t] * math.prod(int(d) for d in dims.split(",") if d) for t, dims in SHAPE.findall(shape))


def _computations(text: str) -> dict[str, list[str]]:
    """An HLO module's computations by name, each its instruction lines."""
    computations, name = {}, None
    for line in text.splitlines():
        header = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
        if header:
            name = header.group(1)
            computations[name] = []
        elif name and line.startswith("  "):
            computations[name].append(line)
    computations["ENTRY"] = computations[re.search(r"^ENTRY %(\S+) ", text, re.M).group(1)]
    return computations


def _sliced(fused: list[str], operands: list[int], written: int) -> int:
    """A fused kernel's bytes written, its operands' bytes read set in place (`operands`, by parameter number): a
    parameter it only takes slices of (static or dynamic, of the parameter or of its conversion) is read as those
    slices, and the buffer a dynamic-update-slice writes into in place is neither read nor written but for the
    update."""
    parameters, sizes = {}, {}
    slices, in_place, whole = collections.Counter(), set(), set()
    for line in fused:
        match = INSTRUCTION.match(line)
        if not match:
            continue
        name, shape, op, rest = match.groups()
        sizes[name] = _bytes(shape)
        names = re.findall(r"%([\w.-]+)", rest.split("), ")[0])
        if op == "parameter":
            parameters[name] = int(rest.split(")")[0])
        elif op in ("convert", "bitcast") and names[0] in parameters:  # still that parameter
            parameters[name] = parameters[names[0]]
        else:
            for position, operand in enumerate(names):
                if operand not in parameters:
                    continue
                if position == 0 and op in ("slice", "dynamic-slice"):
                    slices[parameters[operand]] += sizes[name]
                elif position == 0 and op == "dynamic-update-slice":  # the update is defined before it
                    written = sizes.get(names[1], 0)
                    in_place.add(parameters[operand])
                else:
                    whole.add(parameters[operand])
    for parameter, read in slices.items():
        if parameter not in whole:
            operands[parameter] = min(operands[parameter], read)
    for parameter in in_place - whole:
        operands[parameter] = 0
    return written


def read_program(text: str) -> dict:
    """One compiled step's kernels, convolutions by the dtype of their result, and the bytes its kernels read and
    write, a loop's body counted once per trip (XLA's known trip count)."""
    computations = _computations(text)
    kernels, convolutions, moved = collections.Counter(), collections.Counter(), collections.Counter()
    flops = 0

    def walk(name: str, times: int):
        nonlocal flops
        sizes = {}
        for line in computations[name]:
            match = INSTRUCTION.match(line)
            if not match:
                continue
            result, shape, op, rest = match.groups()
            sizes[result] = _bytes(shape)
            if op == "while":
                body = re.search(r"body=%([^,\s]+)", rest).group(1)
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
                walk(body, times * int(trips.group(1) if trips else 1))
                continue
            if op in NOT_KERNELS:
                continue
            kind = re.search(r"kind=(\w+)", rest) if op == "fusion" else None
            target = re.search(r'custom_call_target="([^"]+)"', rest)
            label = kind.group(1) if kind else (target.group(1) if target else op)
            kernels[label] += times
            operands = [sizes.get(o, 0) for o in re.findall(r"%([\w.-]+)", rest.split("), ")[0])]
            called = re.search(r"calls=%([^,\s]+)", rest)
            written = sizes[result]
            if called:
                written = _sliced(computations[called.group(1)], operands, written)
            moved[label] += times * (written + sum(operands))
            if target and FUSED_ATTENTION.search(target.group(1)):
                flops += times * _attention_flops(line, computations[name])
                continue
            # convolutions and matrix products: cuDNN's or cuBLAS's calls, XLA's own instructions, or inside a kernel
            if op in PRODUCTS or (target and PRODUCT_CALL.search(target.group(1))):
                found = [(line, computations[name])]
            else:
                inside = computations.get(called.group(1), []) if called else []
                found = [(i, inside) for i in inside if (m := INSTRUCTION.match(i)) and m.group(3) in PRODUCTS]
            for product, scope in found:
                if "dim_labels=" in product:  # a convolution's
                    convolutions[SHAPE.search(INSTRUCTION.match(product).group(2)).group(1)] += times
                flops += times * _flops(product, scope)

    walk("ENTRY", 1)
    return {"kernels": dict(kernels), "convolutions": dict(convolutions), "bytes": dict(moved), "flops": flops}


def _flops(line: str, scope: list[str]) -> int:
    """A convolution's or matrix product's operations as the field counts them, 2 for each multiply-add: each output
    element takes a convolution's kernel elements over its output channels, a product's contracted elements; a
    product of a matrix and a vector counts none. `scope`: the lines of the computation it is in (its operands'
    shapes)."""
    _, shape, _, rest = INSTRUCTION.match(line).groups()
    outputs = math.prod(int(d) for d in SHAPE.search(shape).group(2).split(",") if d)
    lhs, rhs = re.findall(r"%([\w.-]+)", rest.split("), ")[0])[:2]
    shapes = {m.group(1): m.group(2) for i in scope if (m := INSTRUCTION.match(i))}

    def dims(name):
        return [int(d) for d in SHAPE.search(shapes[name]).group(2).split(",") if d]

    labels = re.search(r"dim_labels=\w+_(\w+)->", rest)
    if labels:
        kernel = dims(rhs)
        return 2 * outputs * math.prod(kernel) // kernel[labels.group(1).index("o")]

    def axes(side, kind):  # an operand's contracting or batch axes, as XLA's instruction or cuBLAS's call gives them
        found = re.search(rf'{side}_{kind}_dim(?:s=\{{|ensions":\[)([\d,"]*)', rest)
        return [int(d) for d in found.group(1).replace('"', "").split(",") if d] if found else []

    def free(side, name):  # the elements of an operand's axes that are neither contracted nor batched
        shape = dims(name)
        return math.prod(shape) // math.prod(shape[d] for d in axes(side, "contracting") + axes(side, "batch"))

    if min(free("lhs", lhs), free("rhs", rhs)) == 1:  # a matrix and a vector (a CPU's GroupNorm sums so): no layer's
        return 0
    return 2 * outputs * math.prod(dims(lhs)[d] for d in axes("lhs", "contracting"))


def _attention_flops(line: str, scope: list[str]) -> int:
    """cuDNN's fused attention's two products, 2 for each multiply-add: the (batch, heads, queries, keys) scores it
    keeps on chip (its configuration's intermediate shape) times the query's and the value's head widths."""
    _, _, _, rest = INSTRUCTION.match(line).groups()
    query, _, value = re.findall(r"%([\w.-]+)", rest.split("), ")[0])[:3]
    shapes = {m.group(1): m.group(2) for i in scope if (m := INSTRUCTION.match(i))}
    scores = re.search(r'"intermediate_tensor_shape":\s*\{[^}]*?"dimensions":\s*\[([\d",\s]*)\]', rest)
    widths = [int(SHAPE.search(shapes[o]).group(2).split(",")[-1]) for o in (query, value)]
    return 2 * math.prod(int(d.strip(' "')) for d in scores.group(1).split(",")) * sum(widths)


def _added(programs: list[tuple[dict, int]]) -> dict:
    """The steps' readings, each times its calls."""
    total = {"kernels": collections.Counter(), "convolutions": collections.Counter(), "bytes": collections.Counter()}
    for program, calls in programs:
        for key, counts in total.items():
            counts.update({k: v * calls for k, v in program[key].items()})
    return {**{k: dict(v) for k, v in total.items()}, "flops": sum(p["flops"] * calls for p, calls in programs)}


def _target_device(platform: str):
    """The sharding a step compiles for: the H200 XLA's CUDA compiler is told of, or the host's first device."""
    import jax

    if platform == "cpu":
        return None
    from jax.experimental import topologies

    topology = topologies.get_topology_desc("h200", platform, target_config=TARGET_CONFIG.read_text(), topology="1x1x1")
    return jax.sharding.SingleDeviceSharding(topology.devices[0])


def _bandwidth() -> float:
    """The H200's memory bandwidth in bytes a second, as its description gives it."""
    return float(re.search(r"memory_bandwidth: (\d+)", TARGET_CONFIG.read_text()).group(1))


class TorchaxCompileOnlyStep:
    """Stands in for the torchax runtime's chunk step (converter/torchax_runtime.py, TorchaxVAE) while the PyTorch
    model's encode or decode runs its glue on zeros: each new step signature is lowered, its parameters abstract, and
    compiled for `device`, never run; zeros of its outputs go back to the glue."""

    def __init__(self, model, device):
        import jax
        import torch

        from converter import torchax_runtime

        self.model, self.device, self.compiled, self.calls = model, device, {}, collections.Counter()
        self.kernels = torchax_runtime.stored_kernels(model)
        self.params = {
            name: jax.ShapeDtypeStruct(
                tuple(t.shape[i] for i in torchax_runtime.kernel_order(t.ndim)) if name in self.kernels else t.shape,
                str(t.dtype).removeprefix("torch."),
                sharding=device,
            )
            for name, t in (*model.named_parameters(), *model.named_buffers())
            if t.dtype != torch.int64  # counts: none in a step
        }

    def __call__(self, part, x, cache, inputs, keep_cache):
        import jax
        import jax.numpy as jnp
        from torchax import interop

        from converter import torchax_runtime
        from converter.models.common.conv import STEP_COMPILER_OPTIONS

        key = (part, tuple(x.shape), cache is None, keep_cache)
        self.calls[key] += 1
        if key not in self.compiled:
            run = torchax_runtime.step_function(self.model, part, keep_cache, self.kernels)
            args = jax.tree.map(
                lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.device),
                interop.jax_view((x, cache, inputs)),
            )
            jitted = jax.jit(interop.jax_view(run), compiler_options=STEP_COMPILER_OPTIONS)
            self.compiled[key] = (jitted.lower(self.params, *args).compile(), None)
        compiled, _ = self.compiled[key]
        return interop.torch_view(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), compiled.out_info))


def torchax_steps(model: str, smoke: bool, size, dtype: str, device):
    """As bench.run.compiled_steps for the torchax target, whole frames: the PyTorch model's encode, then its decode
    of the encoder's latent, traced as the torchax runtime runs them."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    from bench.run import SMOKE_VIDEO
    from converter import torchax_runtime
    from converter.models.common.protocol import encoded
    from converter.registry import config_from_dict, get_model, small_config
    from converter.targets import TARGETS
    from converter.validate import decode_inputs

    entry = get_model(model)
    config = config_from_dict(entry.family, {**entry.config, **(small_config(entry) if smoke else {})})
    target = TARGETS["torchax"]
    vae = target.cast(target.empty_model(entry.family, config, dtype), np.dtype(dtype)).eval()
    vae.disable_tiling()
    env = torchax_runtime.torchax_env()  # before torchax is imported (converter/torchax_runtime.py)
    from torchax import interop

    *sizes, h, w = SMOKE_VIDEO[2:] if smoke else entry.family.native_size
    h, w = size or (h, w)
    channels = entry.family.validation_sample_shape(config)[1]
    video = jnp.zeros((1, channels, *(sizes if entry.family.frame_axis else []), h, w), dtype)
    with env, torch.no_grad():
        inputs = {k: interop.torch_view(jnp.asarray(v)) for k, v in decode_inputs(entry.family, config).items()}
        recorder = TorchaxCompileOnlyStep(vae, device)
        # in the model's dtype, as the runner gives a latent (a posterior's mean may be float32)
        latent = encoded(vae.encode(interop.torch_view(video), step=recorder))[0].to(getattr(torch, dtype))
        yield "encoder", video, recorder
        recorder = TorchaxCompileOnlyStep(vae, device)
        vae.decode(latent, step=recorder, **inputs)
        yield "decoder", latent, recorder


def measure(model: str, dtype: str, platform: str, smoke: bool, tiled: bool, size=None, target="flax") -> dict:
    """{part: its input, steps, calls and reading} of one model's encode and decode on `target`, compiled for
    `platform`."""
    import jax

    device = _target_device(platform)
    default_backend = jax.default_backend
    if platform != "cpu":  # the models pick their routes by the backend they are traced for (models/common/conv.py)
        jax.default_backend = lambda: "gpu"
    try:
        result = {}
        layout = "tiled" if tiled else "one device"
        if target == "torchax":
            parts = torchax_steps(model, smoke, size, dtype, device)
        else:
            parts = compiled_steps(model, layout, smoke, size, dtype, device)
        for part, video, recorder in parts:
            programs = [(read_program(c.as_text()), recorder.calls[key]) for key, (c, _) in recorder.compiled.items()]
            result[part] = {
                "input": list(video.shape),
                "steps": len(programs),
                "calls": sum(recorder.calls.values()),
                **_added(programs),
            }
        return result
    finally:
        jax.default_backend = default_backend


def markdown(results: dict) -> str:
    bandwidth = _bandwidth() if results["platform"] != "cpu" else None
    lines = [
        f"Compiled for {results['target']} on {results['host']}; {results['date']}; {results['versions']}.",
        "",
        "| model | dtype | implementation | part | input | steps, calls | kernels | convolutions | TFLOP | GB moved "
        "| at the bandwidth |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (model, dtype, implementation), parts in ((tuple(k.split(" ")), v) for k, v in results["rows"].items()):
        for part, r in parts.items():
            moved = sum(r["bytes"].values())
            convolutions = ", ".join(f"{n} {t}" for t, n in sorted(r["convolutions"].items())) or "-"
            floor = f"{moved / bandwidth * 1e3:.1f} ms" if bandwidth else "-"
            lines.append(
                f"| {model} | {dtype} | {implementation} | {part} | {tuple(r['input'])} | {r['steps']}, {r['calls']} | "
                f"{sum(r['kernels'].values()):,} | {convolutions} | {r['flops'] / 1e12:.2f} | {moved / 1e9:.2f} | "
                f"{floor} |"
            )
    lines += [
        "",
        "steps, calls = the distinct steps compiled and how many times the encode or decode calls them; kernels = "
        "the kernels of those calls (a loop's body once per trip); convolutions = by the dtype they compute in; "
        "TFLOP = the operations of the convolutions and matrix products, 2 for each multiply-add; GB "
        "moved = the bytes those kernels read and write; at the bandwidth = that over the device's memory bandwidth "
        "(a floor: no overlap, no cache).",
    ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["flux.2-dev"])
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--platform", choices=("cuda", "cpu"), default="cuda", help="cpu: the host's own program")
    parser.add_argument("--size", nargs=2, type=int, metavar=("H", "W"), help="another height and width")
    parser.add_argument("--tiled", action="store_true", help="in the model's tiles (flax only)")
    parser.add_argument("--targets", nargs="+", choices=("flax", "torchax"), default=["flax"])
    parser.add_argument("--smoke", action="store_true", help="small widths and a small video")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    if args.tiled and "torchax" in args.targets:
        parser.error("--tiled reads the Flax models' tiles only")
    import platform

    import jax

    results = {
        "target": "an NVIDIA H200 (bench/h200.txtpb)" if args.platform == "cuda" else "this CPU",
        "platform": args.platform,
        "host": f"{platform.machine()}, no GPU" if args.platform == "cuda" else platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "versions": f"JAX {jax.__version__}",
        "rows": {},
    }
    for model in args.models:
        for target in args.targets:
            print(f"compiling {model} ({target}) ...", file=sys.stderr)
            results["rows"][f"{model} {args.dtype} {target}"] = measure(
                model, args.dtype, args.platform, args.smoke, args.tiled, args.size, target
            )
    name = "program-smoke" if args.smoke else f"program-{args.platform}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
