"""A family is its folder, its mapping file, its test file and one registry line: the generic tests take their cases
from the registry and each family's test data (models/<family>/testing.py), so a family registered at runtime (a
renamed copy of Wan's spec) appears in their parametrised cases with no test-table edit; names are unique."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys

import pytest

from converter import registry, validate
from tests.helpers import REPO, per_family

GENERIC = ["test_parity.py", "test_tiling.py", "test_sharding.py", "test_export.py", "test_compile_cache.py"]

PLUGIN = """
import dataclasses
from converter import registry

wan = registry.FAMILIES["wan"]
models = tuple(dataclasses.replace(m, name="copy-" + m.name, aliases=()) for m in wan.models)
registry.register(dataclasses.replace(wan, name="throwaway", models=models))
"""


def test_a_family_registered_at_runtime_appears_in_the_generic_tests(tmp_path):
    (tmp_path / "throwaway_family.py").write_text(PLUGIN)
    modules = [f"tests/{m}" for m in GENERIC]
    collected = _collect(tmp_path, *modules)
    for module in modules:
        cases = [test.partition("[")[2] for test in collected if test.startswith(module)]
        wan = {case.replace("wan", "throwaway", 1) for case in cases if case.startswith("wan")}
        assert wan, module
        assert wan <= set(cases), (module, sorted(wan - set(cases)))
    # its default architecture's parity is in the fast tier, and `make test-family F=throwaway` runs its cases
    fast, family = (
        _collect(tmp_path, *options, "tests/test_parity.py")
        for options in (["-m", "not slow"], ["--family", "throwaway"])
    )
    for direction, longest in (("decode", "5x4x4"), ("encode", "9x16x16")):  # Wan's longest inputs
        assert f"tests/test_parity.py::test_{direction}_matches_diffusers[throwaway-default-arch-{longest}]" in fast
    assert family and all("throwaway" in test for test in family), family


def _collect(tmp_path, *args) -> list[str]:
    """The tests pytest collects with the throwaway family registered, by node id."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "throwaway_family", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_names_are_registered_once():
    wan = registry.FAMILIES["wan"]
    with pytest.raises(ValueError, match="wan2.1"):
        registry.register(dataclasses.replace(wan, name="other"))
    assert "other" not in registry.FAMILIES


@pytest.mark.parametrize("family", per_family())
def test_every_family_implements_the_model_protocol(family):
    """Both implementations, built abstractly (no weights), have what the chunk runners, tiling, validation and the
    converter use (models/common/protocol.py)."""
    import numpy as np

    from converter import targets
    from converter.models.common.protocol import Part, protocols, signature_problems

    config = family.config_class.from_dict(family.testing().small_configs["default-arch"])
    flax_model = targets.TARGETS["flax"].empty_model(family, config, np.float32).model
    torch_model = targets.meta_torch(family, config)
    flax_protocol, torch_protocol = protocols(family.parts)
    assert isinstance(flax_model, flax_protocol) and isinstance(torch_model, torch_protocol)
    # callable as the protocol declares: the runners, tiling and validation pass arguments as it says
    for model, protocol in ((flax_model, flax_protocol), (torch_model, torch_protocol)):
        assert signature_problems(type(model), protocol) == []
        for part in family.parts:
            implementation = getattr(model, part)
            assert isinstance(implementation, Part)
            is_method = inspect.ismethod(implementation)
            assert signature_problems(implementation if is_method else type(implementation), Part) == []
    import torch

    with torch.device("meta"):
        reference = family.diffusers_class()(**family.testing().small_configs["default-arch"])
    for model in (flax_model, torch_model):
        # tiling starts as in diffusers' class: off until enabled, or on where the model was released tiled
        assert (model.tile_plan("decoder") is not None) == getattr(reference, "use_tiling", False)
        if model.tiling_class is None:  # a class diffusers does not tile says so, as diffusers' does
            with pytest.raises(NotImplementedError):
                model.enable_tiling()
            continue
        model.enable_tiling()
        assert all(model.tile_plan(part) is not None for part in family.parts)
        model.disable_tiling()
    assert len({shape[0] for shape in validate.validation_shapes(family, config).values()}) == 1  # one batch
    assert family.component in registry.COMPONENTS and set(family.parts) <= {"encoder", "decoder"}


def test_the_protocol_check_refuses_arguments_in_another_order():
    """LTX's decode once took `step` after its timestep, and worked only because every caller passed it by keyword."""
    from converter.models.common.protocol import TorchVAE, signature_problems
    from converter.models.ltx.modeling_torch import AutoencoderKLLTXVideo

    class StepSecond(AutoencoderKLLTXVideo):
        def decode(self, z, step=None, temb=None, noise=None): ...

    class ExtraInputRequired(AutoencoderKLLTXVideo):
        def decode(self, z, temb, *, step=None, noise=None): ...

    class ZLast(AutoencoderKLLTXVideo):
        def decode(self, *, step=None, z=None): ...

    assert signature_problems(AutoencoderKLLTXVideo, TorchVAE) == []
    for wrong, problem in (
        (StepSecond, "step must be keyword-only with default None"),
        (ExtraInputRequired, "temb is not an optional input"),
        (ZLast, "takes (*, step=None, z=None) where the protocol takes (z, *, step=None, **inputs)"),
    ):
        assert [p for p in signature_problems(wrong, TorchVAE) if problem in p], signature_problems(wrong, TorchVAE)


def _shifted_models():
    """Wan's models with a decoder that adds a per-batch `shift` to every chunk it returns: a family with an extra
    decode input, carried by keyword from `decode` through the chunk runners to the decoder (as LTX's timestep)."""
    from converter.models.common.outputs import DecoderOutput
    from converter.models.wan import modeling_flax, modeling_torch
    from converter.models.wan.config import decode_chunks

    class FlaxDecoder(modeling_flax.WanDecoder3d):
        def __call__(self, x, cache=None, shift=None):
            x, cache = super().__call__(x, cache)
            return x + shift[:, None, None, None, None], cache

    class Flax(modeling_flax.AutoencoderKLWan):
        def decode(self, z, *, mesh=None, shift=None):
            return modeling_flax.run_chunks(self, "decoder", z, decode_chunks(z.shape[1]), mesh, {"shift": shift})

    class TorchDecoder(modeling_torch.WanDecoder3d):
        def forward(self, x, cache=None, shift=None):
            x, cache = super().forward(x, cache)
            return x + shift[:, None, None, None, None], cache

    class Torch(modeling_torch.AutoencoderKLWan):
        def decode(self, z, *, step=None, shift=None):
            return DecoderOutput(self.run_chunks("decoder", z, decode_chunks(z.shape[2]), step, {"shift": shift}))

    return (Flax, FlaxDecoder), (Torch, TorchDecoder)


@pytest.mark.slow
def test_validation_decodes_with_the_family_s_extra_inputs_on_every_runner(wan_small_outputs):
    import numpy as np

    import converter
    from converter import validate
    from converter.runners import FlaxRunner, TorchaxRunner, TorchRunner

    (flax_cls, flax_decoder), (torch_cls, torch_decoder) = _shifted_models()
    flax_model, torch_model = converter.load(wan_small_outputs["flax"]), converter.load(wan_small_outputs["torchax"])
    wan, config = registry.FAMILIES["wan"], flax_model.config
    latent, _ = validate.validation_inputs(wan, config)
    plain = TorchRunner(torch_model).decode(latent)  # before the shift
    flax_model.__class__, flax_model.decoder.__class__ = flax_cls, flax_decoder
    torch_model.__class__, torch_model.decoder.__class__ = torch_cls, torch_decoder
    shift = np.array([0.25], np.float32)
    family = dataclasses.replace(wan, validation_decode_inputs=lambda config: {"shift": shift})
    for runner in (FlaxRunner(flax_model), TorchaxRunner(torch_model)):
        outcome = validate.compare_runners(family, config, runner, TorchRunner(torch_model))
        assert all(c.ok for c in outcome.comparisons), [c.line() for c in outcome.comparisons]
        assert outcome.decode_inputs == {"shift": shift}
        # the reference decoded with the shift (its output moved by it: the test model inside the [-1, 1] clamp of
        # the plain decode), and the runner's equals it
        assert abs(np.median(outcome.decoded[1] - plain) - 0.25) < 1e-4
        assert np.abs(outcome.decoded[0] - outcome.decoded[1]).max() <= 1e-4


@pytest.mark.parametrize("family", per_family())
def test_every_family_keeps_in_float32_what_diffusers_keeps(family):
    """The spec's float32 modules are diffusers' `_keep_in_fp32_modules`; both targets keep the same leaves (as
    many, as large) in float32, in a bfloat16 output."""
    import numpy as np

    from converter.targets import TARGETS

    assert family.keep_in_float32 == tuple(getattr(family.diffusers_class(), "_keep_in_fp32_modules", None) or ())
    config = family.config_class.from_dict(family.testing().small_configs["default-arch"])
    kept = {}
    for name, target in TARGETS.items():
        shapes, fixed = target.leaf_shapes(family, config), target.fixed_dtype_leaves(family, config)
        kept[name] = sorted(int(np.prod(shapes[k])) for k, dtype in fixed.items() if dtype == np.float32)
    assert kept["flax"] == kept["torchax"]
    assert bool(kept["flax"]) == bool(family.keep_in_float32)


@pytest.mark.parametrize("family", per_family())
def test_the_first_named_model_holds_diffusers_tensors(family):
    """At its released size (no weights: diffusers' class on the meta device, our models abstract), each target of
    the family's first named model holds diffusers' tensors, every one and no other: torchax by name and shape,
    Flax as many and as large."""
    import numpy as np
    import torch
    from flax import nnx

    from converter.targets import TARGETS, diffusers_shapes

    entry = registry.first_model(family)
    config = family.config_class.from_dict(entry.config)
    with torch.device("meta"):
        reference = family.diffusers_class()(**entry.config).state_dict()
    assert diffusers_shapes(family, config) == {k: tuple(v.shape) for k, v in reference.items()}
    flax_model = TARGETS["flax"].empty_model(family, config, np.float32).model
    leaves = [leaf for _, leaf in nnx.to_flat_state(nnx.state(flax_model))]
    assert len(leaves) == len(reference)
    assert sum(int(np.prod(leaf.shape)) for leaf in leaves) == sum(v.numel() for v in reference.values())
