"""Crafted checkpoints and folders (docs/security.md): each finding of the adversarial pass ends in a correct result or
one line with a documented exit code; nothing runs, crashes, hangs, reads outside or is left half-written."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import time

import click
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import converter
from converter import cli, orbax_io, structure_cache, targets
from converter.errors import InputError, OutputError
from converter.registry import MODELS, config_from_dict
from converter.safetensors_io import SafetensorsFile
from tests.helpers import REPO, earlier_output, fails, manifest, only, run_cli, run_in_process

WEIGHTS = "diffusion_pytorch_model.safetensors"


class RunsCode:
    """Unpickled, it creates a file: proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def torchax_output(wan_small_outputs):
    return wan_small_outputs["torchax"]


@pytest.fixture
def flax_output(wan_small_outputs):
    return wan_small_outputs["flax"]


def _copy(output, tmp_path, name="copy"):
    return shutil.copytree(output, tmp_path / name, symlinks=True)


def test_expanded_views_in_a_pickle_convert_to_their_values(tmp_path):
    """Every tensor of the full-size Wan 2.1 state dict an expanded view of one float (stride 0): the page release
    must stay within the bytes behind each tensor, and the output holds the expanded values."""
    entry = MODELS["wan2.1"]
    config = config_from_dict(entry.family, entry.config)
    shapes = {k: tuple(v.shape) for k, v in targets.meta_torch(entry.family, config).state_dict().items()}
    values = {k: float(i % 7) + 0.5 for i, k in enumerate(shapes)}
    source = tmp_path / "vae"
    source.mkdir()
    torch.save({k: torch.tensor([values[k]]).expand(*shape) for k, shape in shapes.items()}, source / "vae.bin")
    assert (source / "vae.bin").stat().st_size < 200_000
    run_cli("wan2.1", "--source", source / "vae.bin", "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    written = SafetensorsFile(tmp_path / "out" / WEIGHTS)
    assert set(written.keys()) == set(shapes)
    for key in written.keys():
        array = written[key]
        assert array.shape == shapes[key] and array.min() == array.max() == values[key], key


def _structure_entry(tmp_path, monkeypatch):
    from converter.models.wan.config import WanVAEConfig

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv(structure_cache.STRUCTURE_CACHE_ENV, str(cache))
    return structure_cache._structure_entry("wan", WanVAEConfig(), np.dtype(np.float32))


def test_a_planted_link_in_the_structure_cache_runs_nothing(tmp_path, monkeypatch):
    entry = _structure_entry(tmp_path, monkeypatch)
    marker, bait = tmp_path / "code-ran", tmp_path / "bait.pickle"
    bait.write_bytes(pickle.dumps(RunsCode(marker)))  # the user's own file, private, holding another's bytes
    bait.chmod(0o600)
    entry.symlink_to(bait)
    assert structure_cache._read_structure(entry) is None and not marker.exists()
    entry.unlink()
    os.link(bait, entry)  # a hard link: the same file, two names
    assert structure_cache._read_structure(entry) is None and not marker.exists()


def test_a_structure_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch, capsys):
    entry = _structure_entry(tmp_path, monkeypatch)
    marker = tmp_path / "code-ran"
    entry.write_bytes(pickle.dumps(RunsCode(marker)))
    entry.chmod(0o600)
    entry.parent.chmod(0o777)
    assert structure_cache._read_structure(entry) is None and structure_cache._read_structure(entry) is None
    assert not marker.exists()
    notes = [line for line in capsys.readouterr().err.splitlines() if "structure cache" in line]
    assert len(notes) == 1 and "only this user can write" in notes[0]  # said once
    structure_cache._write_structure(entry, b"kept")
    assert entry.read_bytes() != b"kept"


def test_a_planted_temporary_clobbers_nothing(tmp_path, monkeypatch):
    entry = _structure_entry(tmp_path, monkeypatch)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    for pid in range(os.getpid() - 2, os.getpid() + 3):  # the names a writer of a predictable name would use
        (entry.parent / f".{entry.name}.{pid}").symlink_to(victim)
    structure_cache._write_structure(entry, b"kept")
    assert victim.read_text() == "the user's file" and entry.read_bytes() == b"kept"
    assert not entry.is_symlink() and entry.stat().st_mode & 0o777 == 0o600


def test_an_unwritable_structure_cache_is_one_note(tmp_path, monkeypatch, capsys):
    entry = _structure_entry(tmp_path, monkeypatch)
    entry.parent.rmdir()
    entry.parent.write_text("a file where the folder would go")
    structure_cache._write_structure(entry, b"kept")
    err = capsys.readouterr().err
    assert err.startswith("vae-convert: note: the model structure is not kept") and err.count("\n") == 1
    assert "Warning" not in err and ".py" not in err


@pytest.mark.parametrize("squat", ["link", "folder", "no-temporary-folder"])
def test_the_crash_report_never_writes_through_a_planted_name(tmp_path, monkeypatch, capsys, squat):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    if squat != "no-temporary-folder":
        (tmp_path / "tmp").mkdir()
    predictable = tmp_path / "tmp" / f"vae-convert-crash-{os.getpid()}.txt"
    if squat == "link":
        predictable.symlink_to(victim)
    elif squat == "folder":
        predictable.mkdir()

    def bug():
        raise RuntimeError("a bug")

    with pytest.raises(click.exceptions.Exit) as exit_:
        cli._guarded(bug, verbose=False)
    err = capsys.readouterr().err
    assert exit_.value.exit_code == 1 and err.count("\n") == 1 and "internal error" in err
    assert victim.read_text() == "the user's file"
    if squat == "unwritable" and os.getuid() != 0:
        assert "could not be saved" in err
    else:
        report = err.split("traceback in ")[-1].strip()
        assert "could not be saved" in err or (
            os.stat(report).st_mode & 0o777 == 0o600 and "a bug" in open(report).read()
        )


@pytest.mark.parametrize("damage", ["truncated", "other-tensors", "link-outside", "fifo"])
def test_export_of_a_damaged_torchax_output_leaves_nothing(torchax_output, tmp_path, damage):
    source = _copy(torchax_output, tmp_path)
    weights = source / WEIGHTS
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-1000])
    elif damage == "other-tensors":
        from safetensors.numpy import save_file

        save_file({"encoder.conv_in.weight": np.zeros((1,), np.float32)}, weights)
    elif damage == "link-outside":
        weights.unlink()
        weights.symlink_to("/etc/passwd")
    else:
        weights.unlink()
        os.mkfifo(weights)
    out = tmp_path / "exported"
    fails(["export", source, "--out", out], InputError.exit_code, str(source), out=out)


MANIFEST_DAMAGE = {
    "source-a-string": {"source": "x"},
    "validation-without-checks": {"validation": {"ok": True}},
    "mapping-a-list": {"mapping": [1]},
    "family-a-list": {"family": [1]},
    "dtype-a-number": {"dtype": 5},
    "checks-of-strings": {"validation": {"rtol": 1e-4, "ok": True, "checks": ["x"]}},
    "no-source": {"source": None},
    "decode-inputs-of-strings": {"validation": {"rtol": 1e-4, "ok": True, "checks": [], "decode_inputs": {"t": "x"}}},
    "tensors-of-strings": {"tensors": {"latents_mean": ["x"]}},
    "negative-shape": {
        "validation": {
            "rtol": 1e-4,
            "ok": True,
            "checks": [
                {"output": "decode", "shape": [-5, 3], "max_abs": 0.0, "mean_abs": 0.0, "tol": 1e-4, "ok": True}
            ],
        }
    },
}


@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE), ids=list(MANIFEST_DAMAGE))
def test_manifest_fields_of_the_wrong_type(flax_output, tmp_path, damage):
    source = _copy(flax_output, tmp_path)
    record = {**manifest(source), **MANIFEST_DAMAGE[damage]}
    (source / "vae_convert.json").write_text(json.dumps(record))
    for args in (["info", source], ["export", source, "--out", tmp_path / "out"]):
        fails(args, InputError.exit_code, "vae_convert.json", out=tmp_path / "out")
    with pytest.raises(InputError):
        converter.load(source)


@pytest.mark.parametrize("config", [[1, 2], "x", {"_class_name": ["AutoencoderKLWan"]}])
def test_a_config_of_the_wrong_type(flax_output, wan_small, tmp_path, config):
    source = _copy(flax_output, tmp_path)
    (source / "config.json").write_text(json.dumps(config))
    fails(["export", source, "--out", tmp_path / "out"], InputError.exit_code, out=tmp_path / "out")
    with pytest.raises(InputError):
        converter.load(source)
    checkpoint = shutil.copytree(wan_small[0], tmp_path / "checkpoint")
    (checkpoint / "config.json").write_text(json.dumps(config))
    fails(["wan2.1", "--source", checkpoint, "--to", "flax", "--out", tmp_path / "out"], InputError.exit_code)


SIZES_WITHOUT_END = {  # a config edit, and the field the refusal names
    "layers": ({"num_res_blocks": 10**7}, "num_res_blocks"),
    "levels": ({"dim_mult": [1] * 10**5, "temperal_downsample": [False] * 10**5}, "dim_mult"),
    "overflowing-width": ({"base_dim": 2**62}, "base_dim"),
    "widths-that-multiply": ({"base_dim": 8192, "dim_mult": [64] * 4}, "G parameters"),
}


@pytest.mark.parametrize("edit", list(SIZES_WITHOUT_END), ids=list(SIZES_WITHOUT_END))
def test_sizes_no_real_model_has_are_refused_before_building(flax_output, wan_small, tmp_path, edit):
    """Each size a config sets is bounded, and the parameter count the widths make, wherever the config comes from:
    a checkpoint's config.json, --config, an output's config.json (export, converter.load). Exit 3 within moments,
    naming the field, where an unbounded build would run without end or overflow PyTorch's size arithmetic."""
    change, needle = SIZES_WITHOUT_END[edit]
    config = {**json.loads((wan_small[0] / "config.json").read_text()), **change}
    checkpoint = shutil.copytree(wan_small[0], tmp_path / "checkpoint")
    (checkpoint / "config.json").write_text(json.dumps(config))
    (tmp_path / "edit.json").write_text(json.dumps(change))
    output = _copy(flax_output, tmp_path)
    (output / "config.json").write_text(json.dumps({**json.loads((output / "config.json").read_text()), **change}))
    out = tmp_path / "out"
    started = time.monotonic()
    for args in (
        ["wan2.1", "--source", checkpoint, "--to", "torchax", "--out", out],
        ["wan2.1", "--source", wan_small[0], "--config", tmp_path / "edit.json", "--to", "flax", "--out", out],
        ["export", output, "--out", out],
    ):
        fails(args, InputError.exit_code, needle, out=out, in_process=True)
    with pytest.raises(InputError, match=needle):
        converter.load(output)
    assert time.monotonic() - started < 30


def _safetensors_with_header(path, header: bytes, data: bytes = b""):
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize("where", ["config", "--config", "manifest", "safetensors-header"])
def test_deeply_nested_json_is_refused(wan_small, flax_output, tmp_path, where):
    nested = b"[" * 100_000
    if where == "manifest":
        source = _copy(flax_output, tmp_path)
        (source / "vae_convert.json").write_bytes(b'{"tool": "vae-convert", "x": ' + b"[" * 50_000)
        fails(["info", source], InputError.exit_code, "nested more than")
        return
    checkpoint = shutil.copytree(wan_small[0], tmp_path / "checkpoint")
    args = ["wan2.1", "--source", checkpoint, "--to", "flax", "--out", tmp_path / "out"]
    if where == "config":
        (checkpoint / "config.json").write_bytes(nested)
    elif where == "--config":
        (tmp_path / "deep.json").write_bytes(nested)
        args += ["--config", tmp_path / "deep.json"]
    else:
        _safetensors_with_header(checkpoint / WEIGHTS, b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    fails(args, InputError.exit_code, "nested more than", out=tmp_path / "out")


def test_a_shape_whose_size_wraps_around_is_refused(wan_small, tmp_path):
    checkpoint = shutil.copytree(wan_small[0], tmp_path / "checkpoint")
    header = {"encoder.conv_in.bias": {"dtype": "F32", "shape": [32, 2**59 + 1], "data_offsets": [0, 128]}}
    _safetensors_with_header(checkpoint / WEIGHTS, json.dumps(header).encode(), b"\0" * 128)
    fails(
        ["wan2.1", "--source", checkpoint, "--to", "flax", "--out", tmp_path / "out"],
        InputError.exit_code,
        "corrupt header",
    )


def test_a_key_with_a_unicode_digit_is_bad_input(wan_small, tmp_path):
    from safetensors.numpy import load_file, save_file

    out = tmp_path / "flax-safetensors"
    args = ("--to", "flax", "--format", "safetensors", "--out", out, "--no-validate")
    run_cli("wan2.1", "--source", wan_small[0], *args)
    weights = out / targets.TARGETS["flax"].weight_files["safetensors"]
    state = load_file(weights)
    key = next(k for k in state if ".0." in k)
    state[key.replace(".0.", ".\u00b2.", 1)] = state.pop(key)  # '²'.isdigit() is true; int('²') fails
    save_file(state, weights)
    with pytest.raises(InputError):
        converter.load(out)
    fails(["export", out, "--out", tmp_path / "exported"], InputError.exit_code, out=tmp_path / "exported")


@pytest.mark.parametrize("entry", ["/etc/passwd", "../outside.safetensors", "sub/shard.safetensors", "fifo"])
def test_a_shard_index_names_only_files_beside_it(wan_small, tmp_path, entry):
    checkpoint = shutil.copytree(wan_small[0], tmp_path / "checkpoint")
    weights = SafetensorsFile(checkpoint / WEIGHTS)
    if entry == "fifo":
        os.mkfifo(checkpoint / "fifo")
    (checkpoint / WEIGHTS).unlink()
    (tmp_path / "outside.safetensors").write_bytes(b"\0" * 8)
    index = {"weight_map": dict.fromkeys(weights.keys(), entry)}
    (checkpoint / f"{WEIGHTS}.index.json").write_text(json.dumps(index))
    started = time.monotonic()
    message = "not a regular file" if entry == "fifo" else f"the index names {entry!r}, not a file name beside"
    line = fails(
        ["wan2.1", "--source", checkpoint, "--to", "flax", "--out", tmp_path / "out"], InputError.exit_code, message
    )
    assert time.monotonic() - started < 60 and "root:" not in line


def test_leftovers_are_matched_by_name_not_by_glob(wan_small, tmp_path):
    killed_backup = tmp_path / ".ckpt.old-999999999-abc"  # a killed --force run's backup of ckpt, never ours
    earlier_output(killed_backup / "previous", "ckpt's previous output")
    run_cli("wan2.1", "--source", wan_small[0], "--to", "torchax", "--out", tmp_path / "ck?t", "--no-validate")
    assert "restored" not in (tmp_path / "ck?t" / "vae_convert.json").read_text()
    assert (killed_backup / "previous" / "old.txt").exists() and not (tmp_path / "ck?t" / "old.txt").exists()
    own_backup = tmp_path / ".ck[1].old-999999999-abc"
    earlier_output(own_backup / "previous", "ck[1]'s previous output")
    result = run_cli(
        "wan2.1", "--source", wan_small[0], "--to", "torchax", "--out", tmp_path / "ck[1]", "--force", "--no-validate"
    )
    assert "restored the previous output" in result.stderr and not own_backup.exists()


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_manifests_and_configs_that_never_end(flax_output, wan_small, tmp_path, kind):
    def plant(path):
        path.unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/zero")

    source = _copy(flax_output, tmp_path)
    plant(source / "vae_convert.json")
    started = time.monotonic()
    fails(["info", source], InputError.exit_code, "not a regular file")
    fails(
        ["wan2.1", "--source", wan_small[0], "--to", "flax", "--out", source, "--force"],
        OutputError.exit_code,
        "not a vae-convert output",
    )
    checkpoint = shutil.copytree(wan_small[0], tmp_path / "checkpoint")
    plant(checkpoint / "config.json")
    fails(["wan2.1", "--source", checkpoint, "--to", "flax", "--out", tmp_path / "o"], 3, "not a regular file")
    plant(tmp_path / "weights.safetensors")
    fails(["wan2.1", "--source", tmp_path / "weights.safetensors", "--to", "flax", "--out", tmp_path / "o"], 3)
    assert time.monotonic() - started < 120


def test_an_out_that_is_a_link_to_an_output_says_so(flax_output, wan_small, tmp_path):
    (tmp_path / "link").symlink_to(flax_output)
    fails(
        ["wan2.1", "--source", wan_small[0], "--to", "flax", "--out", tmp_path / "link", "--force"],
        OutputError.exit_code,
        "is a symbolic link",
    )
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    line = fails(["random-checkpoint", "wan2.1", tmp_path / "dangling", "--small"], OutputError.exit_code, "exists")
    assert "--force" not in line


def test_a_long_out_name_converts(wan_small, tmp_path):
    out = tmp_path / ("o" * 240)
    run_cli("wan2.1", "--source", wan_small[0], "--to", "torchax", "--out", out, "--no-validate")
    only(tmp_path, out.name)


def test_a_deleted_working_folder_is_one_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"cd {gone} && rmdir {gone} && exec {sys.executable} -m converter list"
    result = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert result.returncode == InputError.exit_code, result.stderr
    assert result.stderr.startswith("error: the current folder no longer exists") and result.stderr.count("\n") == 1


def test_a_load_racing_a_replacement_says_the_output_changed(flax_output, tmp_path, monkeypatch):
    """Another run's --force moves a new folder in while this load reads: what fails to read is the replacement's
    doing, not damage."""
    out, replacement = _copy(flax_output, tmp_path, "out"), _copy(flax_output, tmp_path, "replacement")
    next(p for p in (replacement / "state" / "state").rglob("0*") if p.stat().st_size > 1000).write_bytes(b"")
    read = orbax_io.zarr_leaves

    def read_while_replaced(item_dir):
        os.rename(out, tmp_path / "aside")
        os.rename(replacement, out)
        return read(item_dir)

    monkeypatch.setattr(orbax_io, "zarr_leaves", read_while_replaced)
    with pytest.raises(InputError, match="the output changed while loading"):
        converter.load(out)


def _pickle_of(wan_small, tmp_path, name, edit) -> tuple:
    """The small Wan checkpoint pickled as `edit` leaves its state_dict, and its config."""
    from safetensors.torch import load_file

    source, _ = wan_small
    state = load_file(source / "diffusion_pytorch_model.safetensors")
    path = tmp_path / name / "vae.pt"
    path.parent.mkdir()
    torch.save(edit(state, next(iter(state))), path)
    return path, source / "config.json"


ODD_PICKLES = {  # what torch.load(weights_only=True) accepts, and a word of the one-line refusal
    "integer-key": (lambda s, k: {**s, 7: torch.zeros(1)}, "key 7 is int"),
    "float8": (lambda s, k: {**s, k: s[k].to(torch.float8_e4m3fn)}, "holds float8_e4m3fn values"),
    "sparse": (lambda s, k: {**s, k: s[k].to_sparse()}, "is a sparse_coo tensor"),
    "quantized": (lambda s, k: {**s, k: torch.quantize_per_tensor(s[k], 0.1, 0, torch.qint8)}, "is quantized"),
    "meta": (lambda s, k: {**s, k: torch.empty(s[k].shape, device="meta")}, "holds no data"),
    "complex": (lambda s, k: {**s, k: s[k].to(torch.complex64)}, "holds complex64 values"),
    "bool": (lambda s, k: {**s, k: s[k] > 0}, "holds bool values"),
    "uint16": (lambda s, k: {**s, k: s[k].to(torch.uint16)}, "holds uint16 values"),
    "no-floating-tensor": (lambda s, k: {key: v.to(torch.int64) for key, v in s.items()}, "no floating-point tensor"),
}


@pytest.mark.parametrize("odd", list(ODD_PICKLES))
def test_a_pickle_of_values_that_are_no_weights_is_refused_by_key(wan_small, tmp_path, odd):
    edit, needle = ODD_PICKLES[odd]
    path, config = _pickle_of(wan_small, tmp_path, odd, edit)
    out = tmp_path / "out"
    args = ["wan2.1", "--source", path, "--config", config, "--to", "torchax", "--out", out, "--no-validate"]
    fails(args, InputError.exit_code, needle, out=out, in_process=True)


def test_a_pickle_of_parameters_converts_as_its_tensors(wan_small, tmp_path):
    """`state_dict(keep_vars=True)` and `named_parameters()` write nn.Parameters: plain weights."""
    from safetensors.torch import load_file

    path, config = _pickle_of(
        wan_small, tmp_path, "parameters", lambda s, k: {key: torch.nn.Parameter(v) for key, v in s.items()}
    )
    out = tmp_path / "out"
    result = run_in_process(
        "wan2.1", "--source", path, "--config", config, "--to", "torchax", "--out", out, "--no-validate"
    )
    assert result.returncode == 0, result.stderr
    expected = load_file(wan_small[0] / "diffusion_pytorch_model.safetensors")
    got = load_file(out / "diffusion_pytorch_model.safetensors")
    assert got.keys() == expected.keys() and all(torch.equal(got[k], v) for k, v in expected.items())


def _shapes_edit(case: str):
    """Edits of a small AutoencoderKL or Flux.2 state_dict whose shapes say no config."""

    def edit(state):
        if case == "0-d kernel":
            state["encoder.down_blocks.0.resnets.0.conv1.weight"] = torch.tensor(1.0)
        elif case == "33 resnets":
            state.update({f"encoder.down_blocks.0.resnets.{j}.conv1.weight": torch.zeros(1) for j in range(1, 34)})
        elif case == "0-d statistics":
            state["bn.running_mean"] = torch.tensor(0.5)
        else:  # no latent channels
            state["decoder.conv_in.weight"] = torch.zeros(state["decoder.conv_in.weight"].shape[0], 0, 3, 3)

    return edit


@pytest.mark.parametrize(
    ("model", "case"),
    [("sd1.5", "0-d kernel"), ("sd1.5", "33 resnets"), ("flux.2-dev", "0-d statistics"), ("flux.2-dev", "no channels")],
)
def test_shapes_that_say_no_config_are_bad_input(tmp_path, model, case):
    """A weights file alone has its config read from its shapes: shapes that say none are exit 3, whatever the
    reading trips on (an index, a division, a search past a bound)."""
    from tests.helpers import save_diffusers, small

    family = MODELS[model].family
    save_diffusers(family, tmp_path / "vae", small(family, "default-arch")[1])
    state = load_file(tmp_path / "vae" / "diffusion_pytorch_model.safetensors")
    _shapes_edit(case)(state)
    save_file(state, tmp_path / "alone.safetensors")
    out = tmp_path / "out"
    fails([model, "--source", tmp_path / "alone.safetensors", "--to", "flax", "--out", out, "--no-validate"], 3,
          out=out, in_process=True)  # fmt: skip


def test_a_config_of_more_levels_than_any_vae_is_refused_before_anything_is_built(tmp_path):
    """Thirteen one-channel levels: a 1 KB config whose validation image would be 32768 pixels a side."""
    from tests.helpers import save_diffusers, small

    family = MODELS["sd1.5"].family
    save_diffusers(family, tmp_path / "vae", small(family, "default-arch")[1])
    config = {
        "_class_name": "AutoencoderKL", "block_out_channels": [1] * 13, "norm_num_groups": 1, "latent_channels": 1,
        "down_block_types": ["DownEncoderBlock2D"] * 13, "up_block_types": ["UpDecoderBlock2D"] * 13,
    }  # fmt: skip
    (tmp_path / "vae" / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    fails(["sd1.5", "--source", tmp_path / "vae", "--to", "flax", "--out", out], 3, "at most 8 entries", out=out)


@pytest.mark.parametrize(
    ("count", "target", "needle"),
    [(2**31, "flax", "beyond what int32 holds"), (-5, "torchax", "a negative value")],
)
def test_a_count_is_refused_for_its_real_reason(tmp_path, count, target, needle):
    """A count of batches past int32 (JAX's, without x64) is whole but does not fit; a negative one counts nothing."""
    from tests.helpers import edited_copy, save_diffusers, small

    flux2 = MODELS["flux.2-dev"].family
    save_diffusers(flux2, tmp_path / "vae", small(flux2, "default-arch")[1])

    def edit(state):
        state["bn.num_batches_tracked"] = torch.tensor(count, dtype=torch.int64)

    source = edited_copy(tmp_path / "vae", tmp_path / "edited", edit)
    out = tmp_path / "out"
    fails(["flux.2-dev", "--source", source, "--to", target, "--out", out, "--no-validate"], 3, needle, out=out,
          in_process=True)  # fmt: skip
