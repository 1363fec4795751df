"""The HunyuanVideo VAE family (diffusers' `AutoencoderKLHunyuanVideo`): its config, implementations, mapping file,
model names and validation shapes."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import HunyuanVideoVAEConfig

HUNYUANVIDEO = FamilySpec(
    name="hunyuanvideo",
    config_class=HunyuanVideoVAEConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLHunyuanVideo"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLHunyuanVideo"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="hunyuanvideo.yaml",
    # the repos whose vae/ holds this VAE (the I2V model and the pipelines built on it reuse the T2V one's)
    models=(
        ModelName("hunyuanvideo", "hunyuanvideo-community/HunyuanVideo"),
        ModelName("hunyuanvideo-i2v", "hunyuanvideo-community/HunyuanVideo-I2V"),
    ),
    # 3 latent frames and 9 video frames: below the framewise threshold, so validation runs the plain path
    native_size=(129, 720, 1280),
    validation_latent_shape=lambda c: (1, c.latent_channels, 3, 8, 8),
    validation_sample_shape=lambda c: (
        1,
        c.in_channels,
        9,
        8 * c.spatial_compression_ratio,
        8 * c.spatial_compression_ratio,
    ),
)
