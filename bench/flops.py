"""The rate each implementation's steady decode and encode reach, with the operations counted as the field counts
them: 2 per multiply-add of the reference model's convolutions, matrix products and attention (PyTorch's
FlopCounterMode over the project's PyTorch model, diffusers' architecture, run on the meta device: nothing is
computed). XLA's own count of a compiled step (bench/run.py's GFLOP column) leaves operations out (a Flux.2 decode at
1024x1024: 6,746 GFLOP by XLA, 10,475 by this count), so rates computed from it understate how busy the CPU is.

    python -m bench.flops                      # every result in bench/results/ with steady timings
    python -m bench.flops bench/results/sd1.5.json

Each result's steady seconds (the best of its rounds) divided into the count, beside the matrix-multiply rate its run
measured in the same process tree (the best float32 (2048, 2048) product under XLA): rates of one machine's day are
not compared with another's. bench/run.py's own tables use the same count.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
IMPLEMENTATIONS = ("flax", "torchax", "diffusers")


def _reference(model: str, small: bool = False):
    """(the project's PyTorch model of `model`'s architecture on the meta device, evaluating; its family; its
    config); `small`: at the family's small widths, as the benchmark's smoke mode runs it."""
    import torch

    from converter.registry import config_from_dict, get_model, small_config

    entry = get_model(model)
    config = config_from_dict(entry.family, {**entry.config, **(small_config(entry) if small else {})})
    with torch.device("meta"):
        return entry.family.torch_model()(config).eval(), entry.family, config


def encoded_shape(model: str, sample: list[int], small: bool = False) -> list[int]:
    """The shape of the latent `model`'s architecture encodes a `sample` (channels-first) to, worked out on the meta
    device (nothing computed; `small`: at the family's small widths)."""
    import torch

    from converter.models.common.protocol import encoded

    reference, _, _ = _reference(model, small)
    with torch.device("meta"), torch.no_grad():
        return list(encoded(reference.encode(torch.zeros(sample)))[0].shape)


@functools.cache  # once a process: PyTorch refuses a second formula for an op
def _count_own_ops():
    """FlopCounterMode counts the project's own PyTorch ops (models/common/layers_torch.py) as the reference runs what
    they stand for: the upsamplers' convolution as diffusers' convolution of the upsampled input, the frame-causal
    attention as diffusers' masked attention over every token, the anti-aliased SnakeBeta as diffusers' Activation1d
    filters (on the meta device an op of ours runs no ATen op inside, and would count nothing)."""
    import torch
    from torch.utils.flop_counter import conv_flop_count, register_flop_formula, sdpa_flop_count

    from converter.models.common import layers_torch  # noqa: F401  (registers the ops)
    from converter.models.common.anti_alias import edges

    ops = torch.ops.vae_convert

    @register_flop_formula(ops.upsampled_conv)
    def _(x_shape, w_shape, bias_shape, edge, *, out_shape, **kwargs):
        return conv_flop_count([*x_shape[:-2], 2 * x_shape[-2], 2 * x_shape[-1]], w_shape, out_shape)

    @register_flop_formula(ops.anti_aliased_snake)
    def _(x_shape, up_shape, down_shape, alpha_shape, beta_shape, ratio, *, out_shape, **kwargs):
        # a depthwise transposed convolution of the edge-padded input, then a strided depthwise one of the activated
        # signal, edge-padded
        batch, channels, length = x_shape
        (up,), (down,) = up_shape, down_shape
        pad, _, down_pad = edges(up, down, ratio)
        padded = [batch, channels, length + 2 * pad]
        upsampled = [batch, channels, length * ratio + sum(down_pad)]
        return conv_flop_count(padded, [channels, 1, up], None, transposed=True) + conv_flop_count(
            upsampled, [channels, 1, down], out_shape
        )

    @register_flop_formula(ops.frame_causal_attention)
    def _(q_shape, k_shape, v_shape, frames, *, out_shape, **kwargs):  # (B, N, C): one head
        return sdpa_flop_count(*([shape[0], 1, *shape[1:]] for shape in (q_shape, k_shape, v_shape)))


def count(model: str, latent: list[int], video: list[int] | None, small: bool = False) -> dict[str, float]:
    """GFLOP of one decode of `latent` and one encode of `video` (channels-first; None: a decoder alone) by `model`'s
    architecture (`small`: at the family's small widths, as the benchmark's smoke mode runs it)."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from converter.validate import decode_inputs

    _count_own_ops()
    reference, family, config = _reference(model, small)
    inputs = {name: torch.from_numpy(np.asarray(v)) for name, v in decode_inputs(family, config).items()}
    counted = {}
    with torch.device("meta"), torch.no_grad():
        calls = {
            "decode": lambda: reference.decode(torch.zeros(latent), **{k: v.to("meta") for k, v in inputs.items()})
        }
        if video is not None:
            calls["encode"] = lambda: reference.encode(torch.zeros(video))
        for part, call in calls.items():
            with FlopCounterMode(display=False) as counter:
                call()
            counted[part] = counter.get_total_flops() / 1e9
    return counted


def matmul_rate(results: dict, model: str) -> float:
    """The matrix-multiply rate (GFLOP/s) a run sets `model` against: the one measured around it, where the run
    measured one per model, else the run's."""
    return results["models"][model].get("matmul", results["matmul"])["gflops"]


def rates(path: Path) -> list[dict]:
    """The rows of one result that recorded its shapes and its machine's matrix-multiply rate (earlier results do
    not say which shapes they timed)."""
    results = json.loads(path.read_text())
    rows = []
    if "matmul" not in results:
        return rows
    for model, result in results.get("models", {}).items():
        steady = {i: result["run"][i] for i in IMPLEMENTATIONS if "steady" in result.get("run", {}).get(i, {}).get(
            "decode", {})}  # fmt: skip
        if not steady or "shapes" not in result:
            continue
        gflop = count(model, result["shapes"]["latent"], result["shapes"]["video"])
        rate = matmul_rate(results, model)
        for impl, timings in steady.items():
            for part, operations in gflop.items():
                seconds = timings.get(part, {}).get("steady")
                if seconds:
                    rows.append(
                        dict(source=path.name, model=model, impl=impl, part=part, gflop=operations, seconds=seconds,
                             gflops=operations / seconds, share=operations / seconds / rate, matmul=rate)
                    )  # fmt: skip
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", type=Path)
    args = parser.parse_args()
    paths = args.results or sorted(p for p in RESULTS.glob("*.json") if not p.name.startswith("gpu"))
    rows = [row for path in paths for row in rates(path)]
    lines = [
        "Steady decode and encode against the matrix-multiply rate of the same run, operations counted 2 per "
        "multiply-add (`python -m bench.flops`)",
        "",
        "| result | model | implementation | step | GFLOP | steady | GFLOP/s | share of the matmul rate |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['source']} | {r['model']} | {r['impl']} | {r['part']} | {r['gflop']:,.0f} | {r['seconds']:.2f} s | "
            f"{r['gflops']:.0f} | {r['share']:.0%} of {r['matmul']:.0f} |"
            for r in rows
        ),
    ]
    (RESULTS / "rates.json").write_text(json.dumps(rows, indent=2) + "\n")
    (RESULTS / "rates.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
