"""A family is its folder, its mapping file, its test file and one registry line: the generic tests take their cases
from the registry and each family's test data (models/<family>/testing.py), so a family registered at runtime (a
renamed copy of Wan's spec) appears in their parametrised cases with no test-table edit; names are unique."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from converter import registry
from tests.helpers import REPO

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
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "throwaway_family", *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for module in modules:
        cases = [line.partition("[")[2] for line in result.stdout.splitlines() if line.startswith(module)]
        wan = {case.replace("wan", "throwaway", 1) for case in cases if case.startswith("wan")}
        assert wan, module
        assert wan <= set(cases), (module, sorted(wan - set(cases)))


def test_names_are_registered_once():
    wan = registry.FAMILIES["wan"]
    with pytest.raises(ValueError, match="wan2.1"):
        registry.register(dataclasses.replace(wan, name="other"))
    assert "other" not in registry.FAMILIES


@pytest.mark.parametrize("family", list(registry.FAMILIES.values()), ids=list(registry.FAMILIES))
def test_every_family_implements_the_model_protocol(family):
    """Both implementations, built abstractly (no weights), have what the chunk runners, tiling, validation and the
    converter use (models/common/protocol.py)."""
    import numpy as np

    from converter import targets
    from converter.models.common.protocol import FlaxVAE, Part, TorchVAE

    config = family.config_class.from_dict(family.testing().small_configs["default-arch"])
    flax_model = targets.TARGETS["flax"].empty_model(family, config, np.float32).model
    torch_model = targets.meta_torch(family, config)
    assert isinstance(flax_model, FlaxVAE) and isinstance(torch_model, TorchVAE)
    for model in (flax_model, torch_model):
        assert isinstance(model.encoder, Part) and isinstance(model.decoder, Part)
        assert model.tile_plan("decoder") is None  # tiling is off until enabled, as in diffusers
        model.enable_tiling()
        assert model.tile_plan("decoder") is not None and model.tile_plan("encoder") is not None
        model.disable_tiling()
    assert family.validation_latent_shape(config)[0] == family.validation_video_shape(config)[0]
