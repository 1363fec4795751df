"""The LTX-Video VAE family (diffusers' `AutoencoderKLLTXVideo`: LTX-Video 0.9.0 to 0.9.8): its config,
implementations, mapping file, model names and validation shapes and inputs."""

from __future__ import annotations

import numpy as np

from ..common.spec import FamilySpec, ModelName
from .config import LTX_091_CONFIG, LTX_095_CONFIG, LTXVideoVAEConfig


def _flax_model():
    from .modeling_flax import AutoencoderKLLTXVideo

    return AutoencoderKLLTXVideo


def _torch_model():
    from .modeling_torch import AutoencoderKLLTXVideo

    return AutoencoderKLLTXVideo


def _testing():
    from .testing import TESTING

    return TESTING


DECODE_TIMESTEP = 0.05  # what LTX pipelines pass as decode_timestep by default


def _decode_inputs(config: LTXVideoVAEConfig) -> dict:
    """A timestep-conditioned decoder validates at LTX pipelines' default decode timestep; a noise-injecting one with
    the maps of seed 0 (NumPy draws, the same on both sides)."""
    inputs = {}
    if config.timestep_conditioning:
        inputs["temb"] = np.array([DECODE_TIMESTEP], np.float32)
    if config.noise_map_sizes(1, 1):
        inputs["noise"] = np.array(0)
    return inputs


LTX = FamilySpec(
    name="ltx",
    config_class=LTXVideoVAEConfig,
    flax_model=_flax_model,
    torch_model=_torch_model,
    testing=_testing,
    mapping_file="ltx.yaml",
    models=(
        ModelName("ltx-video", "Lightricks/LTX-Video"),
        ModelName("ltx-video-0.9.0", "diffusers/LTX-Video-0.9.0"),
        ModelName("ltx-video-0.9.1", "Lightricks/LTX-Video-0.9.1", config=LTX_091_CONFIG),
        ModelName("ltx-video-0.9.5", "Lightricks/LTX-Video-0.9.5", config=LTX_095_CONFIG),
        ModelName("ltx-video-0.9.7", "Lightricks/LTX-Video-0.9.7-dev", config=LTX_095_CONFIG),
        ModelName("ltx-video-0.9.8", "Lightricks/LTX-Video-0.9.8-dev", config=LTX_095_CONFIG, verified=False),
    ),
    # 2 latent frames of 4 x 4: 9 frames of 128 x 128 at 0.9.x's ratios
    validation_latent_shape=lambda c: (1, c.latent_channels, 2, 4, 4),
    validation_video_shape=lambda c: (1, c.in_channels, 1 + c.temporal_ratio, 4 * c.spatial_ratio, 4 * c.spatial_ratio),
    validation_decode_inputs=_decode_inputs,
    recorded_tensors=("latents_mean", "latents_std"),
)
