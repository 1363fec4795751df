"""Every failure is loud, specific and harmless: its own exit code and one line, nothing new at --out, an old output
intact under --force, and nothing left behind by runs that were interrupted or killed."""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest
import torch

from converter.errors import ConvertError, InputError, MappingError, OutputError, ValidationError
from converter.mapping import MAPPINGS_DIR
from converter.safetensors_io import SafetensorsFile
from tests.helpers import REPO, earlier_output, edited_copy, fails, manifest, only, run_cli

WEIGHTS = "diffusion_pytorch_model.safetensors"


def _edited(wan_small, tmp_path, edit):
    source, _ = wan_small
    return edited_copy(source, tmp_path / "source", edit)


class RunsCode:
    """A pickle that would create a file if it were ever unpickled with code allowed."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_checkpoint_loads_weightsonly(wan_small, tmp_path):
    source, model = wan_small
    torch.save(model.state_dict(), tmp_path / "vae.pth")
    shutil.copy(source / "config.json", tmp_path / "config.json")
    run_cli("wan2.1", "--source", tmp_path / "vae.pth", "--to", "flax", "--out", tmp_path / "out")
    assert manifest(tmp_path / "out")["validation"]["ok"]


def test_pickle_that_needs_code_is_refused_not_run(tmp_path):
    marker = tmp_path / "executed"
    torch.save({"encoder.conv_in.weight": torch.zeros(1), "payload": RunsCode(marker)}, tmp_path / "evil.pt")
    fails(
        ["wan2.1", "--source", tmp_path / "evil.pt", "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "refused",
        "weights_only=True",
    )
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_nonfinite_weights_refused_unless_allowed(wan_small, tmp_path):
    def poison(state):
        state["decoder.mid_block.resnets.1.conv1.weight"][0, 0, 0, 0, 0] = float("nan")

    source = _edited(wan_small, tmp_path, poison)
    fails(
        ["wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "'decoder.mid_block.resnets.1.conv1.weight' holds 1 NaN/Inf",
        "--allow-nonfinite",
    )
    only(tmp_path, "source")
    run_cli(
        "wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--allow-nonfinite", "--no-validate"
    )


def test_dtype_that_cannot_hold_the_weights(wan_small, tmp_path):
    def inflate(state):
        state["encoder.conv_out.bias"][3] = 1e6

    source = _edited(wan_small, tmp_path, inflate)
    fails(
        ["wan2.1", "--source", source, "--to", "flax", "--dtype", "float16", "--out", tmp_path / "out"],
        InputError.exit_code,
        "'encoder.conv_out.bias' has values up to 1e+06",
        "float16",
    )
    only(tmp_path, "source")


def test_unwritable_output_location(wan_small, tmp_path):
    source, _ = wan_small
    (tmp_path / "a-file").write_text("")
    fails(
        ["wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "a-file" / "out"],
        OutputError.exit_code,
        "cannot create the output",
    )


def test_full_output_location(wan_small, tmp_path):
    """A file-size limit makes writes fail as a full disk does (EFBIG instead of ENOSPC)."""
    source, _ = wan_small
    # bash sets the limit (1 MiB, in 1 KiB blocks) and ignores SIGXFSZ, which exec keeps: writes then fail with EFBIG
    command = (
        f"ulimit -f 1024; trap '' XFSZ; exec {sys.executable} -m converter wan2.1 --source {source} "
        f"--to torchax --out {tmp_path / 'out'}"
    )
    result = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == OutputError.exit_code, result.stderr
    assert re.search(r"error: cannot write to .*: File too large", result.stderr)
    only(tmp_path)


def test_mapping_syntax_error_names_file_and_line(wan_small, tmp_path):
    source, _ = wan_small
    broken = tmp_path / "broken.yaml"
    broken.write_text((MAPPINGS_DIR / "wan.yaml").read_text().replace("to: '{1}.kernel'", "to: '{1}.kernel", 1))
    line = fails(
        ["wan2.1", "--source", source, "--to", "flax", "--mapping", broken, "--out", tmp_path / "out"],
        MappingError.exit_code,
        "YAML syntax error",
    )
    assert re.search(rf"{re.escape(str(broken))}:\d+:", line)


def _swapped_hw_mapping(tmp_path):
    """A mapping with the prior-art bug class: a transpose that keeps shapes (square kernels) but swaps H and W."""
    path = tmp_path / "swapped.yaml"
    text = (MAPPINGS_DIR / "wan.yaml").read_text()
    path.write_text(text.replace("transpose: [2, 3, 4, 1, 0]", "transpose: [2, 4, 3, 1, 0]"))
    return path


def test_validation_failure_leaves_nothing_and_keeps_old_output(wan_small, tmp_path):
    source, _ = wan_small
    out = earlier_output(tmp_path / "out")
    line = fails(
        [
            "wan2.1",
            "--source",
            source,
            "--to",
            "flax",
            "--mapping",
            _swapped_hw_mapping(tmp_path),
            "--out",
            out,
            "--force",
        ],
        ValidationError.exit_code,
        "validation failed for decode",
    )
    assert re.search(r"\|Δ\| \S+ > tol", line)
    assert (out / "old.txt").read_text() == "previous output"
    only(tmp_path, "out", "swapped.yaml")


@pytest.mark.slow
def test_keep_invalid_keeps_the_output_marked_invalid(wan_small, tmp_path):
    source, _ = wan_small
    fails(
        [
            "wan2.1",
            "--source",
            source,
            "--to",
            "flax",
            "--mapping",
            _swapped_hw_mapping(tmp_path),
            "--out",
            tmp_path / "out",
            "--keep-invalid",
        ],
        ValidationError.exit_code,
        "--keep-invalid",
    )
    assert manifest(tmp_path / "out")["validation"]["ok"] is False


# -- interrupted runs ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    """The full-size architecture, so that writing takes long enough to be interrupted in the middle."""
    path = tmp_path_factory.mktemp("big") / "vae"
    run_cli("random-checkpoint", "wan2.1", path)
    return path


def _start_and_interrupt(source, out, sig):
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "converter",
            "wan2.1",
            "--source",
            str(source),
            "--to",
            "torchax",
            "--out",
            str(out),
            "--no-validate",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        partial = list(out.parent.glob(f".{out.name}.tmp-*/{WEIGHTS}"))
        if partial and partial[0].stat().st_size > 50 << 20:  # mid-write: some of the 485 MB are on disk
            process.send_signal(sig)
            break
        time.sleep(0.01)
    else:
        process.kill()
        pytest.fail("the conversion finished or never started writing before it could be interrupted")
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_interrupt_mid_write_leaves_nothing(big_source, tmp_path, sig):
    code, stderr = _start_and_interrupt(big_source, tmp_path / "out", sig)
    assert code == 130 and "error: interrupted; nothing was written" in stderr
    only(tmp_path)


def test_kill_mid_write_is_cleaned_by_the_next_run(big_source, tmp_path):
    code, _ = _start_and_interrupt(big_source, tmp_path / "out", signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert not (tmp_path / "out").exists() and list(tmp_path.glob(".out.tmp-*"))  # a killed run cannot clean up
    run_cli("wan2.1", "--source", big_source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    only(tmp_path, "out")


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_output_moved_aside_by_a_killed_force_run_is_restored(wan_small, tmp_path):
    source, _ = wan_small
    earlier_output(tmp_path / f".out.old-{_dead_pid()}-abc" / "previous")
    fails(
        ["wan2.1", "--source", source, "--to", "flax", "--out", tmp_path / "out"],
        OutputError.exit_code,
        "exists; pass --force",
    )
    assert (tmp_path / "out" / "old.txt").read_text() == "previous output"
    only(tmp_path, "out")


# -- corrupt files ------------------------------------------------------------------------------------------


def _mutations(data: bytes, rng: random.Random):
    header_len = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + header_len])
    kind = rng.choice(["truncate", "flip", "header"])
    if kind == "truncate":
        return data[: rng.randrange(len(data))]
    if kind == "flip":
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            mutated[rng.randrange(min(len(data), 8 + header_len + 64))] = rng.randrange(256)
        return bytes(mutated)
    name = rng.choice([k for k in header if k != "__metadata__"])
    field = rng.choice(["dtype", "shape", "data_offsets"])
    header[name][field] = rng.choice(
        ["F8", "I64", [], [-1], [2**62], [1, 2, 3], None, "x", {"a": 1}, [0, 2**40], [5, 3], 7]
    )
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data[8 + header_len :]


def test_fuzzed_checkpoints_raise_only_input_errors(wan_small, tmp_path):
    source, _ = wan_small
    data = (source / WEIGHTS).read_bytes()
    rng = random.Random(0)
    outcomes = {"rejected": 0, "read": 0}
    for i in range(400):
        path = tmp_path / f"fuzz{i % 4}.safetensors"
        path.write_bytes(_mutations(data, rng))
        try:
            weights = SafetensorsFile(path)
            for key in weights.keys():
                weights[key].sum()
            outcomes["read"] += 1  # a flip inside tensor data is still a readable file
        except InputError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 300


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_fuzzed_checkpoint_through_the_cli(wan_small, tmp_path, seed):
    source, _ = wan_small
    rng = random.Random(seed)
    while True:
        mutated = _mutations((source / WEIGHTS).read_bytes(), rng)
        (tmp_path / WEIGHTS).write_bytes(mutated)
        try:
            SafetensorsFile(tmp_path / WEIGHTS)
        except ConvertError:
            break
    shutil.copy(source / "config.json", tmp_path / "config.json")
    fails(["wan2.1", "--source", tmp_path, "--to", "flax", "--out", tmp_path / "out"], InputError.exit_code)
    assert not (tmp_path / "out").exists()
