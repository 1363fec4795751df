"""CogVideoX's decoder modulates each of its normalisations by two 1x1x1 convs of the latent resized to the activation
(SpatialNorm3D). The convs act on each pixel alone, so the models apply them before the resize, at the latent's
size: XLA:CPU's scheduler makes what depends only on the latent at the top of a step, and made at the activation's
size, every norm's two conv outputs were alive at once. Parity with diffusers is test_parity.py's."""

import jax
import numpy as np
from flax import nnx

from converter.models.cogvideox.modeling_flax import CogVideoXSpatialNorm3D

NORMS = 6


def test_spatial_norms_hold_no_activation_sized_conv_outputs():
    channels, latent_channels = 64, 16
    f = jax.ShapeDtypeStruct((1, 9, 32, 32, channels), np.float32)  # an odd frame count: the first frame apart
    zq = jax.ShapeDtypeStruct((1, 3, 4, 4, latent_channels), np.float32)
    graphdef, state = nnx.split(
        nnx.eval_shape(
            lambda: nnx.List(
                CogVideoXSpatialNorm3D(channels, latent_channels, 8, rngs=nnx.Rngs(0), param_dtype=np.float32)
                for _ in range(NORMS)
            )
        )
    )

    def chain(state, f, zq):  # as the decoder's resnets use them: each norm's output is the next one's input
        for norm in nnx.merge(graphdef, state):
            f = nnx.silu(norm(f, zq))
        return f

    compiled = jax.jit(chain).lower(state, f, zq).compile()
    activation = np.prod(f.shape) * 4  # bytes
    assert compiled.memory_analysis().temp_size_in_bytes < NORMS * activation / 2
