"""A pipeline's decode-side components on the command line (the models that have several: `vae-convert list`): one
named either way, every one at once into OUT/<component>/ as one output, and a component a model has not."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from converter.registry import COMPONENT_MODELS, get_models
from tests.helpers import fails, manifest, only, run_cli, run_in_process, save_diffusers

# the first model name with more than its VAE, and its components
PIPELINE = next(name for name, component in COMPONENT_MODELS if component != "vae")
COMPONENTS = get_models(PIPELINE, "all")


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    """A pipeline folder as diffusers saves one: each component's default architecture at small widths in its own
    subfolder."""
    root = tmp_path_factory.mktemp("pipeline")
    for entry in COMPONENTS:
        save_diffusers(entry.family, root / entry.component, entry.family.testing().small_configs["default-arch"])
    return root


def test_a_component_is_named_either_way(pipeline_folder, tmp_path):
    """`--component NAME` and `MODEL:NAME` say the same, from a pipeline folder (its NAME/ subfolder) or the component's
    own folder; the output says which component it is."""
    entry = COMPONENTS[-1]
    for args, source in (
        ((PIPELINE, "--component", entry.component), pipeline_folder),
        ((entry.qualified,), pipeline_folder / entry.component),
    ):
        out = tmp_path / str(len(args))
        result = run_in_process(*args, "--source", source, "--to", "torchax", "--out", out, "--no-validate")
        assert result.returncode == 0, result.stderr
        assert manifest(out)["component"] == entry.component and manifest(out)["family"] == entry.family.name


def test_every_component_converts_into_its_folder_as_one_output(pipeline_folder, tmp_path):
    """--component all: each component validated into OUT/<component>/, which `info` describes and --force replaces
    as one output; OUT itself is no single model's output, and saying so names its parts."""
    out = tmp_path / "out"
    for again in ((), ("--force", "--no-validate")):
        result = run_cli(PIPELINE, "--component", "all", "--source", pipeline_folder, "--to", "torchax", "--out", out,
                         *again)  # fmt: skip
        only(tmp_path, "out")
        only(out, *(e.component for e in COMPONENTS))
        for entry in COMPONENTS:
            assert f"✓ {entry.qualified} -> torchax" in result.stdout
            assert manifest(out / entry.component)["family"] == entry.family.name
            assert manifest(out / entry.component).get("validation", {}).get("ok") is (None if again else True)
    described = run_in_process("info", out).stdout
    assert [line for line in described.splitlines() if line.endswith("/")] == [f"{e.component}/" for e in COMPONENTS]
    fails(["export", out, "--out", tmp_path / "back"], 3, f"give one of them, as {out / 'vae'}", in_process=True)


def test_one_component_failing_leaves_nothing(pipeline_folder, tmp_path):
    """All or nothing: the last component's checkpoint lacks a tensor, so no component is written at OUT."""
    broken = tmp_path / "pipeline"
    last = COMPONENTS[-1].component
    for entry in COMPONENTS:
        (broken / entry.component).mkdir(parents=True)
        for file in (pipeline_folder / entry.component).iterdir():
            (broken / entry.component / file.name).write_bytes(file.read_bytes())
    weights = broken / last / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    missing = sorted(state)[0]
    save_file({k: v for k, v in state.items() if k != missing}, weights)
    out = tmp_path / "out"
    args = [PIPELINE, "--component", "all", "--source", broken, "--to", "flax", "--out", out, "--no-validate"]
    fails(args, 3, missing, out=out)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("sd1.5", "--component", "audio_vae"), "sd1.5 has no audio_vae component (its components: vae)"),
        (("ltx-video:vocoder",), "ltx-video has no vocoder component (its components: vae)"),
        ((f"{PIPELINE}:{COMPONENTS[1].component}", "--component", "vae"), "name two components"),
        ((PIPELINE, "--component", "all", "--config", "config.json"), "--config describe one component's source"),
    ],
)
def test_a_component_the_model_has_not_is_a_usage_error(tmp_path, args, needle):
    out = tmp_path / "out"
    fails([*args, "--source", tmp_path, "--to", "flax", "--out", out], 2, needle, out=out, in_process=True)
