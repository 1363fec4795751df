"""The Wan VAE family (diffusers' `AutoencoderKLWan`): its config, implementations, mapping file, model names and
validation shapes."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import WAN22_CONFIG, WanVAEConfig

WAN = FamilySpec(
    name="wan",
    config_class=WanVAEConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLWan"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLWan"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="wan.yaml",
    # Every Wan diffusers repo that ships a VAE: the Wan 2.1 models and Wan 2.2's A14B models carry the Wan 2.1 VAE,
    # Wan 2.2 TI2V-5B its own. Repo ids were checked against public Hub pages where one was found.
    models=(
        ModelName("wan2.1", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", aliases=("wan2.1-t2v-1.3b",)),
        ModelName("wan2.1-t2v-14b", "Wan-AI/Wan2.1-T2V-14B-Diffusers"),
        ModelName("wan2.1-i2v-14b-480p", "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"),
        ModelName("wan2.1-i2v-14b-720p", "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", verified=False),
        ModelName("wan2.1-flf2v-14b-720p", "Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers"),
        ModelName("wan2.1-vace-1.3b", "Wan-AI/Wan2.1-VACE-1.3B-diffusers", verified=False),
        ModelName("wan2.1-vace-14b", "Wan-AI/Wan2.1-VACE-14B-diffusers"),
        ModelName("wan2.2", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", config=WAN22_CONFIG, aliases=("wan2.2-ti2v-5b",)),
        ModelName("wan2.2-t2v-a14b", "Wan-AI/Wan2.2-T2V-A14B-Diffusers"),
        ModelName("wan2.2-i2v-a14b", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", verified=False),
    ),
    # Wan 2.2 decodes each latent pixel into 16x16: a smaller latent keeps its validation as quick as 2.1's
    validation_latent_shape=lambda c: (1, c.z_dim, 3, 8 // c.patch, 8 // c.patch),
    validation_sample_shape=lambda c: (1, c.video_channels, 5, 64, 64),
    clamps_output=True,
)
