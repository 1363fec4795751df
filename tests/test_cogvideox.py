"""CogVideoX's own cases beyond the generic tests (which take its small configs, tiling and mesh cases and the SAT file
from models/cogvideox/testing.py).

CogVideoX's decoder modulates each of its normalisations by two 1x1x1 convs of the latent resized to the activation
(SpatialNorm3D). The convs act on each pixel alone, so the models apply them before the resize, at the latent's
size: XLA:CPU's scheduler makes what depends only on the latent at the top of a step, and made at the activation's
size, every norm's two conv outputs were alive at once."""

import jax
import numpy as np
import torch
from flax import nnx

import converter
from converter.models.cogvideox.modeling_flax import CogVideoXSpatialNorm3D
from converter.registry import FAMILIES
from tests.helpers import run_cli, runner, save_diffusers

ATOL = 1e-4

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


def test_cogvideox_one_latent_frame_is_one_frame_and_unclipped(tmp_path):
    """diffusers decodes 1 latent frame into 1 frame and does not clip CogVideoX's output; neither do we."""
    cogvideox = FAMILIES["cogvideox"]
    reference = save_diffusers(cogvideox, tmp_path / "vae", cogvideox.testing().small_configs["default-arch"])
    run_cli("cogvideox-2b", "--source", tmp_path / "vae", "--to", "flax", "--out", tmp_path / "out", "--no-validate")
    z = torch.randn(1, 4, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference.decode(z).sample.numpy()
    got = runner("flax", converter.load(tmp_path / "out")).decode(z.numpy())
    assert got.shape[2] == expected.shape[2] == 1
    assert np.abs(expected).max() > 1.0  # random weights give values outside [-1, 1] ...
    assert np.abs(got - expected).max() <= ATOL  # ... and they come back unclipped
