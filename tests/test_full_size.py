"""Each VAE at its real size (the first model name of each variant its family's test data lets in: Wan 2.1,
CogVideoX, HunyuanVideo, LTX-Video 0.9.0, ...; random weights saved by diffusers): it converts to Flax with every
key accounted for and the validation decode/encode passes; conversion streams (peak memory above the baseline at most
the checkpoint's size). The original Wan2.1_VAE.pth at full size converts to torchax as diffusers' own checkpoint,
reads back in diffusers, and streams too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from converter.models.common.conv import XLA_CONV_ENV
from converter.registry import first_of_each_variant, get_model
from tests.helpers import PAIRINGS, REPO, manifest, save_diffusers

pytestmark = pytest.mark.slow  # every test converts a model at its released size (up to 419 M parameters)

FULL_SIZE = {
    e.qualified: e.family
    for e in first_of_each_variant()
    if e.family.testing().full_size
    and e.family.config_class.from_dict(e.config).variant not in e.family.testing().full_size_left_to_first
}


@pytest.fixture(
    scope="module", params=[pytest.param(name, marks=pytest.mark.family(f.name)) for name, f in FULL_SIZE.items()]
)
def full_size(request, tmp_path_factory):
    """(model name, the saved checkpoint's folder, its tensor and parameter counts): the model itself is not kept, as
    the conversions beside it need the memory."""
    folder = tmp_path_factory.mktemp(request.param)
    path = folder / "vae"
    state = save_diffusers(FULL_SIZE[request.param], path, get_model(request.param).config, default_init=False)
    state = state.state_dict()
    counts = len(state), sum(v.numel() for v in state.values())
    del state
    yield request.param, path, counts
    shutil.rmtree(folder)  # gigabytes each: the disk holds one model's at a time


def test_full_size_converts_and_validates_and_streams(full_size, tmp_path):
    """To Flax. The torchax target at full size is test_full_size_original_wan21_file's conversion: a torchax output
    is diffusers' keys copied for every family, validated by the same runner."""
    model_name, source, (tensors, parameters) = full_size
    out = tmp_path / "flax"
    # no picture: drawing it encodes and decodes a test clip with both models again (a third of the run at full size);
    # what it shows is test_preview.py's, at small widths
    result = _run_cli_measured(model_name, source / "diffusion_pytorch_model.safetensors", out, "--no-preview")
    info = manifest(out)
    checks = info["validation"]["checks"]
    encodings = {f"encode.{name}" for name in FULL_SIZE[model_name].encode_outputs}
    assert {c["output"] for c in checks} == {"decode", *encodings}
    assert all(c["ok"] and c["ratio"] <= 1 for c in checks)
    assert f"{tensors} tensors, {parameters / 1e6:.1f}M parameters" in result.stdout
    assert info["source"]["sha256"] and info["dtype"] == "float32"
    assert json.loads((out / "config.json").read_text())["_class_name"] == FULL_SIZE[model_name].class_name


@pytest.mark.parametrize("full_size", ["wan2.1"], indirect=True)
def test_full_size_original_wan21_file(full_size, tmp_path):
    """Wan-Video's Wan2.1_VAE.pth layout (keys renamed with the pairings), pickled by torch.save: to torchax it
    becomes diffusers' own checkpoint, tensor for tensor (the way to normalise an original file); the
    pickle is read memory-mapped, so the conversion streams as from safetensors."""
    model_name, source, _ = full_size
    pairing = json.loads((PAIRINGS / "wan2.1-original.json").read_text())["keys"]
    state = load_file(source / "diffusion_pytorch_model.safetensors")
    original = tmp_path / "Wan2.1_VAE.pth"
    torch.save({key: state[entry["diffusers"]] for key, entry in pairing.items()}, original)
    out = tmp_path / "torchax"
    # no validation: equality with diffusers' own checkpoint below proves more, and the full-size decode is
    # test_full_size_converts_and_validates_and_streams's
    result = _run_cli_measured(model_name, original, out, "--to", "torchax", "--no-validate")
    assert "source format: wan2.1-original" in result.stderr
    import diffusers

    reloaded = diffusers.AutoencoderKLWan.from_pretrained(out).state_dict()
    assert reloaded.keys() == state.keys() and all(torch.equal(reloaded[k], v) for k, v in state.items())


# What a conversion holds whatever the checkpoint's size (Orbax's writer threads and TensorStore's buffers): a
# checkpoint of a few megabytes (TAESD's 10 MB) stays under it, not under its own size
FIXED_MB = 64

# The CLI in a process whose peak memory is read when validation starts (the conversion's, above the baseline after
# the imports, as bench/run.py measures it); validation then builds the models, which is not streaming's concern
MEASURED_CLI = """import sys
from bench.run import import_everything, rss_mb
from converter import __main__, pipeline
import_everything()
baseline = rss_mb("VmRSS")
validate = pipeline._validate
def measured(*args):
    print("peak above baseline:", rss_mb("VmHWM") - baseline, file=sys.stderr, flush=True)
    return validate(*args)
pipeline._validate = measured
sys.argv[0] = "vae-convert"
__main__.main()"""


def _run_cli_measured(model_name: str, checkpoint, out, *args: str) -> subprocess.CompletedProcess:
    """`vae-convert MODEL --source CHECKPOINT --out OUT [--to flax] ARGS`, asserting the conversion streamed: its peak
    above the baseline at most 1.0x the checkpoint (or FIXED_MB)."""
    args = args if "--to" in args else ("--to", "flax", *args)
    # the CPU's convolution routes, as a user's run takes them: at full widths they save more running than they cost
    # compiling (tests/conftest.py)
    # and PyTorch on one thread, as a one-core container runs it: oneDNN's convolutions then round CogVideoX-2b's
    # encoder beyond the tolerance (1.3e-4 of its scale), which validation's exact second run tells from a wrong
    # conversion (converter/runners.py, TorchRunner.exact)
    env = {**{k: v for k, v in os.environ.items() if k != XLA_CONV_ENV}, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", MEASURED_CLI, model_name, "--source", str(checkpoint), "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    peak_mb = float(next(line for line in result.stderr.splitlines() if line.startswith("peak above")).split(":")[1])
    checkpoint_mb = checkpoint.stat().st_size / 1e6
    assert peak_mb <= max(checkpoint_mb, FIXED_MB), (peak_mb, checkpoint_mb)
    return result
