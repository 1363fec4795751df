"""The benchmark's smoke mode runs end to end and reports every measurement (the full run is bench/run.py); the
operations its rates count are those an independent count finds."""

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import REPO


def _smoke(script: str, out, *options):
    """A benchmark script's smoke mode, run as a user runs it, its results written to `out`."""
    command = [sys.executable, "-m", script, "--smoke", "--out", str(out), *options]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)


@pytest.mark.slow  # the benchmark's every task, each a fresh process
def test_benchmark_smoke_mode(tmp_path):
    _smoke("bench.run", tmp_path)
    results = json.loads((tmp_path / "smoke.json").read_text())
    wan = results["models"]["wan2.1"]
    assert set(wan["convert"]) == {"flax", "torchax", "naive"}
    assert all(m["seconds"] > 0 and m["peak_above_baseline_mb"] >= 0 for m in wan["convert"].values())
    assert wan["whole process"]["vae-convert"] > 0 and wan["whole process"]["naive"] > 0
    loads = ("flax", "flax safetensors", "flax kept structure", "flax safetensors kept structure", "torchax")
    assert all(wan["load"][how]["seconds"] > 0 for how in (*loads, "diffusers"))
    assert all(seconds > 0 for seconds in wan["load"]["flax parts"].values())
    for impl in ("flax", "torch"):
        timings = wan["run"][impl]
        assert all(timings[step][k] > 0 for step in ("decode", "encode") for k in ("first", "steady"))
    # compiled, never run: every step shape, XLA's memory analysis, and width split over "tp" on (1, 8)
    one, split = wan["compile"]["one device"], wan["compile"]["mesh (1, 8)"]
    for part in ("encoder", "decoder"):
        assert one[part]["steps"] == split[part]["steps"] == 2  # first chunk, then the rest
        assert one[part]["compile_seconds"] > 0 and one[part]["cache_frames"] == 2
        assert 0 < split[part]["temp_bytes"] < one[part]["temp_bytes"]
        assert one[part]["cache_bytes"] == split[part]["cache_bytes"]  # the same cache, split over devices
    table = (tmp_path / "smoke.md").read_text()
    assert "| wan2.1 | flax |" in table and "vae-convert torchax" in table and "| wan2.1 | mesh (1, 8) |" in table
    assert "whole process: vae-convert flax" in table
    # a full run's rows: diffusers is the eager reference (no torch row), flax+cache times first calls only
    from bench.run import markdown

    runs = wan["run"]
    runs["diffusers"] = runs.pop("torch")
    runs["flax+cache"] = {step: {"first": runs["flax"][step]["first"]} for step in ("decode", "encode")}
    full = markdown(results)
    assert "| wan2.1 | diffusers |" in full and "| torch |" not in full
    assert f"| wan2.1 | flax+cache | {runs['flax']['decode']['first']:.2f} s | - |" in full


@pytest.mark.slow  # a fresh process timing three implementations
def test_steady_only_mode(tmp_path):
    """--steady-only (each family's rate) times every implementation's steady calls and nothing else (an image
    model: the same code as a video's, in half the time)."""
    _smoke("bench.run", tmp_path, "--steady-only", "--models", "sd1.5")
    (row,) = json.loads((tmp_path / "steady.json").read_text())["models"].values()
    assert set(row) == {"shapes", "run", "bench_seconds"} and set(row["bench_seconds"]) == {"steady"}
    assert all(row["run"][impl][part]["steady"] > 0 for impl in ("flax", "torchax", "diffusers") for part in (
        "decode", "encode"))  # fmt: skip
    assert "| sd1.5 | diffusers |" in (tmp_path / "steady.md").read_text()


def test_conversion_only_mode(tmp_path):
    """--conversion-only times each model's whole conversion process and the naive script's, and nothing else."""
    _smoke("bench.run", tmp_path, "--conversion-only", "--models", "taesd")
    (row,) = json.loads((tmp_path / "conversion.json").read_text())["models"].values()
    assert set(row) == {"checkpoint_mb", "whole process", "bench_seconds"}
    assert row["whole process"]["vae-convert"] > 0 and row["whole process"]["naive"] > 0
    assert "| taesd | " in (tmp_path / "conversion.md").read_text()


@pytest.mark.slow  # every implementation and dtype, each first call a fresh process
def test_accelerator_table_smoke_mode(tmp_path):
    """The accelerator table's command runs every path (Flax, torchax, diffusers eager and compiled, in bfloat16,
    tiled) at small widths on this machine, so that a lent GPU's time goes to measuring."""
    _smoke("bench.accelerator", tmp_path)
    results = json.loads((tmp_path / "accelerator-smoke.json").read_text())
    (row,) = results["rows"].values()
    measured = row["dtypes"]["bfloat16"]
    for impl in ("flax", "torchax", "diffusers", "diffusers+compile"):
        assert all(measured[k][impl][part] > 0 for k in ("first", "steady") for part in ("decode", "encode"))
    assert all(row["gflop"][part] > 0 for part in ("decode", "encode"))
    assert "| diffusers+compile | encode |" in (tmp_path / "accelerator-smoke.md").read_text()


def test_a_programs_reading(tmp_path):
    """bench/program.py compiles a model's every step without running it and reads the program (here the CPU's,
    XLA's convolutions as the tests take them): both parts' kernels, the bytes they move, the convolutions by the
    dtype they run in, float32 on a CPU for a bfloat16 model (models/common/conv.py), and the operations of its
    convolutions and products, which are those PyTorch counts diffusers' model running at the same sizes; for both
    targets, the torchax runtime's steps compiled as it runs them."""
    from bench.flops import count

    options = ("--platform", "cpu", "--models", "sd1.5", "--dtype", "bfloat16", "--targets", "flax", "torchax")
    _smoke("bench.program", tmp_path, *options)
    rows = json.loads((tmp_path / "program-smoke.json").read_text())["rows"]
    assert set(rows) == {"sd1.5 bfloat16 flax", "sd1.5 bfloat16 torchax"}
    torchax_input = rows["sd1.5 bfloat16 torchax"]["decoder"]["input"]  # channels-first, as diffusers takes it
    counted = count("sd1.5", torchax_input, rows["sd1.5 bfloat16 torchax"]["encoder"]["input"], small=True)
    for row in rows.values():
        assert set(row) == {"encoder", "decoder"}
        for part in row.values():
            assert part["steps"] == part["calls"] == 1 and sum(part["kernels"].values()) > 0
            assert sum(part["bytes"].values()) > 0 and set(part["convolutions"]) == {"f32"}
        assert row["decoder"]["flops"] / 1e9 == pytest.approx(counted["decode"], rel=1e-9)
        assert row["encoder"]["flops"] / 1e9 == pytest.approx(counted["encode"], rel=1e-9)
    assert "| sd1.5 | bfloat16 | torchax | decoder |" in (tmp_path / "program-smoke.md").read_text()


def test_a_fused_attention_kernel_counts_both_products_and_moves_only_its_inputs_and_output():
    """A GPU program's cuDNN attention: one kernel whose operations are its two products (scores, then scores by
    values), 2 per multiply-add, and whose bytes are the queries, keys, values and output, the scores never."""
    from bench.program import read_program

    reading = read_program((REPO / "tests" / "data" / "fused-attention-h200.hlo").read_text())
    batch, heads, queries, keys, width = 2, 3, 40, 24, 16
    assert reading["kernels"] == {"__cudnn$fmhaSoftmax": 1}
    assert reading["flops"] == 2 * batch * heads * queries * keys * (width + width)
    assert reading["bytes"] == {"__cudnn$fmhaSoftmax": 2 * batch * heads * width * (2 * queries + 2 * keys)}


def test_accelerator_table_stops_when_its_budget_is_spent(tmp_path):
    """--budget: once its seconds are spent no task starts, and the row says so in both files (a lease's end)."""
    _smoke("bench.accelerator", tmp_path, "--budget", "0")
    (row,) = json.loads((tmp_path / "accelerator-smoke.json").read_text())["rows"].values()
    assert row == {"stopped": "the budget of 0 s was spent"}
    assert (
        "Not finished: sd1.5 24x96 tiled, the budget of 0 s was spent."
        in (tmp_path / "accelerator-smoke.md").read_text()
    )


def _counted_by_hooks(model, call) -> float:
    """GFLOP of `call()` on diffusers' `model` (the oracle's model, not the project's) counted by hooks, not by
    PyTorch's FlopCounterMode: 2 per multiply-add of each convolution and linear layer (its output's size times its
    weight's fan-in) and of attention's two products."""
    total = 0

    def layer(module, inputs, output):
        nonlocal total
        total += 2 * output.numel() * module.weight[0].numel()

    layers = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)
    hooks = [m.register_forward_hook(layer) for m in model.modules() if isinstance(m, layers)]
    attention = torch.nn.functional.scaled_dot_product_attention

    def counted_attention(q, k, v, *args, **kwargs):
        nonlocal total
        total += 2 * q.shape[:-1].numel() * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        return attention(q, k, v, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counted_attention
    try:
        with torch.device("meta"), torch.no_grad():
            call()
    finally:
        torch.nn.functional.scaled_dot_product_attention = attention
        for hook in hooks:
            hook.remove()
    return total / 1e9


# an image VAE with attention in its mid-block, one of convolutions alone, and a video VAE whose attention is masked
# by frame (the project's own op); latent and image sizes not square
@pytest.mark.parametrize(
    "model_name, latent, image",
    [
        ("sd1.5", [1, 4, 6, 4], [1, 3, 48, 32]),
        ("taesd", [1, 4, 8, 12], [1, 3, 64, 96]),
        ("hunyuanvideo", [1, 4, 3, 4, 6], [1, 3, 9, 32, 48]),
    ],
)
def test_the_operations_counted_are_those_diffusers_model_runs(model_name, latent, image):
    import diffusers

    from bench.flops import count
    from converter.registry import config_from_dict, get_model, small_config

    entry = get_model(model_name)
    config = {**entry.config, **small_config(entry)}
    with torch.device("meta"):
        model = getattr(diffusers, config_from_dict(entry.family, config).class_name).from_config(config).eval()
    assert not any(isinstance(m, torch.nn.modules.conv._ConvTransposeNd) for m in model.modules())
    expected = {
        "decode": _counted_by_hooks(model, lambda: model.decode(torch.zeros(latent))),
        "encode": _counted_by_hooks(model, lambda: model.encode(torch.zeros(image))),
    }
    assert expected["decode"] > 0 and expected["encode"] > 0
    assert count(model_name, latent, image, small=True) == pytest.approx(expected, rel=1e-9)


# audio decoders whose anti-aliased activations are the project's own op: the count against diffusers' own model run
# under FlopCounterMode, which sees its functional filters (hooks see only layers)
@pytest.mark.parametrize(
    "model_name, latent",
    [("ltx-2.3:vocoder", [1, 2, 7, 16]), ("minimax-h3:audio_vae", [1, 8, 5])],
    ids=["ltx-2.3:vocoder", "minimax-h3:audio_vae"],
)
def test_the_operations_counted_are_those_diffusers_audio_decoders_run(model_name, latent):
    from torch.utils.flop_counter import FlopCounterMode

    from bench import diffusers_decode
    from bench.flops import count
    from converter.registry import get_model, small_config

    entry = get_model(*model_name.split(":"))
    config = {**entry.config, **small_config(entry)}
    with torch.device("meta"):
        model = entry.family.diffusers_class().from_config(config).eval()
    with torch.device("meta"), torch.no_grad(), FlopCounterMode(display=False) as counter:
        diffusers_decode(model, torch.zeros(latent))
    assert counter.get_total_flops() > 0
    assert count(model_name, latent, None, small=True)["decode"] == pytest.approx(counter.get_total_flops() / 1e9)


# a 1D convolution with a stride, a 2D one in groups, a 3D one padded: each as diffusers' models call them
@pytest.mark.parametrize(
    "convolution, sample, weight, options",
    [
        ("conv1d", (1, 32, 200), (16, 32, 7), {"stride": 2}),
        ("conv2d", (1, 32, 12, 20), (16, 8, 3, 3), {"groups": 4, "padding": 1}),
        ("conv3d", (1, 16, 5, 8, 6), (8, 16, 3, 3, 3), {"padding": (0, 1, 1)}),
    ],
)
def test_bfloat16_convolutions_in_float32_are_pytorchs_own(convolution, sample, weight, options):
    """The bfloat16 reference's convolutions (bench/precision.py) are PyTorch's bfloat16 ones but for a last bit."""
    import torch.nn.functional as F

    from bench.precision import bfloat16_convolutions_in_float32

    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(sample, generator=generator), torch.randn(weight, generator=generator) / weight[1] ** 0.5
    x, w, b = x.bfloat16(), w.bfloat16(), torch.randn(weight[0], generator=generator).bfloat16()
    native = getattr(F, convolution)(x, w, b, **options)
    with bfloat16_convolutions_in_float32():
        emulated = getattr(F, convolution)(x, w, b, **options)
    assert emulated.dtype == torch.bfloat16 and getattr(F, convolution)(x, w, b, **options).equal(native)
    torch.testing.assert_close(emulated, native, rtol=2**-7, atol=0)  # one bfloat16 rounding apart at most
    assert (emulated == native).float().mean() > 0.99
