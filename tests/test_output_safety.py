"""--out never destroys what the user did not ask to replace: not the source, not a folder that holds it, not a
folder that is no vae-convert output, and not another run's output that appeared while this one was converting."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from converter import output
from converter.errors import OutputError
from converter.output import OutputFolder, _rename_noreplace
from tests.helpers import REPO, earlier_output, fails, manifest, run_cli


def _snapshot(folder):
    """Every file below `folder` with its sha256: what must still be there, byte for byte."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _refused(args, cwd, *needles):
    fails(args, OutputError.exit_code, *needles, cwd=cwd)


@pytest.fixture
def project(wan_small, tmp_path):
    """proj/ holding a diffusers checkpoint in vae/ and an unrelated notes.txt."""
    source, _ = wan_small
    shutil.copytree(source, tmp_path / "proj" / "vae")
    (tmp_path / "proj" / "notes.txt").write_text("my notes")
    return tmp_path / "proj"


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("case", ["out-is-source", "out-holds-source", "out-is-cwd-holding-source"])
def test_out_that_is_or_holds_the_source_is_refused(project, case, force):
    before = _snapshot(project.parent)
    source, out, cwd = {
        "out-is-source": (project / "vae", project / "vae", REPO),
        "out-holds-source": (project / "vae", project, REPO),
        "out-is-cwd-holding-source": ("vae", ".", project),
    }[case]
    _refused(["wan2.1", "--source", source, "--to", "torchax", "--out", out, *force], cwd, "is the source or holds it")
    assert _snapshot(project.parent) == before


def test_force_refuses_a_folder_that_is_no_output(wan_small, tmp_path):
    source, _ = wan_small
    out = tmp_path / "home"
    (out / "docs").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    before = _snapshot(tmp_path)
    _refused(
        ["wan2.1", "--source", source, "--to", "torchax", "--out", out, "--force"],
        REPO,
        "is not a vae-convert output",
        "docs/, notes.txt",
        "even with --force",
    )
    assert _snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_force_replaces_an_empty_folder_and_an_earlier_output(wan_small, tmp_path):
    source, _ = wan_small
    (tmp_path / "empty").mkdir()
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "empty", "--force", "--no-validate")
    earlier_output(tmp_path / "earlier")
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "earlier", "--force", "--no-validate")
    for name in ("empty", "earlier"):
        assert manifest(tmp_path / name)["target"] == "torchax" and not (tmp_path / name / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "empty"]


# the real CLI, whose final rename waits until --out has appeared: the run it races has committed first
_COMMITS_SECOND = """
import sys, time
from converter import output
from converter.__main__ import main

commit = output.OutputFolder.commit


def commit_once_out_exists(self):
    deadline = time.monotonic() + 300
    while not self.out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    commit(self)


output.OutputFolder.commit = commit_once_out_exists
sys.argv[0] = "vae-convert"
main()
"""


def test_two_runs_racing_to_one_out(wan_small, tmp_path):
    """Both pass the start-up check; whichever commits second must not replace the first one's output. The order is
    forced: left to the scheduler, the second run often starts after the first is done and is refused at start-up."""
    source, _ = wan_small
    out = tmp_path / "out"
    args = ["--source", str(source), "--out", str(out), "--no-validate"]  # the race is at the final rename
    second = subprocess.Popen(
        [sys.executable, "-c", _COMMITS_SECOND, "wan2.1", "--to", "torchax", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir()):  # past its start-up check
        assert second.poll() is None, second.communicate()
        time.sleep(0.05)
    run_cli("wan2.1", "--to", "flax", *args)
    _, stderr = second.communicate(timeout=300)
    assert second.returncode == OutputError.exit_code and "another run wrote" in stderr, stderr
    assert manifest(out)["target"] == "flax"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_final_rename_refuses_even_an_empty_target(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "file").write_text("new")
    (tmp_path / "target").mkdir()
    with pytest.raises(FileExistsError):
        _rename_noreplace(tmp_path / "work", tmp_path / "target")
    assert (tmp_path / "work" / "file").exists() and not any((tmp_path / "target").iterdir())


def test_a_signal_during_the_final_rename_waits_for_it(tmp_path, monkeypatch):
    """The signal handler runs after the rename and its record, never between them, so what it undoes matches the
    disk: an interrupt once the new output is in place keeps it, deletes the old one --force replaced, and says so."""
    monkeypatch.setattr(output, "_WRITTEN", [])
    rename, said = output._rename_noreplace, []

    def rename_then_signal(source, target):
        rename(source, target)
        os.kill(os.getpid(), signal.SIGTERM)  # before `committed` is set

    monkeypatch.setattr(output, "_rename_noreplace", rename_then_signal)
    previous = signal.signal(signal.SIGTERM, lambda *_: said.append(output.abandon_all()))
    try:
        earlier_output(tmp_path / "out")
        folder = OutputFolder(tmp_path / "out", force=True)
        with folder as work:
            (work / "new.txt").write_text("new output")
            folder.commit()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert said == [f"the output at {tmp_path / 'out'} was already complete and stays"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["new.txt"]


def test_a_writer_still_adding_files_cannot_bring_the_work_folder_back(tmp_path, monkeypatch):
    """On a signal the work folder is removed while Orbax's writer threads may still be adding files under it, making
    missing parent folders as they go: a write that lands during the removal fails instead of remaking the folder."""
    work = tmp_path / ".out.tmp-1-abc"
    (work / "state" / "d").mkdir(parents=True)
    (work / "state" / "d" / "chunk0").write_bytes(b"0" * 1024)
    rmtree, writes = shutil.rmtree, []

    def write_then_rmtree(path, *args, **kwargs):
        try:  # a writer thread's next chunk, as tensorstore writes it: parents made, then the file
            (work / "state" / "d").mkdir(parents=True, exist_ok=True)
            (work / "state" / "d" / "chunk1").write_bytes(b"1" * 1024)
            writes.append("landed")
        except OSError:
            writes.append("failed")
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(output.shutil, "rmtree", write_then_rmtree)
    output._remove(work)
    assert writes and set(writes) == {"failed"}
    assert list(tmp_path.iterdir()) == []


def _on_a_small_disk(tmp_path, size: str, command: str) -> subprocess.CompletedProcess:
    """Runs the shell `command` with $DISK a filesystem of `size` of its own: a tmpfs mounted in a private mount
    namespace (no privileges needed where user namespaces are allowed), so a full disk is real and nothing else is
    filled."""
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace on this machine (unshare -rm: {probe.stderr.strip()})")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        f'mount -t tmpfs -o size={size} tmpfs "$DISK" && {command}; code=$?; echo left: $(ls -A "$DISK"); exit $code'
    )
    env = {**os.environ, "DISK": str(disk), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, cwd=REPO)


SAVE = """import sys, converter
try:
    converter.save(converter.load(sys.argv[1]), sys.argv[2])
except converter.errors.OutputError as e:
    print("raised:", e)"""
FULL_DISKS = {  # what is written, how much room there is, and what is already there
    "orbax-output": ("vae-convert wan2.1 --source {src} --to flax --out $DISK/out --no-validate", "2m", ""),
    "validation-picture": ("vae-convert wan2.1 --source {src} --to torchax --out $DISK/out", "4m", "filler"),
    "converter-save": ("python -c '" + SAVE + "' {flax} $DISK/out", "2m", ""),
}


@pytest.mark.parametrize(
    "case", [c if c == "orbax-output" else pytest.param(c, marks=pytest.mark.slow) for c in FULL_DISKS]
)
def test_a_full_disk_is_exit_6_with_one_line_and_nothing_left(wan_small, wan_small_outputs, tmp_path, case):
    """Orbax reports a full disk as ValueError from its writer threads, which also print tracebacks; the picture is
    drawn after the whole validation; converter.save is an API. Each: the output error, one line, nothing left."""
    command, size, filler = FULL_DISKS[case]
    command = command.format(src=wan_small[0], flax=wan_small_outputs["flax"])
    if filler:  # room for the weights and 64 KB more, none for the picture (230 KB)
        weights = sum(f.stat().st_size for f in wan_small_outputs["torchax"].iterdir())
        command = f'head -c {4 * 2**20 - weights - 2**16} /dev/zero > "$DISK/filler" && {command}'
    result = _on_a_small_disk(tmp_path, size, command)
    left = next(line for line in result.stdout.splitlines() if line.startswith("left:")).split()[1:]
    assert left == ([filler] if filler else []), result.stdout
    if case == "converter-save":
        assert "raised: cannot write to" in result.stdout and "No space left on device" in result.stdout, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        return
    assert result.returncode == OutputError.exit_code, result.stderr
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr and lines[-1].startswith("error: cannot write to"), result.stderr
    assert "No space left on device (the output needs about" in lines[-1]
    assert len([line for line in lines if not line.startswith(("dtype:", "converting", "validating"))]) == 1, lines


def test_an_output_with_large_statistics_reads_back(tmp_path):
    """Flux.2's BatchNorm has patch x latent channels: a large config's statistics go into the manifest as their
    shape and digest (the values are in the weights), so `info` and `export` read the output the run wrote."""
    import json

    from converter.registry import FAMILIES
    from tests.helpers import save_diffusers

    flux2 = FAMILIES["flux2"]
    config = dict(flux2.testing().small_configs["default-arch"], latent_channels=1024, patch_size=[8, 8])
    save_diffusers(flux2, tmp_path / "vae", config)
    out = tmp_path / "out"
    run_cli("flux.2-dev", "--source", tmp_path / "vae", "--to", "torchax", "--out", out, "--no-validate")
    recorded = manifest(out)["tensors"]["bn.running_mean"]
    assert recorded["shape"] == [8 * 8 * 1024] and len(recorded["sha256"]) == 64
    assert (out / "vae_convert.json").stat().st_size < 100_000
    assert "flux2" in run_cli("info", out).stdout
    run_cli("export", out, "--out", tmp_path / "back", "--no-validate")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["latent_channels"] == 1024
