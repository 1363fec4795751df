"""Shared fixtures (helpers live in tests/helpers.py)."""

from __future__ import annotations

import pytest

# the helpers' asserts (what a folder holds, an exit code) report their values, as the tests' own do
pytest.register_assert_rewrite("tests.helpers")

from converter.registry import FAMILIES  # noqa: E402
from tests.helpers import save_diffusers  # noqa: E402

WAN = FAMILIES["wan"]


@pytest.fixture(scope="session")
def wan_small(tmp_path_factory):
    """A small Wan checkpoint saved by diffusers (the default architecture at small widths), and the model."""
    path = tmp_path_factory.mktemp("wan_small") / "vae"
    return path, save_diffusers(WAN, path, WAN.small_configs["default-arch"])
