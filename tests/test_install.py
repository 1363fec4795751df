"""Installed from its wheel (not editable), the project adds one top-level import name, `converter`, and works from a
folder that has a `models/` package of its own (as most ML repositories do); it installs into an environment that
already has its JAX and PyTorch without replacing them (ranges, not pins)."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow  # fresh virtual environments and a wheel build


def test_wheel_installs_one_namespace_and_ignores_a_local_models_package(tmp_path):
    # from a copy without build outputs: a stale build/ folder would put files into the wheel that the tree lacks
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv*", "build", "*.egg-info", ".git", "__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "dist").glob("vae_convert-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"converter"}
    # every module of every family folder, found without a list to keep (setup.py), and every mapping file
    expected = {f"converter/{p.relative_to(REPO)}" for p in (REPO / "models").rglob("*.py")}
    expected |= {f"converter/{p.relative_to(REPO)}" for p in (REPO / "mappings").glob("*.yaml")}
    assert expected <= set(names), sorted(expected - set(names))

    venv.create(tmp_path / "venv", with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # the dependencies (torch, jax, ...) come from this environment's site-packages, appended after the venv's own;
    # this project itself only from the wheel (the editable install's finder is not loaded from a plain path entry)
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(wheel)],
        check=True,
        capture_output=True,
    )

    work = tmp_path / "someone-elses-repo"
    (work / "models").mkdir(parents=True)
    (work / "models" / "__init__.py").write_text("raise ImportError('the wrong models package was imported')\n")
    where = subprocess.run(
        [python, "-c", "import converter, converter.registry; print(converter.__file__)"],
        cwd=work,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert where.startswith(site), where
    # the wheel's mapping files are read where it is installed (every one is in it, above)
    vae_convert = [python, "-m", "converter"]
    for command in (
        ["random-checkpoint", "wan2.1", "ckpt", "--small"],
        ["wan2.1", "--source", "ckpt", "--to", "flax", "--out", "out"],
    ):
        result = subprocess.run([*vae_convert, *command], cwd=work, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    assert "validation 3/3 ✓" in result.stdout


STACK = ("jax", "jaxlib", "flax", "orbax-checkpoint", "torch", "torchax")


def _requirements() -> dict[str, str]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = [line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()]
    return {re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower(): line for line in lines}


def test_the_stack_is_declared_as_ranges_with_floors():
    requirements = _requirements()
    assert "jaxlib" not in requirements  # it comes with jax, at the version jax asks for
    for name in STACK[:1] + STACK[2:]:
        assert "==" not in requirements[name] and ">=" in requirements[name], requirements[name]
    floors = dict(line.split("==") for line in (REPO / "constraints-floors.txt").read_text().split() if "==" in line)
    for name in STACK[:1] + STACK[2:]:
        assert f">={floors[name]}" in requirements[name], (name, floors[name], requirements[name])


def test_installing_into_an_environment_keeps_its_jax_and_torch(tmp_path):
    """This environment holds a JAX and a PyTorch above the floors: pip's plan for the project changes neither (nor
    Flax, Orbax, torchax); --no-index, so a plan that needed anything new fails instead of fetching it."""
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv*", "build", "*.egg-info", ".git", "__pycache__"))
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "-q",
         "--report", str(report), str(source)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert planned == {"vae-convert"}, planned
