"""models/common/sine.py's sin (Snake's, in the Flax models and under torchax): within a few float32 ulps of sin
wherever Snake's argument can be, rounded once in a low precision as PyTorch rounds it, and computed by elementwise
arithmetic (XLA:CPU's own sin runs one element at a time)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from converter.models.common.sine import sin


def _primitives(fn, *args) -> set[str]:
    return {e.primitive.name for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns}


@pytest.mark.parametrize("bound", [1.0, 100.0, 2.5e4])
def test_sin_is_within_a_few_ulps_of_sin(bound):
    x = np.random.default_rng(0).uniform(-bound, bound, 100_000).astype(np.float32)
    x[:3] = (0.0, np.float32(np.pi), -np.float32(np.pi / 2))
    got = np.asarray(jax.jit(sin)(jnp.asarray(x)), np.float64)
    assert np.abs(got - np.sin(x.astype(np.float64))).max() <= 2e-7
    assert "sin" not in _primitives(sin, x)


def test_a_low_precision_sin_is_rounded_once_as_pytorch_s():
    x = torch.linspace(-20, 20, 4001, dtype=torch.bfloat16)
    got = sin(jnp.asarray(x.float().numpy()).astype(jnp.bfloat16))
    assert got.dtype == jnp.bfloat16
    # one bfloat16 step at most, where the float32 results either side of a rounding boundary differ by an ulp
    assert np.abs(np.asarray(got, np.float32) - torch.sin(x).float().numpy()).max() <= 2**-8


def test_torchax_lowers_pytorch_s_sin_to_it():
    from converter.torchax_runtime import torchax_env

    env = torchax_env()
    from torchax import interop

    def run(x):
        with env:
            return torch.sin(interop.torch_view(x)).jax()

    x = jnp.asarray(np.random.default_rng(1).uniform(-50, 50, (2, 8, 300)).astype(np.float32))
    assert np.array_equal(np.asarray(jax.jit(run)(x)), np.asarray(jax.jit(sin)(x)))
    assert "sin" not in _primitives(run, x)
