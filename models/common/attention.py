"""Single-head attention computed in blocks of queries and keys with a running max and sum (flash attention's
recurrence), in float32: memory O(block^2) whatever the token count, where the N x N score matrix of a mid block
(every pixel of a frame, or of a clip) would take gigabytes at the sizes users decode."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

ATTENTION_BLOCK = 1024  # tokens per query and key block


def blocked_attention(q, k, v, frames: int = 1, block: int = ATTENTION_BLOCK):
    """softmax(q k^T / sqrt(C)) v of (B, N, C) tokens. With `frames` > 1, the tokens are `frames` frames in order and
    a token sees those of its own and earlier frames (diffusers' prepare_causal_attention_mask, built from frame
    indices). The first key block holds first-frame tokens, which every query sees, so no row is ever all masked."""
    b, n, c = q.shape
    block = min(block, n)  # fewer tokens than a block: one block of them, unpadded
    frame = jnp.repeat(jnp.arange(frames, dtype=jnp.int32), n // frames)
    blocks = -(-n // block)
    pad = blocks * block - n
    # padded keys belong to no frame a query sees; padded queries (dropped at the end) see every frame
    frame_q = jnp.pad(frame, (0, pad), constant_values=frames - 1).reshape(blocks, block)
    frame_k = jnp.pad(frame, (0, pad), constant_values=frames).reshape(blocks, block)

    def blocked(x):  # (B, N, C) -> (blocks, B, block, C) in float32
        return jnp.pad(x.astype(jnp.float32), ((0, 0), (0, pad), (0, 0))).reshape(b, blocks, block, c).swapaxes(0, 1)

    scale = 1.0 / math.sqrt(c)

    def query_block(args):
        qi, fq = args

        def key_block(carry, kv):
            m, total, acc = carry
            kj, vj, fk = kv
            s = jnp.einsum("bqc,bkc->bqk", qi, kj) * scale
            s = jnp.where(fk[None, None, :] <= fq[None, :, None], s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(axis=-1))
            p = jnp.exp(s - m_new[..., None])
            correction = jnp.exp(m - m_new)
            acc = acc * correction[..., None] + jnp.einsum("bqk,bkc->bqc", p, vj)
            return (m_new, total * correction + p.sum(axis=-1), acc), None

        start = (jnp.full((b, block), -jnp.inf), jnp.zeros((b, block)), jnp.zeros((b, block, c)))
        (_, total, acc), _ = jax.lax.scan(key_block, start, (blocked(k), blocked(v), frame_k))
        return acc / total[..., None]

    out = jax.lax.map(query_block, (blocked(q), frame_q))  # (blocks, B, block, C)
    return out.swapaxes(0, 1).reshape(b, blocks * block, c)[:, :n].astype(q.dtype)
