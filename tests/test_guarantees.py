"""What every family keeps, written once over the registry (a family registered at runtime is tested too):
diffusers' `from_pretrained` reads its torchax output as the very model it converted; a checkpoint of it named as
any other family is refused with the command that converts it (with its config.json, and as a weights file alone);
its models check their inputs' rank, channels, batch and frames, and refuse the lengths diffusers' model cannot
take, in both targets."""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest
import torch

import converter
from bench import diffusers_decode
from converter import validate
from converter.registry import FAMILIES, first_model, get_model
from converter.targets import TARGETS, diffusers_shapes
from tests.helpers import decode_inputs, fails, per_family, run_in_process, small


@pytest.mark.parametrize("family", per_family())
def test_diffusers_reads_the_torchax_output(default_arch, family):
    converted = default_arch(family)
    read = family.diffusers_class().from_pretrained(converted.outputs["torchax"]).eval()
    reference = converted.reference.state_dict()
    assert read.state_dict().keys() == reference.keys()
    assert all(torch.equal(read.state_dict()[k], v) for k, v in reference.items())
    config = family.config_class.from_dict(dict(converted.reference.config))
    z = torch.randn(family.validation_latent_shape(config), generator=torch.Generator().manual_seed(0))
    _, inputs = decode_inputs(family, dict(converted.reference.config))
    with torch.no_grad():
        assert torch.equal(diffusers_decode(read, z, **inputs), diffusers_decode(converted.reference, z, **inputs))


def _small(family) -> dict:
    return family.testing().small_configs["default-arch"]


@functools.cache
def _keys_of(model: str, component: str | None = None) -> set[str]:
    """The diffusers keys of the named model's family at its default small widths."""
    family = get_model(model, component).family
    return diffusers_shapes(family, family.config_class.from_dict(_small(family))).keys()


def _named_as(held: str) -> list[str]:
    """The families a checkpoint of `held` is tried under: those whose keys it shares some of (where detection could
    be fooled), or, where it shares none, the first other family (its config.json still names its class)."""
    keys = _keys_of(first_model(FAMILIES[held]).qualified)
    sharing = [named for named in FAMILIES if named != held and keys & _keys_of(first_model(FAMILIES[named]).qualified)]
    return sharing or [next(named for named in FAMILIES if named != held)]


PAIRS = [
    pytest.param(held, named, id=f"{held}-as-{named}", marks=[pytest.mark.family(held), pytest.mark.family(named)])
    for held in FAMILIES
    for named in _named_as(held)
]


@pytest.mark.parametrize(("held", "named"), PAIRS)
def test_a_checkpoint_named_as_another_family_is_refused_with_its_command(default_arch, tmp_path, held, named):
    """Its config.json names its class: refused, with the command for its variant. Its weights file alone: its keys
    decide, refused with a command that converts those keys, unless the named family's own checkpoints have the very
    same keys (Wan's and Qwen-Image's: a file alone cannot say which it is)."""
    converted, other = default_arch(FAMILIES[held]), FAMILIES[named]
    out, name = tmp_path / "out", first_model(other).qualified
    command = get_model(converted.name).command
    args = ["--to", "flax", "--out", out, "--dry-run"]
    fails([name, "--source", converted.source, *args], 3, f"`{command}`", out=out, in_process=True)
    bare = tmp_path / "alone" / "vae.safetensors"
    bare.parent.mkdir()
    shutil.copy(converted.source / "diffusion_pytorch_model.safetensors", bare)
    keys = converted.reference.state_dict().keys()
    if set(keys) == _keys_of(name):  # a file alone cannot say which of the two it is: converted, or bad input
        assert run_in_process(name, "--source", bare, *args).returncode in (0, 3)
        return
    error = fails([name, "--source", bare, *args], 3, "`vae-convert ", out=out, in_process=True)
    told = error.split("`vae-convert ")[1].split("`")[0]  # NAME, or NAME --component COMPONENT
    told_name, _, told_component = told.partition(" --component ")
    assert f"vae-convert {told}" == command or _keys_of(told_name, told_component or None) == set(keys), error


def _zeros(target: str, shape) -> object:
    return np.zeros(shape, np.float32) if target == "flax" else torch.zeros(shape)


def _wrong(shape: tuple, frame_axis: bool) -> dict[str, tuple]:
    """Channels-first inputs a model must refuse, by what is wrong with them."""
    wrong = {"rank": shape[:-1], "channels": (shape[0], shape[1] + 1, *shape[2:]), "batch": (0, *shape[1:])}
    if frame_axis:
        wrong["frames"] = (*shape[:2], 0, *shape[3:])
    return wrong


@pytest.mark.parametrize("family", per_family())
def test_every_model_checks_its_inputs(default_arch, family):
    """Each part a model has, given a channels-first input of the wrong rank, channels, batch or frames (in Flax
    moved channels-last), raises one ValueError saying what it expected, before any layer runs."""
    converted = default_arch(family)
    config = family.config_class.from_dict(dict(converted.reference.config))
    inputs = validate.validation_shapes(family, config)
    shapes = {"decode": inputs["latent"], **({"encode": inputs["sample"]} if "sample" in inputs else {})}
    for target, folder in converted.outputs.items():
        model = converter.load(folder)
        for call in shapes:
            for what, shape in _wrong(shapes[call], family.frame_axis).items():
                layout = shape if target != "flax" or what == "rank" else (shape[0], *shape[2:], shape[1])
                with pytest.raises(ValueError, match=f"^{call}: ") as caught:
                    getattr(model, call)(_zeros(target, layout))
                assert "got shape" in str(caught.value) or "expected" in str(caught.value), (target, what)


def _resized(shape: tuple) -> list[tuple]:
    """Channels-first shapes of `shape`'s batch and channels, each length (frames, height, width, samples) in turn
    made 1, 2 or 3 where shorter: below a downsampler's or a pad's least, off a frame hop, no multiple of a patch
    (and cheap to run)."""
    return [
        (*shape[:axis], value, *shape[axis + 1 :])
        for axis in range(2, len(shape))
        for value in (1, 2, 3)
        if value < shape[axis]
    ]


def _fails(reference, shape: tuple) -> bool:
    try:
        with torch.no_grad():
            reference(torch.zeros(shape))
    except (RuntimeError, ValueError, IndexError):
        return True
    return False


@pytest.mark.parametrize("family", per_family())
def test_what_diffusers_cannot_encode_or_decode_is_refused_by_its_lengths(default_arch, family):
    """An input of the right rank and channels whose frames or sides diffusers' model cannot take (a frame count off
    the space-to-depth hop, a side no multiple of the patch, a side too small for a reflection pad) raises one
    ValueError saying what the model takes, in both targets, before any layer runs; not a reshape error deep
    inside, nor an output diffusers has no answer for."""
    converted = default_arch(family)
    config = family.config_class.from_dict(dict(converted.reference.config))
    inputs = validate.validation_shapes(family, config)
    ours, theirs = decode_inputs(family, dict(converted.reference.config))
    calls = {"decode": (inputs["latent"], lambda z: diffusers_decode(converted.reference, z, **theirs))}
    if "sample" in inputs:
        calls["encode"] = (inputs["sample"], converted.reference.encode)
    models = {target: converter.load(folder) for target, folder in converted.outputs.items()}
    for call, (shape, reference) in calls.items():
        # what diffusers runs, the parity tests compare
        for resized in filter(functools.partial(_fails, reference), _resized(shape)):
            for target, model in models.items():
                layout = resized if target != "flax" else (resized[0], *resized[2:], resized[1])
                extra = ours if call == "decode" else {}
                with pytest.raises(ValueError, match=f"^{call}: "):
                    getattr(model, call)(_zeros(target, layout), **extra)


@pytest.mark.parametrize("family", per_family())
def test_every_family_has_validation_inputs_of_its_shapes(family):
    """The validation's latent and sample (a video, an image, a waveform) are made for every family's released
    config, of the shapes its spec gives, finite and not all zero."""
    config = family.config_class.from_dict(family.models[0].config)
    shapes = validate.validation_shapes(family, config)
    latent, sample = validate.validation_inputs(family, config)
    for what, array in (("latent", latent), ("sample", sample)):
        if what in shapes:
            assert array.shape == shapes[what] and np.isfinite(array).all() and np.abs(array).max() > 0.1, what
        else:
            assert array is None


# bfloat16's error is random in the weights and inputs: ours may exceed diffusers' by this much at these small sizes
BFLOAT16_MARGIN = 1.25


@pytest.mark.parametrize("family", per_family())
def test_bfloat16_is_no_further_from_float32_than_diffusers(default_arch, family, tmp_path):
    """`--dtype bfloat16` outputs, run in their own dtype as users run them, decode and encode no further from
    diffusers' float32 model than diffusers' own bfloat16 model (loaded with `torch_dtype`, its float32 modules
    kept) does, within a small margin: the relative L2 error (the largest error of one value is too noisy at these
    sizes to hold to a margin; bench/precision.py reports both at full size)."""
    from bench.precision import errors

    converted = default_arch(family)
    config = family.config_class.from_dict(dict(converted.reference.config))
    rng = np.random.default_rng(0)
    latent = rng.standard_normal(family.validation_latent_shape(config)).astype(np.float32)
    sample = family.validation_sample_shape and rng.uniform(-1, 1, family.validation_sample_shape(config))
    outputs = {}
    for target in TARGETS:
        outputs[target] = tmp_path / target
        run_in_process(converted.name, "--source", converted.source, "--to", target, "--out", outputs[target],
                       "--dtype", "bfloat16", "--no-validate", check=True)  # fmt: skip
    rows = errors(converted.source, outputs, latent, None if sample is None else sample.astype(np.float32))
    for target in outputs:
        for part, measured in rows[target].items():
            assert measured["relative L2"] <= BFLOAT16_MARGIN * rows["diffusers"][part]["relative L2"], (target, part)


@pytest.mark.parametrize("family", per_family())
def test_a_config_list_left_empty_is_refused_or_builds(family):
    """Each list a family's config holds, left empty (a config.json of a few bytes): a ConfigError (the CLI's exit 3
    with its one line), or a config whose validation inputs, diffusers' model and our abstract Flax model all build;
    never an error from deep inside the planning."""
    from converter.models.common.config import ConfigError
    from converter.structure_cache import flax_structure

    full = family.config_class.from_dict(small(family, "default-arch")[1]).to_dict()
    for field in [name for name, value in full.items() if isinstance(value, list)]:
        try:
            config = family.config_class.from_dict({**full, field: []})
        except ConfigError:
            continue
        validate.validation_shapes(family, config)
        assert diffusers_shapes(family, config), field
        flax_structure(family.name, config, np.dtype(np.float32))
