"""Shared fixtures (helpers live in tests/helpers.py)."""

from __future__ import annotations

import pytest

from converter.registry import FAMILIES
from tests.helpers import save_diffusers

WAN = FAMILIES["wan"]


@pytest.fixture(scope="session")
def wan_small(tmp_path_factory):
    """A small Wan checkpoint saved by diffusers (the default architecture at small widths), and the model."""
    path = tmp_path_factory.mktemp("wan_small") / "vae"
    return path, save_diffusers(WAN, path, WAN.small_configs["default-arch"])
