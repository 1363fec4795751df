"""How far bfloat16 is from float32, for our two targets and for diffusers' own bfloat16, on the same weights and
inputs at a model's real size:

    python -m bench.precision ltx-2:audio_vae ltx-2:vocoder ltx-2.3:vocoder
    python -m bench.precision sd1.5 --size 256 256        # another sample size than the family's native one

Each model: a random checkpoint of the real architecture (`vae-convert random-checkpoint`), converted with
`--dtype bfloat16` to each target (no validation), and diffusers' model on the float32 checkpoint. The reference is
diffusers in float32; the rows are diffusers' model cast to bfloat16 and our outputs run as users run them (in their
own dtype: `runner(..., native=True)`), each on the same input cast to bfloat16: max and mean |bf16 - fp32| and the
relative L2 error (|bf16 - fp32|_2 / |fp32|_2) of the decode, and of the encode's mean where there is an encoder.
Ours should be no further than diffusers'. The sample is the family's native size (FamilySpec.native_size) unless
--size says otherwise, uniform in [-1, 1]; the decode's input is a standard normal latent of the size the sample
encodes to (a decoder alone: of the sample's size).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from bench import diffusers_class_of, diffusers_decode
from bench.run import REPO, _cpu, _vae_convert

TARGETS = ("flax", "torchax")


def _diffusers_calls(model, dtype):
    """(decode, encode) of a diffusers model in `dtype`, numpy float32 in and out, as its pipelines call it: encode
    None for a decoder alone."""
    import torch

    model = model.to(dtype)

    def run(x, call):
        with torch.no_grad():
            return call(torch.from_numpy(x).to(dtype)).float().numpy()

    def decode(z):
        return run(z, lambda t: diffusers_decode(model, t))

    def encode(x):
        return run(x, lambda t: model.encode(t).latent_dist.mean)

    return decode, encode if hasattr(model, "encode") else None


def measure(name: str, size: list[int] | None, work: Path) -> dict:
    import torch

    import converter
    from converter.registry import get_model
    from converter.targets import TARGETS as BY_NAME

    entry = get_model(name)
    family = entry.family
    source = work / "source"
    _vae_convert("random-checkpoint", entry.qualified, source)
    reference = diffusers_class_of(source).from_pretrained(source).eval()
    config = family.config_class.from_dict(json.loads((source / "config.json").read_text()))
    sizes = size or list(family.native_size)
    rng = np.random.default_rng(0)
    channels = (family.validation_sample_shape or family.validation_latent_shape)(config)[1]
    sample = rng.uniform(-1, 1, (1, channels, *sizes)).astype(np.float32)
    expected_decode, expected_encode = _diffusers_calls(reference, torch.float32)
    expected = {}
    if expected_encode is not None:
        expected["encode"] = expected_encode(sample)
        latent = rng.standard_normal(expected["encode"].shape).astype(np.float32)
    else:
        latent = sample
    expected["decode"] = expected_decode(latent)
    runs = {"diffusers": _diffusers_calls(reference, torch.bfloat16)}
    for target in TARGETS:
        out = work / target
        _vae_convert(entry.qualified, "--source", source, "--to", target, "--out", out, "--dtype", "bfloat16",
                     "--no-validate")  # fmt: skip
        runner = BY_NAME[target].runner(converter.load(out), native=True)
        encode = (lambda x, r=runner: r.encode(x)[0]) if expected_encode is not None else None
        runs[target] = (runner.decode, encode)
    inputs = {"decode": latent, "encode": sample}
    result = {"sample": list(sample.shape), "latent": list(latent.shape), "rows": {}}
    for impl, calls in runs.items():
        result["rows"][impl] = {}
        for part, call in zip(("decode", "encode"), calls):
            if call is None:
                continue
            got = np.asarray(call(inputs[part]), np.float64)
            difference = np.abs(got - expected[part])
            result["rows"][impl][part] = {
                "max": float(difference.max()),
                "mean": float(difference.mean()),
                "relative L2": float(np.linalg.norm(difference) / np.linalg.norm(expected[part])),
            }
    return result


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
    results = {}
    for name in args.models:
        with tempfile.TemporaryDirectory() as work:
            results[name] = measure(name, args.size, Path(work))
        print(json.dumps({name: results[name]}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "precision.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results, _cpu())
    (args.out / "precision.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
