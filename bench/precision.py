"""How far bfloat16 is from float32, for our two targets and for diffusers' own bfloat16, on the same weights and
inputs at a model's real size:

    python -m bench.precision ltx-2:audio_vae ltx-2:vocoder ltx-2.3:vocoder
    python -m bench.precision sd1.5 --size 256 256        # another sample size than the family's native one

Each run replaces the rows of the models it names in bench/results/precision.{json,md} and keeps the others.

Each model: a random checkpoint of the real architecture (`vae-convert random-checkpoint`), converted with `--dtype
bfloat16` to each target (no validation), and diffusers' model on the float32 checkpoint. The reference is diffusers
in float32; the rows are diffusers' model loaded in bfloat16 (`torch_dtype`, its `_keep_in_fp32_modules` kept; its
convolutions as bfloat16_convolutions_in_float32 computes them, PyTorch's own but for a rare last bit) and
our outputs run as users run them (in their own dtype: `runner(..., native=True)`), each on the same input cast to
bfloat16: max and mean |bf16 - fp32| and the relative L2 error (|bf16 - fp32|_2 / |fp32|_2) of the decode, and of
the encode's mean where there is an encoder. Ours should be no further than diffusers'. The sample is the family's
native size (FamilySpec.native_size) unless --size says otherwise, uniform in [-1, 1]; the decode's input is a
standard normal latent of the size the sample encodes to (a decoder alone: of the sample's size).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path

import numpy as np

from bench import diffusers_class_of, diffusers_decode
from bench.flops import encoded_shape
from bench.run import REPO, _cpu, _vae_convert

TARGETS = ("flax", "torchax")


def _diffusers_calls(folder: Path, dtype) -> tuple:
    """(decode, encode) of diffusers' model of a checkpoint folder in `dtype`, numpy float32 in and out, as its
    pipelines load and call it (`from_pretrained(torch_dtype=...)`, which keeps the class's `_keep_in_fp32_modules`
    in float32): encode None for a decoder alone."""
    import torch

    from converter.models.common.protocol import encoded

    model = diffusers_class_of(folder).from_pretrained(folder, torch_dtype=dtype).eval()

    def run(x, call):
        with torch.no_grad(), bfloat16_convolutions_in_float32():
            return call(torch.from_numpy(x).to(dtype)).float().numpy()

    def decode(z):
        return run(z, lambda t: diffusers_decode(model, t))

    def encode(x):
        return run(x, lambda t: encoded(model.encode(t))[0])

    return decode, encode if hasattr(model, "encode") else None


@contextlib.contextmanager
def bfloat16_convolutions_in_float32():
    """Within it, PyTorch's 1D, 2D and 3D convolutions of bfloat16 tensors compute in float32 on the bfloat16 values
    and round their output to bfloat16 once, as the native kernels, which accumulate in float32, do. On a CPU without
    bfloat16 units (AVX2) the native ones take a reference path 25-300x slower than float32's (a CogVideoX decode at
    small widths: 15 s against 0.6 s); the outputs are the native ones but for rare last-bit roundings
    (tests/test_bench.py)."""
    import torch
    import torch.nn.functional as F

    originals = {name: getattr(F, name) for name in ("conv1d", "conv2d", "conv3d")}

    def in_float32(convolution):
        def convolve(input, weight, bias=None, *args, **kwargs):
            if input.dtype != torch.bfloat16:
                return convolution(input, weight, bias, *args, **kwargs)
            bias = None if bias is None else bias.float()
            return convolution(input.float(), weight.float(), bias, *args, **kwargs).to(torch.bfloat16)

        return convolve

    for name, convolution in originals.items():
        setattr(F, name, in_float32(convolution))
    try:
        yield
    finally:
        for name, convolution in originals.items():
            setattr(F, name, convolution)


def errors(source: Path, outputs: dict[str, Path], latent: np.ndarray, sample: np.ndarray | None) -> dict:
    """{implementation: {part: {"max", "mean", "relative L2"}}}: how far diffusers' bfloat16 model of the float32
    checkpoint `source` and each target's bfloat16 output (`outputs`: target -> folder, run in its own dtype) decode
    `latent` and encode `sample` (None: a decoder alone) from diffusers' float32 model."""
    import torch

    import converter
    from converter.targets import TARGETS as BY_NAME

    inputs = {"decode": latent, "encode": sample}
    expected = {part: np.asarray(call(inputs[part])) for part, call in _parts(_diffusers_calls(source, torch.float32))}
    runs = {"diffusers": _diffusers_calls(source, torch.bfloat16)}
    for target, out in outputs.items():
        runner = BY_NAME[target].runner(converter.load(out), native=True)
        runs[target] = (runner.decode, (lambda x, r=runner: r.encode(x)[0]) if sample is not None else None)
    rows = {}
    for impl, calls in runs.items():
        rows[impl] = {}
        for part, call in _parts(calls):
            difference = np.abs(np.asarray(call(inputs[part]), np.float64) - expected[part])
            rows[impl][part] = {
                "max": float(difference.max()),
                "mean": float(difference.mean()),
                "relative L2": float(np.linalg.norm(difference) / np.linalg.norm(expected[part])),
            }
    return rows


def _parts(calls: tuple) -> list[tuple]:
    return [(part, call) for part, call in zip(("decode", "encode"), calls) if call is not None]


def measure(name: str, size: list[int] | None, work: Path) -> dict:
    from converter.registry import get_model

    entry = get_model(name)
    family = entry.family
    source = work / "source"
    _vae_convert("random-checkpoint", entry.qualified, source)
    config = family.config_class.from_dict(json.loads((source / "config.json").read_text()))
    sizes = size or list(family.native_size)
    rng = np.random.default_rng(0)
    channels = (family.validation_sample_shape or family.validation_latent_shape)(config)[1]
    sample = rng.uniform(-1, 1, (1, channels, *sizes)).astype(np.float32)
    outputs = {}
    for target in TARGETS:
        outputs[target] = work / target
        _vae_convert(entry.qualified, "--source", source, "--to", target, "--out", outputs[target], "--dtype",
                     "bfloat16", "--no-validate")  # fmt: skip
    if family.validation_sample_shape is None:  # a decoder alone: its input is of the sample's size
        latent, sample = sample, None
    else:
        latent = rng.standard_normal(encoded_shape(entry.qualified, list(sample.shape))).astype(np.float32)
    rows = errors(source, outputs, latent, sample)
    return {"sample": list((latent if sample is None else sample).shape), "latent": list(latent.shape), "rows": rows}


def markdown(results: dict, machine: str) -> str:
    lines = [
        f"bfloat16 against float32 (diffusers' float32 model the reference), {machine.strip()}",
        "",
        "| model | sample | implementation | decode max | decode mean | decode rel. L2 | encode max | encode mean | "
        "encode rel. L2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        for impl, parts in result["rows"].items():
            cells = [
                f"{parts[p][k]:.3g}" if p in parts else "-"
                for p in ("decode", "encode")
                for k in ("max", "mean", "relative L2")
            ]
            lines.append(f"| {name} | {'x'.join(map(str, result['sample']))} | {impl} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--size", type=int, nargs="+", help="the sample's sizes after its channels")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kept = args.out / "precision.json"
    # the models measured here replace their rows; other models' rows stay (each run names its sizes)
    results = json.loads(kept.read_text()) if kept.exists() else {}
    for name in args.models:
        with tempfile.TemporaryDirectory() as work:
            results[name] = measure(name, args.size, Path(work))
        print(json.dumps({name: results[name]}), flush=True)
        kept.write_text(json.dumps(results, indent=2) + "\n")
        table = markdown(results, _cpu())
        (args.out / "precision.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
