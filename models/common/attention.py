"""Single-head attention computed in blocks of queries and keys with a running max and sum (flash attention's
recurrence), its softmax in float32: memory O(block^2) whatever the token count, where the N x N score matrix of a
mid block (every pixel of a frame, or of a clip) would take gigabytes at the sizes users decode. On a CUDA GPU,
cuDNN's fused kernel where it takes the inputs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .sharding import traced_mesh


def attention_block() -> int:
    """Tokens per query and key block at most (the blocks of a count as even as it allows: Wan 2.1's 14,400 tokens a
    720p frame are 2 blocks of 7,200 on an accelerator, not 2 of 8,192 that are 12% padding): 1024 on a CPU; 8192 on
    an accelerator, where each pair of blocks is a handful of kernels run one after another and a block's float32
    scores, 256 MB, are small against its memory. Flax's Flux.2 decode at 1024x1024 compiled for an H200 (by
    bench/program.py): 3,367 kernels with blocks of 1024, 590 with 4096, 438 with 8192, 376 with 16,384 (1 GB of
    scores a block)."""
    return 1024 if jax.default_backend() == "cpu" else 8192


def blocked_attention(q, k, v, frames: int = 1, block: int | None = None):
    """softmax(q k^T / sqrt(C)) v of (B, N, C) queries and (B, M, C) keys and values. With `frames` > 1 (then M = N,
    self-attention), the tokens are `frames` frames in order and a token sees those of its own and earlier frames
    (diffusers' prepare_causal_attention_mask, built from frame indices). The first key block holds first-frame
    tokens, which every query sees, so no row is ever all masked."""
    b, n, c = q.shape
    block = block or attention_block()

    def frames_in_blocks(count, padding_frame):  # (blocks, size) frame indices of `count` tokens, padded
        blocks = -(-count // block)
        size = -(-count // blocks)  # as even as the count allows: padding only the remainder, under one a block
        frame = jnp.repeat(jnp.arange(frames, dtype=jnp.int32), count // frames)
        return jnp.pad(frame, (0, blocks * size - count), constant_values=padding_frame).reshape(blocks, size)

    # padded keys belong to no frame a query sees; padded queries (dropped at the end) see every frame
    frame_q, frame_k = frames_in_blocks(n, frames - 1), frames_in_blocks(k.shape[1], frames)

    # the products' operands: float32 on a CPU, whose bfloat16 products compute in float32 anyway; elsewhere the
    # inputs' dtype, accumulated in float32, the probabilities rounded to it for their product with the values, as
    # flash attention (diffusers' bfloat16 attention on a GPU) computes them: the tensor cores' bfloat16 rate where
    # float32 operands took TF32's, and half the bytes
    operands = jnp.float32 if jax.default_backend() == "cpu" else jnp.result_type(q, k, v)

    def blocked(x, frame):  # (B, N, C) -> (blocks, B, block, C) in the operands' dtype
        blocks, size = frame.shape
        x = jnp.pad(x.astype(operands), ((0, 0), (0, blocks * size - x.shape[1]), (0, 0)))
        return x.reshape(b, blocks, size, c).swapaxes(0, 1)

    scale = 1.0 / math.sqrt(c)

    def query_block(args):
        qi, fq = args

        def key_block(carry, kv):
            m, total, acc = carry
            kj, vj, fk = kv
            s = jnp.einsum("bqc,bkc->bqk", qi, kj, preferred_element_type=jnp.float32) * scale
            s = jnp.where(fk[None, None, :] <= fq[None, :, None], s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(axis=-1))
            p = jnp.exp(s - m_new[..., None])
            correction = jnp.exp(m - m_new)
            product = jnp.einsum("bqk,bkc->bqc", p.astype(operands), vj, preferred_element_type=jnp.float32)
            acc = acc * correction[..., None] + product
            return (m_new, total * correction + p.sum(axis=-1), acc), None

        size = fq.shape[0]
        start = (jnp.full((b, size), -jnp.inf), jnp.zeros((b, size)), jnp.zeros((b, size, c)))
        (_, total, acc), _ = jax.lax.scan(key_block, start, (blocked(k, frame_k), blocked(v, frame_k), frame_k))
        return acc / total[..., None]

    out = jax.lax.map(query_block, (blocked(q, frame_q), frame_q))  # (blocks, B, block, C)
    return out.swapaxes(0, 1).reshape(b, -1, c)[:, :n].astype(q.dtype)


def attention(q, k, v, frames: int = 1):
    """softmax(q k^T / sqrt(C)) v of (B, N, C) queries and (B, M, C) keys and values, frame-causal with `frames` > 1
    (blocked_attention). On a CUDA GPU, attention with no mask in bfloat16 or float16 runs cuDNN's fused flash
    attention, which keeps each block's scores on chip: blocked in XLA, each block pair writes its float32 scores
    out and reads them back (MiniMax-H3's decode at 1344x768 compiled for an H200 moves 108,594 GB so, 2,677 GB
    fused). Where cuDNN's kernel does not take the inputs (float32, a head of over 128 or 256 channels, no cuDNN),
    JAX refuses it while tracing and the blocked form runs."""
    if frames == 1 and jax.default_backend() == "gpu":
        try:  # (B, N, 1, C): the batch as cuDNN's batch, one head
            out = jax.nn.dot_product_attention(q[:, :, None], k[:, :, None], v[:, :, None], implementation="cudnn")
            return out[:, :, 0]
        except (NotImplementedError, RuntimeError):
            pass
    return blocked_attention(q, k, v, frames)


def query_split_attention(q, k, v):
    """attention of (B, N, C) tokens where each device of the mesh ("dp", "tp") of the step being traced takes
    its batch share (over "dp") and its share of the query tokens (over "tp", N padded to split evenly) against every
    key and value; without a mesh, attention itself. A device holds 1/tp of the queries, outputs and running
    sums, and the whole keys and values."""
    mesh = traced_mesh()
    if mesh is None:
        return attention(q, k, v)
    n = q.shape[1]
    queries = jnp.pad(q, ((0, 0), (0, -n % mesh.shape["tp"]), (0, 0)))
    split, whole = P("dp", "tp", None), P("dp", None, None)
    # check_vma off: the running sums start as constants, the same on every device, and vary once queries meet them
    attend = jax.shard_map(attention, mesh=mesh, in_specs=(split, whole, whole), out_specs=split, check_vma=False)
    return attend(queries, k, v)[:, :n]
