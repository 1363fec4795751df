"""Checkpoints saved by diffusers, converted through the CLI, loaded with `converter.load`, must encode and decode
like diffusers (fp32 max abs difference <= 1e-4) at several frame counts, with both targets: the Flax model
(jitted) and the torchax model (jitted under torchax). The causal frame cache and frame batching are where ports go
wrong; one-frame checks would not see it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import converter
from converter.validate import RUNNERS
from tests.conftest import COG_OTHER, COG_SMALL, WAN_OTHER, WAN_SMALL, converted_by_cli, run_cli, save_diffusers

ATOL = 1e-4


@dataclasses.dataclass(frozen=True)
class Case:
    model: str  # registry name
    diffusers_class: str
    config: dict
    latent_frames: tuple[int, ...]
    video_frames: tuple[int, ...]
    latent_size: int = 4
    video_size: int = 16


CASES = {
    "wan2.1-default-arch": Case("wan2.1", "AutoencoderKLWan", WAN_SMALL, (1, 2, 5), (1, 5, 9)),
    "wan2.1-other-config": Case("wan2.1", "AutoencoderKLWan", WAN_OTHER, (1, 2, 5), (1, 5, 9)),
    # 1..4 and 13 latent frames: odd and even counts, the remainder folded into the first batch of 2
    "cogvideox-default-arch": Case("cogvideox-2b", "AutoencoderKLCogVideoX", COG_SMALL, (1, 2, 3, 4, 13),
                                   (1, 5, 9, 17)),
    "cogvideox-other-config": Case("cogvideox-5b", "AutoencoderKLCogVideoX", COG_OTHER, (1, 2, 3, 4, 13),
                                   (1, 5, 9, 17)),
}


@pytest.fixture(scope="module", params=list(CASES))
def converted(request, tmp_path_factory):
    case = CASES[request.param]
    reference, models = converted_by_cli(case.model, case.diffusers_class, case.config,
                                         tmp_path_factory.mktemp(request.param))
    return case, reference, {target: RUNNERS[target](model) for target, model in models.items()}


def _latent_channels(reference):
    return reference.config.get("z_dim") or reference.config.latent_channels


def test_decode_matches_diffusers(converted):
    case, reference, runners = converted
    for frames in case.latent_frames:
        z = torch.randn(1, _latent_channels(reference), frames, case.latent_size, case.latent_size,
                        generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            expected = reference.decode(z).sample.numpy()
        if case.diffusers_class == "AutoencoderKLWan":
            # the output must not sit in Wan's [-1, 1] clamp, or the comparison would prove nothing
            assert (np.abs(expected) < 0.99).mean() > 0.9
        for target, runner in runners.items():
            got = runner.decode(z.numpy())
            assert got.shape == expected.shape, (target, frames)
            assert np.abs(got - expected).max() <= ATOL, (target, frames, np.abs(got - expected).max())


def test_encode_matches_diffusers(converted):
    case, reference, runners = converted
    for frames in case.video_frames:
        x = torch.rand(1, 3, frames, case.video_size, case.video_size,
                       generator=torch.Generator().manual_seed(frames)) * 2 - 1
        with torch.no_grad():
            dist = reference.encode(x).latent_dist
        for target, runner in runners.items():
            for got, expected in zip(runner.encode(x.numpy()), (dist.mean.numpy(), dist.logvar.numpy())):
                assert got.shape == expected.shape, (target, frames)
                assert np.abs(got - expected).max() <= ATOL, (target, frames, np.abs(got - expected).max())


def test_cogvideox_one_latent_frame_is_one_frame_and_unclipped(tmp_path):
    """diffusers decodes 1 latent frame into 1 frame and does not clip CogVideoX's output; neither do we."""
    reference = save_diffusers("AutoencoderKLCogVideoX", tmp_path / "vae", COG_SMALL)
    run_cli("cogvideox-2b", "--source", tmp_path / "vae", "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    z = torch.randn(1, 4, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference.decode(z).sample.numpy()
    got = RUNNERS["flax"](converter.load(tmp_path / "out")).decode(z.numpy())
    assert got.shape[2] == expected.shape[2] == 1
    assert np.abs(expected).max() > 1.0  # random weights give values outside [-1, 1] ...
    assert np.abs(got - expected).max() <= ATOL  # ... and they come back unclipped


def test_torchax_jitted_matches_plain_pytorch(wan_small, tmp_path):
    """The torchax model, each step jitted under torchax, against the same model in plain PyTorch."""
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = converter.load(tmp_path / "out").decode(z).sample.numpy()
    got = RUNNERS["torchax"](converter.load(tmp_path / "out")).decode(z.numpy())
    assert np.abs(got - expected).max() <= ATOL
