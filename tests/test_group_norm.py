"""The torchax runtime's GroupNorm lowering (one JAX function, channels-last, statistics in float32), on CogVideoX's
GroupNorm jitted under torchax. In float32 it matches PyTorch's GroupNorm; with bfloat16 inputs and weights it stays
within 1e-2 relative of the float32 result."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from converter import torchax_runtime
from converter.models.cogvideox.modeling_torch import GroupNorm


def _jitted_under_torchax(module: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    env = torchax_runtime.torchax_env()
    from torchax import interop

    with env:
        module = module.to("jax")
        params = dict(module.named_parameters())
        step = interop.jax_jit(lambda p, inp: torch.func.functional_call(module, p, (inp,)))
        return np.asarray(step(params, x.to("jax")).float().jax())


@pytest.fixture
def norm_and_input():
    generator = torch.Generator().manual_seed(0)
    norm = GroupNorm(8, 64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(64, generator=generator))
        norm.bias.copy_(0.3 * torch.randn(64, generator=generator))
    # A mean far from zero next to a small spread: a one-pass variance (E[x^2] - E[x]^2) computed in bfloat16 loses
    # every digit here; computed in float32 it does not.
    x = 0.5 * torch.randn(2, 64, 3, 8, 8, generator=generator) + 8
    return norm, x


def _reference(norm, x):
    """PyTorch's GroupNorm in float32 (on the same, possibly rounded, inputs and weights)."""
    return F.group_norm(x.float(), 8, norm.weight.float(), norm.bias.float(), 1e-6).detach().numpy()


def test_float32_matches_pytorch(norm_and_input):
    norm, x = norm_and_input
    expected = _reference(norm, x)
    got = _jitted_under_torchax(norm, x)
    assert np.abs(got - expected).max() <= 1e-4


def test_bfloat16_within_one_percent_of_float32(norm_and_input):
    norm, x = norm_and_input
    norm, x = norm.to(torch.bfloat16), x.to(torch.bfloat16)
    expected = _reference(norm, x)
    got = _jitted_under_torchax(norm, x)
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-2


def test_the_accelerators_reduction_matches_the_cpus_product(norm_and_input, monkeypatch):
    """Other backends sum the groups with a reduction, the CPU with a product (models/common/group_norm.py): both give
    PyTorch's GroupNorm, here each on this CPU, on a video and on an image."""
    import jax

    from converter.models.common.group_norm import group_norm

    norm, x = norm_and_input
    scale, bias = (jax.numpy.asarray(p.detach().numpy()) for p in (norm.weight, norm.bias))
    for sample in (x, x[:, :, 0]):  # (B, C, T, H, W) and (B, C, H, W)
        expected = np.moveaxis(_reference(norm, sample), 1, -1)
        channels_last = jax.numpy.asarray(np.moveaxis(sample.numpy(), 1, -1))
        by_product = group_norm(channels_last, 8, 1e-6, scale, bias)[0]
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        by_reduction = group_norm(channels_last, 8, 1e-6, scale, bias)[0]
        monkeypatch.undo()
        assert np.abs(np.asarray(by_product) - expected).max() <= 1e-4
        assert np.abs(np.asarray(by_reduction) - expected).max() <= 1e-4


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_statistics_keep_a_small_spread_far_from_zero(backend, monkeypatch):
    """Each backend's statistics (two passes on a CPU, one elsewhere) against float64 ones, on a float32 video whose
    groups spread by 0.01 around 300-320: a variance taken as E[x^2] - E[x]^2 of the raw values would have no digit
    left."""
    import jax

    from converter.models.common.group_norm import group_norm

    rng = np.random.default_rng(0)
    x = (300 + 20 * rng.random(4).repeat(4) + 0.01 * rng.standard_normal((2, 3, 8, 8, 16))).astype(np.float32)
    grouped = x.astype(np.float64).reshape(2, -1, 4, 4).transpose(0, 2, 1, 3).reshape(2, 4, -1)
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    _, mean, rstd = group_norm(jax.numpy.asarray(x), 4, 1e-12)
    np.testing.assert_allclose(np.asarray(mean), grouped.mean(-1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(rstd), 1 / np.sqrt(grouped.var(-1) + 1e-12), rtol=1e-3)
