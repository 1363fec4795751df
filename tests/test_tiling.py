"""Spatial tiling: `enable_tiling` with the same settings must give diffusers' tiled results (fp32 max abs difference
<= 1e-4), encode and decode, Flax for every family and torchax for Wan 2.2, on grids with short last rows and
columns; each tile shape compiles once. Small tile settings keep the small test models tiling; diffusers' own results
are checked to differ from the untiled ones, so a port that ignored tiling would fail."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.helpers import compiled_steps, converted_by_cli, family_of, runner

ATOL = 1e-4


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    small: str  # which of the family's small configs
    tiling: dict  # enable_tiling keywords, the same for diffusers and for us
    latent: tuple[int, int, int]  # (T, H, W)
    video: tuple[int, int, int]
    decode_steps: int  # distinct chunk steps of a tile's decode (first chunk, steady chunk)
    targets: tuple[str, ...] = ("flax",)


CASES = {
    # 4-latent tiles every 3: rows and columns of 4, 4, 1; the output cropped to 8x the input
    "wan2.1": Case(
        "wan2.1",
        "default-arch",
        dict(
            tile_sample_min_height=32,
            tile_sample_min_width=32,
            tile_sample_stride_height=24,
            tile_sample_stride_width=24,
        ),
        latent=(2, 7, 7),
        video=(1, 56, 56),
        decode_steps=2,
    ),
    # 6x5-latent tiles every 5x4 with diffusers' overlap factors (1/6, 1/5); one frame batch (the cache carried
    # within a tile and reset between tiles is the same shared code as Wan's, which has two steps a tile)
    "cogvideox": Case(
        "cogvideox-2b",
        "default-arch",
        dict(tile_sample_min_height=48, tile_sample_min_width=40),
        latent=(3, 8, 9),
        video=(9, 64, 72),
        decode_steps=1,
    ),
    # Wan 2.2 tiles the patchified video: 4-latent tiles every 3 (16x each), and encoder tiles of 64 patches every 48.
    # The 128-pixel video is 64 patches, one tile's worth, yet diffusers tiles it: the unpatchified size exceeds 64.
    "wan2.2": Case(
        "wan2.2",
        "wan2.2-layout",
        dict(
            tile_sample_min_height=64,
            tile_sample_min_width=64,
            tile_sample_stride_height=48,
            tile_sample_stride_width=48,
        ),
        latent=(2, 7, 7),
        video=(5, 128, 128),
        decode_steps=2,
        # the tiling and the plans are one piece of code for both targets (models/common/tiling.py); torchax runs
        # the case where most meets (patches, two steps a tile, the crop)
        targets=("flax", "torchax"),
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def converted(request, tmp_path_factory):
    case = CASES[request.param]
    config = family_of(case.model).small_configs[case.small]
    reference, models = converted_by_cli(case.model, config, tmp_path_factory.mktemp(request.param), case.targets)
    for model in models.values():
        model.enable_tiling(**case.tiling)
    return case, reference, models


def _diffusers(reference, tiling: dict | None, run):
    if tiling is None:
        reference.disable_tiling()
    else:
        reference.enable_tiling(**tiling)
    with torch.no_grad():
        return run(reference)


def _latent(case, reference, seed=0):
    channels = reference.config.get("z_dim") or reference.config.latent_channels
    return torch.randn(1, channels, *case.latent, generator=torch.Generator().manual_seed(seed))


def _tile_shapes(plan, height, width) -> set[tuple[int, int]]:
    return {
        (min(plan.tile[0], height - i), min(plan.tile[1], width - j))
        for i in range(0, height, plan.stride[0])
        for j in range(0, width, plan.stride[1])
    }


def test_tiled_decode_matches_diffusers_and_compiles_each_tile_shape_once(converted):
    case, reference, models = converted
    z = _latent(case, reference)
    expected = _diffusers(reference, case.tiling, lambda vae: vae.decode(z).sample.numpy())
    untiled = _diffusers(reference, None, lambda vae: vae.decode(z).sample.numpy())
    assert expected.shape == untiled.shape
    assert np.abs(expected - untiled).max() > 100 * ATOL  # the seams are blended: tiling changes the result
    shapes = _tile_shapes(models["flax"].tile_plan("decoder"), *case.latent[1:])
    assert len(shapes) == 4  # inner tiles, last column, last row, corner
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
    case, reference, models = converted
    x = torch.rand(1, 3, *case.video, generator=torch.Generator().manual_seed(1)) * 2 - 1

    def encode(vae):
        dist = vae.encode(x).latent_dist
        return dist.mean.numpy(), dist.logvar.numpy()

    expected = _diffusers(reference, case.tiling, encode)
    untiled = _diffusers(reference, None, encode)
    assert np.abs(expected[0] - untiled[0]).max() > 100 * ATOL
    for target, model in models.items():
        for got, want in zip(runner(target, model).encode(x.numpy()), expected):
            assert got.shape == want.shape, target
            assert np.abs(got - want).max() <= ATOL, (target, np.abs(got - want).max())
