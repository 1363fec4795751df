"""Wan 2.1: checkpoints saved by diffusers, converted through the CLI, loaded with `converter.load`, must encode and
decode like diffusers' AutoencoderKLWan (fp32 max abs difference <= 1e-4) at several frame counts: the causal frame
cache is where ports go wrong, and a one-frame check would not see it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import converter
from converter import torchax_runtime
from tests.conftest import run_cli

ATOL = 1e-4
TO_LAST, TO_FIRST = (0, 2, 3, 4, 1), (0, 4, 1, 2, 3)


@pytest.fixture(scope="module", params=["default-arch", "other-config"])
def converted(request, tmp_path_factory, wan_small, wan_other):
    source, reference = wan_small if request.param == "default-arch" else wan_other
    out = tmp_path_factory.mktemp(f"converted-{request.param}")
    run_cli("wan2.1", "--source", source, "--to", "flax", "--out", out / "flax")
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", out / "torchax")
    flax_model = converter.load(out / "flax")
    torchax_model = torchax_runtime.compile_model(converter.load(out / "torchax"))
    return reference, flax_model, torchax_model


def _flax_decode(model, z):
    return np.asarray(model.decode(z.numpy().transpose(TO_LAST))).transpose(TO_FIRST)


def _flax_encode(model, x):
    mean, logvar = model.encode(x.numpy().transpose(TO_LAST))
    return np.asarray(mean).transpose(TO_FIRST), np.asarray(logvar).transpose(TO_FIRST)


def _torchax_decode(model, z):
    with torch.no_grad(), model.torchax_env:
        return torchax_runtime.to_numpy(model.decode(torchax_runtime.to_jax_tensor(model, z.numpy())).sample)


def _torchax_encode(model, x):
    with torch.no_grad(), model.torchax_env:
        dist = model.encode(torchax_runtime.to_jax_tensor(model, x.numpy())).latent_dist
        return torchax_runtime.to_numpy(dist.mean), torchax_runtime.to_numpy(dist.logvar)


@pytest.mark.parametrize("latent_frames", [1, 2, 5])
def test_decode_matches_diffusers(converted, latent_frames):
    reference, flax_model, torchax_model = converted
    z_dim = reference.config.z_dim
    z = torch.randn(1, z_dim, latent_frames, 4, 4, generator=torch.Generator().manual_seed(latent_frames))
    with torch.no_grad():
        expected = reference.decode(z).sample.numpy()
    # Random weights must not push the output into the [-1, 1] clamp, or the comparison would prove nothing.
    assert (np.abs(expected) < 0.99).mean() > 0.9
    for name, got in (("flax", _flax_decode(flax_model, z)), ("torchax", _torchax_decode(torchax_model, z))):
        assert got.shape == expected.shape, name
        assert np.abs(got - expected).max() <= ATOL, (name, np.abs(got - expected).max())


@pytest.mark.parametrize("video_frames", [1, 5, 9])
def test_encode_matches_diffusers(converted, video_frames):
    reference, flax_model, torchax_model = converted
    x = torch.rand(1, 3, video_frames, 16, 16, generator=torch.Generator().manual_seed(video_frames)) * 2 - 1
    with torch.no_grad():
        dist = reference.encode(x).latent_dist
        expected = (dist.mean.numpy(), dist.logvar.numpy())
    for name, got in (("flax", _flax_encode(flax_model, x)), ("torchax", _torchax_encode(torchax_model, x))):
        for g, e in zip(got, expected):
            assert g.shape == e.shape, name
            assert np.abs(g - e).max() <= ATOL, (name, np.abs(g - e).max())


def test_torchax_jitted_matches_plain_pytorch(wan_small, tmp_path):
    """The torchax model, each step jitted under torchax, against the same model in plain PyTorch."""
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = converter.load(tmp_path / "out").decode(z).sample.numpy()
    compiled = torchax_runtime.compile_model(converter.load(tmp_path / "out"))
    got = _torchax_decode(compiled, z)
    assert np.abs(got - expected).max() <= ATOL
