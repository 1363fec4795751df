"""The CogVideoX VAE family (diffusers' `AutoencoderKLCogVideoX`): its config, implementations, mapping file, model
names and validation shapes."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import CogVideoXVAEConfig

COGVIDEOX = FamilySpec(
    name="cogvideox",
    config_class=CogVideoXVAEConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLCogVideoX"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLCogVideoX"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="cogvideox.yaml",
    # The three CogVideoX VAEs share an architecture; they differ in how the pipeline scales latents.
    models=(
        ModelName("cogvideox-2b", "THUDM/CogVideoX-2b", config=dict(scaling_factor=1.15258426)),
        ModelName("cogvideox-5b", "THUDM/CogVideoX-5b", config=dict(scaling_factor=0.7)),
        ModelName(
            "cogvideox1.5-5b", "THUDM/CogVideoX1.5-5B", config=dict(scaling_factor=0.7, invert_scale_latents=True)
        ),
    ),
    # 3 latent frames: one batch with an odd count (the first frame's own path in spatial norms and upsampling)
    validation_latent_shape=lambda c: (1, c.latent_channels, 3, 8, 8),
    validation_sample_shape=lambda c: (1, c.in_channels, 9, 64, 64),
)
