"""MiniMax-H3's video VAE beyond the generic tests (which take its small configs, clip and chunk frame counts and
tiling case from models/minimaxh3/testing.py): tiling is on from the start, as the model was released, and a latent
too short for one chunk is one clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import converter
from converter.registry import FAMILIES
from tests.helpers import runner

MINIMAXH3 = FAMILIES["minimaxh3"]


@pytest.fixture(scope="module")
def outputs(default_arch):
    shared = default_arch(MINIMAXH3)
    return shared.reference, {t: converter.load(out) for t, out in shared.outputs.items()}


def test_a_frame_larger_than_a_tile_decodes_in_tiles_without_being_asked(outputs):
    """diffusers' class tiles from the start with 256-pixel tiles; so do ours, and their tiles are its tiles: a
    latent of 2 x 2 tiles at the released tile size decodes as diffusers' default does, not as its untiled decode."""
    reference, models = outputs
    z = torch.randn(1, reference.config.latent_channels, 3, 72, 80, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference.decode(z).sample.numpy()
        reference.disable_tiling()
        untiled = reference.decode(z).sample.numpy()
        reference.enable_tiling()
    assert np.abs(expected - untiled).max() > 1e-2
    got = runner("flax", models["flax"]).decode(z.numpy())
    assert np.abs(got - expected).max() <= 1e-4


@pytest.mark.parametrize("target", ["flax", "torchax"])
def test_a_latent_shorter_than_a_chunk_is_one_clear_error(outputs, target):
    """diffusers' decode fails deep inside on fewer than 3 latent frames (a single image's one among them)."""
    _, models = outputs
    z = np.zeros((1, 24, 2, 2, 2), np.float32)
    with pytest.raises(ValueError, match="at least 3 latent frames"):
        runner(target, models[target]).decode(z)
