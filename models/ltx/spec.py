"""The LTX VAE families, one model for both: LTX-Video (diffusers' `AutoencoderKLLTXVideo`: 0.9.0 to 0.9.8) and
LTX-2 (`AutoencoderKLLTX2Video`: 2.0, 2.3, 2.5's conv VAE). Their configs, implementations, mapping file, model
names, validation shapes and inputs."""

from __future__ import annotations

import numpy as np

from ..common.spec import FamilySpec, ModelName, lazy
from .config import (
    LTX2_20_CONFIG,
    LTX2_23_CONFIG,
    LTX_091_CONFIG,
    LTX_095_CONFIG,
    LTX2VideoVAEConfig,
    LTXVideoVAEConfig,
)

DECODE_TIMESTEP = 0.05  # what LTX pipelines pass as decode_timestep by default


def _decode_inputs(config: LTXVideoVAEConfig) -> dict:
    """A timestep-conditioned decoder validates at LTX pipelines' default decode timestep; a noise-injecting one with
    the maps of seed 0 (NumPy draws, the same on both sides)."""
    inputs = {}
    if config.timestep_conditioning:
        inputs["temb"] = np.array([DECODE_TIMESTEP], np.float32)
    if config.injects_noise:
        inputs["noise"] = np.array(0)
    return inputs


# 2 latent frames of 4 x 4: 9 frames of 128 x 128 at the published ratios
VALIDATION = dict(
    validation_latent_shape=lambda c: (1, c.latent_channels, 2, 4, 4),
    validation_sample_shape=lambda c: (
        1,
        c.in_channels,
        1 + c.temporal_ratio,
        4 * c.spatial_ratio,
        4 * c.spatial_ratio,
    ),
    validation_decode_inputs=_decode_inputs,
    recorded_tensors=("latents_mean", "latents_std"),
    native_size=(121, 704, 1216),
)


def _from_metadata(translation: str):
    """A family's config_from_metadata: models/ltx/original.py's `translation` of the file's metadata VAE config,
    imported on first use."""

    def config_from_metadata(metadata: dict):
        from . import original

        return original.config_from_metadata(metadata, getattr(original, translation))

    return config_from_metadata


LTX = FamilySpec(
    name="ltx",
    config_class=LTXVideoVAEConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLLTXVideo"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLLTXVideo"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="ltx.yaml",
    config_from_metadata=_from_metadata("ltx_video_config"),
    models=(
        ModelName("ltx-video", "Lightricks/LTX-Video"),
        ModelName("ltx-video-0.9.0", "diffusers/LTX-Video-0.9.0"),
        ModelName("ltx-video-0.9.1", "Lightricks/LTX-Video-0.9.1", config=LTX_091_CONFIG),
        ModelName("ltx-video-0.9.5", "Lightricks/LTX-Video-0.9.5", config=LTX_095_CONFIG),
        ModelName("ltx-video-0.9.7", "Lightricks/LTX-Video-0.9.7-dev", config=LTX_095_CONFIG),
        ModelName("ltx-video-0.9.8", "Lightricks/LTX-Video-0.9.8-dev", config=LTX_095_CONFIG, verified=False),
    ),
    **VALIDATION,
)

LTX2 = FamilySpec(
    name="ltx2",
    config_class=LTX2VideoVAEConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLLTX2Video"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLLTX2Video"),
    testing=lazy(__package__, ".testing", "TESTING_LTX2"),
    mapping_file="ltx.yaml",
    config_from_metadata=_from_metadata("ltx2_config"),
    models=(
        ModelName("ltx-2", "Lightricks/LTX-2", config=LTX2_20_CONFIG),
        ModelName("ltx-2.3", "diffusers/LTX-2.3-Diffusers", config=LTX2_23_CONFIG),
        ModelName("ltx-2.5", "Lightricks/LTX-2.5-Diffusers", config=LTX2_23_CONFIG, verified=False),
    ),
    **VALIDATION,
)
