"""The attention every mid block uses (models/common/attention.py): Wan's over the pixels of a frame, HunyuanVideo's
over a clip with frame-causal visibility. Blocked, it equals the dense formula and never holds a score matrix; on a
CUDA GPU it runs cuDNN's fused kernel where JAX takes the inputs to it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from converter.models.common import attention as attention_module
from converter.models.common.attention import blocked_attention


def _dense(q, k, v, frames):
    n = q.shape[1]
    frame = np.repeat(np.arange(frames), n // frames)
    scores = np.einsum("bqc,bkc->bqk", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(frame[None, None, :] <= frame[None, :, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bqk,bkc->bqc", weights / weights.sum(-1, keepdims=True), v)


# (frames, tokens a frame, block): one frame (Wan's) of fewer tokens than a block, of a few blocks with a partial
# last one, of an exact multiple, of blocks evened out to fewer tokens than `block`; clips (HunyuanVideo's) whose
# frames straddle blocks
@pytest.mark.parametrize(
    ("frames", "tokens", "block"), [(1, 5, 64), (1, 77, 16), (1, 96, 32), (1, 90, 32), (3, 20, 16), (4, 9, 8)]
)
def test_blocked_attention_equals_the_dense_one(frames, tokens, block):
    rng = np.random.default_rng(frames * tokens)
    q, k, v = (rng.standard_normal((2, frames * tokens, 8)).astype(np.float32) for _ in range(3))
    got = np.asarray(blocked_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), frames, block))
    assert np.abs(got - _dense(q, k, v, frames)).max() < 1e-5


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_bfloat16_attention_computes_its_products_as_the_backend_rounds_them(backend, monkeypatch):
    """bfloat16 queries, keys and values (a clip of frames, blocks with a partial last one): on a CPU both products
    in float32; elsewhere from bfloat16 operands accumulated in float32, the probabilities rounded to bfloat16 for
    their product with the values, as flash attention and diffusers' bfloat16 attention on a GPU compute them. Either
    way within bfloat16's rounding of the dense float32 result."""
    import re

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    jax.clear_caches()  # a trace for the other backend is not this one's
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 3 * 30, 16)), jnp.bfloat16) for _ in range(3))
    attend = jax.jit(blocked_attention, static_argnums=(3, 4))
    program = attend.lower(q, k, v, 3, 32).as_text()
    products = re.findall(
        r"stablehlo.dot_general .*: \(tensor<[\dx]*(\w+)>, tensor<[\dx]*(\w+)>\) -> tensor<[\dx]*(\w+)>", program
    )
    operands = "f32" if backend == "cpu" else "bf16"
    assert len(products) == 2 and all(p == (operands, operands, "f32") for p in products), products
    got = np.asarray(attend(q, k, v, 3, 32), np.float32)
    expected = _dense(*(np.asarray(x, np.float32) for x in (q, k, v)), 3)
    assert np.abs(got - expected).max() <= 2**-7 * np.abs(expected).max()


@pytest.mark.parametrize(
    ("once", "twice"), [((1, 96, 96), (1, 192, 96)), ((5, 32, 32), (10, 32, 32))], ids=["a-frame", "a-clip"]
)
def test_attention_never_holds_the_whole_score_matrix(once, twice):
    """XLA's memory analysis of the compiled attention, 384 channels (Wan's mid block), over N and 2N tokens given
    as (frames, height, width): the temporaries (the blocked copies of q, k, v and the output, and one block's
    scores) stay under half of one float32 score matrix and grow linearly with the tokens, where a dense one grows
    4x."""

    def temporaries(frames, height, width):
        spec = jax.ShapeDtypeStruct((1, frames * height * width, 384), jnp.float32)
        attention = jax.jit(lambda q, k, v: blocked_attention(q, k, v, frames))
        return attention.lower(spec, spec, spec).compile().memory_analysis().temp_size_in_bytes

    n = np.prod(once)
    assert temporaries(*once) < n * n * 4 / 2
    assert temporaries(*twice) < 2.5 * temporaries(*once)


def test_a_cuda_gpu_runs_unmasked_attention_by_the_fused_kernel_and_the_rest_blocked(monkeypatch):
    """The backend a GPU, jax.nn.dot_product_attention stood in for by its XLA form that refuses float32 as cuDNN's
    does: bfloat16 attention with no mask takes the fused route, in its layout (the batch as cuDNN's batch, one head);
    float32 is refused and runs blocked; frame-causal attention never asks it. Each equals the dense result."""
    asked = []

    def dot_product_attention(q, k, v, implementation):
        asked.append((q.dtype, implementation))
        if q.dtype == jnp.float32:
            raise NotImplementedError("Q must be fp16/bf16/fp8_e4m3fn/fp8_e5m2")
        return real(q, k, v, implementation="xla")

    real = jax.nn.dot_product_attention
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax.nn, "dot_product_attention", dot_product_attention)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((3, 2 * 40, 16)).astype(np.float32) for _ in range(3))
    for dtype, frames, route in [(jnp.bfloat16, 1, "cudnn"), (jnp.float32, 1, "cudnn"), (jnp.bfloat16, 2, None)]:
        asked.clear()
        got = attention_module.attention(*(jnp.asarray(x, dtype) for x in (q, k, v)), frames)
        assert [a for _, a in asked] == ([route] if route else [])
        expected = _dense(*(np.asarray(jnp.asarray(x, dtype), np.float32) for x in (q, k, v)), frames)
        assert np.abs(np.asarray(got, np.float32) - expected).max() <= 2**-7 * np.abs(expected).max()


def _torchax_frame_causal(frames):
    """The PyTorch models' frame-causal attention op as the torchax runtime runs it: a JAX function of (B, N, C)."""
    from converter.models.common.layers_torch import frame_causal_attention
    from converter.torchax_runtime import torchax_env

    env = torchax_env()  # imports torchax the way this torch needs
    from torchax import interop

    def attention(q, k, v):
        with env:
            out = frame_causal_attention(*(interop.torch_view(x) for x in (q, k, v)), frames)
            return interop.jax_view(out)

    return attention


@pytest.mark.parametrize(("frames", "tokens"), [(2, 5), (3, 700), (5, 300)])
def test_the_pytorch_frame_causal_attention_equals_the_dense_one_in_pytorch_and_under_torchax(frames, tokens):
    """HunyuanVideo's clip attention in the PyTorch models: in plain PyTorch (the reference) and lowered by the
    torchax runtime, at token counts of one block, several with a partial last one, and frames straddling blocks."""
    import torch

    from converter.models.common.layers_torch import frame_causal_attention

    rng = np.random.default_rng(frames * tokens)
    q, k, v = (rng.standard_normal((1, frames * tokens, 8)).astype(np.float32) for _ in range(3))
    expected = _dense(q, k, v, frames)
    plain = frame_causal_attention(*(torch.from_numpy(x) for x in (q, k, v)), frames).numpy()
    lowered = np.asarray(jax.jit(_torchax_frame_causal(frames))(q, k, v))
    assert np.abs(plain - expected).max() < 1e-5 and np.abs(lowered - expected).max() < 1e-5


def test_the_torchax_frame_causal_attention_never_holds_the_whole_score_matrix():
    """Under torchax, as in Flax: 5 and 10 frames of 1024 tokens, the compiled temporaries under half a float32 score
    matrix and growing linearly (a dense mask alone would be N x N)."""

    def temporaries(frames):
        spec = jax.ShapeDtypeStruct((1, frames * 1024, 64), jnp.float32)
        compiled = jax.jit(_torchax_frame_causal(frames)).lower(spec, spec, spec).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    n = 5 * 1024
    assert temporaries(5) < n * n * 4 / 2
    assert temporaries(10) < 2.5 * temporaries(5)
