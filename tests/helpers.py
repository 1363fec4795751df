"""Helpers shared by the tests: the real CLI in a fresh process, checkpoints built and saved by diffusers (the
independent oracle), and the assertions every failure test makes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import unittest.mock
from pathlib import Path

import pytest
import torch

from converter.models.common.spec import FamilySpec
from converter.registry import get_model
from converter.targets import TARGETS

REPO = Path(__file__).resolve().parent.parent
# the suite's data (tests/data/README.md says where each file comes from)
DATA = REPO / "tests" / "data"
PAIRINGS = DATA / "source-formats"


def run_cli(*args, check=True, cwd=REPO, **kwargs) -> subprocess.CompletedProcess:
    """Runs `vae-convert` as a user would, in a fresh process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "converter", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, **kwargs
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"vae-convert {' '.join(map(str, args))} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def report_on_8_devices(script: str, *args) -> dict:
    """The JSON that `script` prints last, run in a fresh process with 8 simulated CPU devices (XLA reads the flag
    when JAX starts, so not in this process)."""
    env = with_simulated_devices(8)
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise AssertionError(f"the script exited {result.returncode}:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def with_simulated_devices(count: int) -> dict:
    """This process's environment with `count` simulated CPU devices for a child process (its other XLA flags kept)."""
    from bench import xla_flags_with_devices

    return {**os.environ, "XLA_FLAGS": xla_flags_with_devices(count)}


def environment_without_compile_cache() -> dict:
    """This process's environment less the suite's compilation cache (conftest.py), for a child process that must
    compile for itself or name its own cache."""
    from converter.api import COMPILE_CACHE_ENV

    return {k: v for k, v in os.environ.items() if k != COMPILE_CACHE_ENV}


def run_in_process(*args, check=False, cwd=REPO) -> subprocess.CompletedProcess:
    """The command line run in this process, as `vae-convert` runs it less its signal handlers, without starting
    Python, JAX and PyTorch anew: for conversions whose files a test checks and error paths that need no process of
    their own (no signal, no Hub, no crash)."""
    from click.testing import CliRunner

    from converter.cli import cli

    with contextlib.chdir(cwd):
        result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="vae-convert")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    if check and result.exit_code != 0:
        raise AssertionError(f"vae-convert {' '.join(map(str, args))} exited {result.exit_code}:\n{result.output}")
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def fails(args, code: int, *needles, out: Path | None = None, cwd=REPO, in_process: bool = False) -> str:
    """The CLI exits with `code` and one `error:` line holding every needle, no traceback; with `out`, nothing is at
    --out and nothing is left beside it. Returns the error line. `in_process`: see run_in_process."""
    result = run_in_process(*args, cwd=cwd) if in_process else run_cli(*args, check=False, cwd=cwd)
    assert result.returncode == code, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    if out is not None:
        assert not out.exists()
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return errors[0]


def only(folder: Path, *names: str):
    """The folder holds exactly these entries: no work or backup folders left over."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)


def family_of(model: str) -> FamilySpec:
    return get_model(model).family


def small(family: FamilySpec, which: str) -> tuple[str, dict]:
    """One of the family's small configs (models/<family>/testing.py) and the first model name of its variant."""
    from converter.registry import model_for

    config = family.testing().small_configs[which]
    return model_for(family, family.config_class.from_dict(config)).qualified, config


def input_shape(family: FamilySpec, batch: int, channels: int, frames: int, sizes: tuple[int, ...]) -> tuple:
    """A channels-first input's shape for the family's models: (B, C, T, *sizes) (a video's sizes: (H, W)), or,
    without a frame axis, (B, C, *sizes) (an image's (H, W), a waveform's (samples,); `frames` unused)."""
    return (batch, channels, *([frames] if family.frame_axis else []), *sizes)


def family_cases(cases) -> dict:
    """Test cases from every registered family's test data: {f"{family}-{name}": (family, name, value)} for
    `cases(testing)` -> {name: value}."""
    from converter.registry import FAMILIES

    return {
        f"{f.name}-{name}": (f, name, value) for f in FAMILIES.values() for name, value in cases(f.testing()).items()
    }


def family_params(cases: dict, fast=lambda family, which: which == "default-arch") -> list:
    """The keys of `cases` (family_cases) as pytest params: each marked with its family (`make test-family`, and its
    own work unit on the test workers, conftest.py) and, where `fast(family, which)` is false, slow (`make test-fast`
    leaves it out). By default each family's default architecture is fast: its parity is the fast tier's core."""
    return [family_param(family, key, slow=not fast(family, which)) for key, (family, which, _) in cases.items()]


def family_param(family: FamilySpec, key: str, *values, slow: bool, id: str | None = None):
    """One case of `family` (`key`: its family_cases key, then any further values of the test's parameters) as a
    pytest param, marked as family_params marks it."""
    marks = [pytest.mark.family(family.name, case=key)] + [pytest.mark.slow] * slow
    return pytest.param(key, *values, id=id or key, marks=marks)


def first_family_only(family: FamilySpec, which: str) -> bool:
    """`family_params`' `fast` for modules whose basic behaviour one case shows: the first family's default
    architecture; the other families' cases are variations (the full tier)."""
    from converter.registry import FAMILIES

    return family.name == next(iter(FAMILIES)) and which == "default-arch"


def per_family(fast=lambda family: True) -> list:
    """Every registered family as pytest params, each marked with its family (and slow where `fast` says so)."""
    from converter.registry import FAMILIES

    return [
        pytest.param(family, id=name, marks=[pytest.mark.family(name)] + [pytest.mark.slow] * (not fast(family)))
        for name, family in FAMILIES.items()
    ]


def save_diffusers(
    family: FamilySpec, path: Path, config: dict, seed: int = 0, default_init: bool = True
) -> torch.nn.Module:
    """A diffusers VAE of `family` with every parameter perturbed (norms and biases too, so a mapping that misplaces
    them shows), saved with diffusers' own `save_pretrained`. Without `default_init` the convolutions and linear
    layers start from zeros rather than PyTorch's uniform draws, which take most of a full-size model's making
    (Wan 2.2's: 10.5 s of 28): the perturbation alone makes their weights, at about the same scale at full widths."""
    from converter.random_checkpoint import keep_inside_the_clamp

    torch.manual_seed(seed)
    with contextlib.nullcontext() if default_init else _zero_layer_init():
        model = family.diffusers_class()(**config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
        saved = model.state_dict()
        for name, b in model.named_buffers():  # the ones the checkpoint carries (latent and BatchNorm statistics)
            if name in saved and b.is_floating_point():
                b.add_(0.1 * torch.randn(b.shape, generator=generator))
            elif name in saved:  # a count (BatchNorm's batches): one no default equals
                b.add_(torch.randint(1, 1 << 20, b.shape, generator=generator))
        keep_inside_the_clamp(model, family)
    model.save_pretrained(path)
    return model


@contextlib.contextmanager
def _zero_layer_init():
    """PyTorch's layers initialised to zeros (their reset_parameters' draws: torch.nn.init's uniform ones)."""

    def zeros(tensor, *args, **kwargs):
        with torch.no_grad():
            return tensor.zero_()

    with contextlib.ExitStack() as stack:
        for name in ("kaiming_uniform_", "uniform_"):
            stack.enter_context(unittest.mock.patch.object(torch.nn.init, name, zeros))
        yield


@dataclasses.dataclass(frozen=True)
class Converted:
    """A family's small checkpoint saved by diffusers and converted through the CLI (no validation)."""

    name: str  # the first model name of its variant
    reference: torch.nn.Module  # the diffusers model
    source: Path  # its diffusers folder
    outputs: dict[str, Path]  # target -> output folder (tests change only copies of them)


def converted_outputs(family: FamilySpec, which: str, root: Path) -> Converted:
    """One of the family's small configs saved by diffusers under root/vae and converted to every target."""
    name, config = small(family, which)
    reference = save_diffusers(family, root / "vae", config)
    for target in TARGETS:
        result = run_in_process(name, "--source", root / "vae", "--to", target, "--out", root / target, "--no-validate")
        assert result.returncode == 0, result.stdout + result.stderr
    return Converted(name, reference, root / "vae", {target: root / target for target in TARGETS})


def converted_by_cli(model: str, config: dict, root: Path, targets=tuple(TARGETS)) -> tuple:
    """A diffusers checkpoint of `model`'s family saved under root/vae, converted to each of `targets` through the
    CLI and loaded back: (the diffusers model, {target: loaded model})."""
    import converter

    reference = save_diffusers(family_of(model), root / "vae", config)
    models = {}
    for target in targets:
        # parity and tiling compare with diffusers themselves: the CLI's own validation (its tests are
        # test_full_size.py, test_source_formats.py and test_sources.py) and its picture (test_preview.py) are skipped
        args = ("--source", root / "vae", "--to", target, "--out", root / target, "--no-validate")
        run_in_process(model, *args, check=True)
        models[target] = converter.load(root / target)
    return reference, models


def decode_inputs(family: FamilySpec, config: dict) -> tuple[dict, dict]:
    """The extra inputs the family's validation decodes with (a timestep, for LTX), for our runners (numpy arrays)
    and for the diffusers model (tensors)."""
    from converter.validate import decode_inputs as validation_decode_inputs

    ours = validation_decode_inputs(family, family.config_class.from_dict(config))
    return ours, {name: torch.from_numpy(value) for name, value in ours.items()}


def runner(target: str, model):
    """The loaded model driven with channels-first numpy arrays (the target's validation runner)."""
    return TARGETS[target].runner(model)


def edited_copy(source: Path, folder: Path, edit) -> Path:
    """A copy of a diffusers checkpoint folder whose state_dict went through `edit` (a function changing a dict)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    weights = folder / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    edit(state)
    save_file(state, weights)
    return folder


def earlier_output(folder: Path, text: str = "previous output") -> Path:
    """A folder that passes for an earlier vae-convert output (its manifest is there), holding old.txt."""
    folder.mkdir(parents=True)
    (folder / "vae_convert.json").write_text(json.dumps({"tool": "vae-convert"}))
    (folder / "old.txt").write_text(text)
    return folder


def manifest(out: Path) -> dict:
    return json.loads((out / "vae_convert.json").read_text())


def compiled_steps() -> int:
    """How many chunk steps the Flax models have compiled in this process (jax.jit's cache size: a private API,
    kept behind this one helper)."""
    from converter.models.common.steps_flax import step

    return step._cache_size()
