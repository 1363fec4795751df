"""The HunyuanVideo VAE family (diffusers' `AutoencoderKLHunyuanVideo`): its config, implementations, mapping file,
model names and validation shapes."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName
from .config import HunyuanVideoVAEConfig


def _flax_model():
    from .modeling_flax import AutoencoderKLHunyuanVideo

    return AutoencoderKLHunyuanVideo


def _torch_model():
    from .modeling_torch import AutoencoderKLHunyuanVideo

    return AutoencoderKLHunyuanVideo


def _testing():
    from .testing import TESTING

    return TESTING


HUNYUANVIDEO = FamilySpec(
    name="hunyuanvideo",
    config_class=HunyuanVideoVAEConfig,
    flax_model=_flax_model,
    torch_model=_torch_model,
    testing=_testing,
    mapping_file="hunyuanvideo.yaml",
    # the repos whose vae/ holds this VAE (the I2V model and the pipelines built on it reuse the T2V one's)
    models=(
        ModelName("hunyuanvideo", "hunyuanvideo-community/HunyuanVideo"),
        ModelName("hunyuanvideo-i2v", "hunyuanvideo-community/HunyuanVideo-I2V"),
    ),
    # 3 latent frames and 9 video frames: below the framewise threshold, so validation runs the plain path
    native_video=(129, 720, 1280),
    validation_latent_shape=lambda c: (1, c.latent_channels, 3, 8, 8),
    validation_video_shape=lambda c: (
        1,
        c.in_channels,
        9,
        8 * c.spatial_compression_ratio,
        8 * c.spatial_compression_ratio,
    ),
)
