"""Spatial tiling: `enable_tiling` with the same settings must give diffusers' tiled results (fp32 max abs difference
<= 1e-4), encode and decode, on grids with short last rows and columns, for each family's tiling cases
(models/<family>/testing.py), with Flax and the targets a case names; each tile shape compiles once. Small tile
settings keep the small test models tiling; diffusers' own results are checked to differ from the untiled ones, so a
port that ignored tiling would fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from converter.models.common.protocol import encoded
from tests.helpers import (
    compiled_steps,
    converted_by_cli,
    family_cases,
    family_params,
    first_family_only,
    runner,
    small,
)

ATOL = 1e-4


# each family's tiling cases (models/<family>/testing.py)
CASES = family_cases(lambda testing: testing.tiling)


@pytest.fixture(scope="module", params=family_params(CASES, first_family_only))
def converted(request, tmp_path_factory):
    family, which, case = CASES[request.param]
    name, config = small(family, which)
    reference, models = converted_by_cli(name, config, tmp_path_factory.mktemp(request.param), case.targets)
    for model in models.values():
        model.enable_tiling(**case.tiling)
    return family, case, reference, models


def _diffusers(reference, tiling: dict | None, run):
    if tiling is None:
        reference.disable_tiling()
    else:
        reference.enable_tiling(**tiling)
    with torch.no_grad():
        return run(reference)


def _latent(family, case, reference, seed=0):
    channels = family.validation_latent_shape(family.config_class.from_dict(dict(reference.config)))[1]
    return torch.randn(1, channels, *case.latent, generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow
def test_tiled_decode_matches_diffusers_and_compiles_each_tile_shape_once(converted):
    family, case, reference, models = converted
    z = _latent(family, case, reference)
    expected = _diffusers(reference, case.tiling, lambda vae: vae.decode(z).sample.numpy())
    untiled = _diffusers(reference, None, lambda vae: vae.decode(z).sample.numpy())
    assert expected.shape == untiled.shape
    assert np.abs(expected - untiled).max() > 100 * ATOL  # the seams are blended: tiling changes the result
    windows = models["flax"].tile_plan("decoder").window_shapes(*case.latent[-2:])
    shapes = set(windows)
    assert len(windows) >= 4 and len(shapes) == case.tile_shapes  # e.g. inner tiles, last column, last row, corner
    for target, model in models.items():
        compiled_before = compiled_steps()
        got = runner(target, model).decode(z.numpy())
        assert got.shape == expected.shape, target
        assert np.abs(got - expected).max() <= ATOL, (target, np.abs(got - expected).max())
        if target == "flax":
            # tiles of one size share their steps, however many tiles and frames, and none are compiled anew for
            # the next video (no other test compiles these steps: tiling settings are part of the compiled model)
            assert compiled_steps() - compiled_before == case.decode_steps * len(shapes)
            runner(target, model).decode(z.numpy() + 1)
            assert compiled_steps() - compiled_before == case.decode_steps * len(shapes)


def test_tiled_encode_matches_diffusers(converted):
    family, case, reference, models = converted
    channels = family.validation_sample_shape(family.config_class.from_dict(dict(reference.config)))[1]
    x = torch.rand(1, channels, *case.video, generator=torch.Generator().manual_seed(1)) * 2 - 1

    def encode(vae):
        return [a.numpy() for a in encoded(vae.encode(x))]

    expected = _diffusers(reference, case.tiling, encode)
    untiled = _diffusers(reference, None, encode)
    assert np.abs(expected[0] - untiled[0]).max() > 100 * ATOL
    for target, model in models.items():
        for got, want in zip(runner(target, model).encode(x.numpy()), expected):
            assert got.shape == want.shape, target
            assert np.abs(got - want).max() <= ATOL, (target, np.abs(got - want).max())
