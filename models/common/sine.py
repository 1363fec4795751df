"""sin at the CPU's vector rate, for Snake's sin² (the vocoders', MiniMax-H3's audio VAE's), in the Flax models and
the torchax lowerings alike.

XLA:CPU computes sin one element at a time (about 4 ns an element on a 2-core EPYC, 16x its exp), which made
Snake most of an anti-aliased activation's time (docs/performance.md, Design decisions). Here x is reduced by
multiples of π, π held in three parts (Cody and Waite) so that k·π's first two are exact for |k| < 2^13, then sin's
Taylor polynomial to x^11 on [-π/2, π/2] (truncation below 6e-8), its sign bit flipped where k is odd: elementwise
arithmetic that XLA vectorises (with a floor for k's parity it ran 9x slower). Within a few float32
ulps of sin for |x| < 2.5e4, far beyond what Snake's αx reaches; computed in float32 and rounded once, as PyTorch
computes sin on a low-precision tensor. Other backends keep XLA's sin."""

from __future__ import annotations

import jax
import jax.numpy as jnp

PI_PARTS = (3.140625, 9.67502593994140625e-4, 1.509957990978376432e-7)  # sum: π; the first two in 8 and 11 bits
# 1/3!, 1/5!, ... 1/11!, alternating, innermost last
TAYLOR = (-1 / 6, 1 / 120, -1 / 5040, 1 / 362880, -1 / 39916800)


def sin(x):
    if jax.default_backend() != "cpu":
        return jnp.sin(x)
    y = x.astype(jnp.float32)
    k = jnp.round(y * (1 / jnp.pi))
    r = y
    for part in PI_PARTS:
        r = r - k * part
    r2 = r * r
    p = TAYLOR[-1]
    for c in TAYLOR[-2::-1]:
        p = c + r2 * p
    s = r + r * r2 * p
    # sin(r + kπ) = (-1)^k sin(r): k's lowest bit into the sign bit
    sign = jax.lax.shift_left(k.astype(jnp.int32), 31)
    return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(s, jnp.int32) ^ sign, jnp.float32).astype(x.dtype)
