"""The Wan VAE family (diffusers' `AutoencoderKLWan`): its config, implementations, mapping file, model names,
validation shapes and the small widths tests use."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName
from .config import WanVAEConfig


def _flax_model():
    from .modeling_flax import AutoencoderKLWan

    return AutoencoderKLWan


def _torch_model():
    from .modeling_torch import AutoencoderKLWan

    return AutoencoderKLWan


WAN = FamilySpec(
    name="wan",
    config_class=WanVAEConfig,
    flax_model=_flax_model,
    torch_model=_torch_model,
    mapping_file="wan.yaml",
    models=(ModelName("wan2.1", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"),),
    # Wan 2.2 decodes each latent pixel into 16x16: a smaller latent keeps its validation as quick as 2.1's
    validation_latent_shape=lambda c: (1, c.z_dim, 3, 8 // c.patch, 8 // c.patch),
    validation_video_shape=lambda c: (1, c.video_channels, 5, 32, 32),
    small_configs={
        # num_res_blocks=2 gives the encoder 11 down_blocks entries, so list indices >= 10 occur (a converter that
        # sorts keys as strings fails there)
        "default-arch": dict(base_dim=8, z_dim=4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4),
        "other-config": dict(
            base_dim=8,
            decoder_base_dim=12,
            z_dim=8,
            dim_mult=[1, 2, 2],
            num_res_blocks=1,
            temperal_downsample=[True, False],
            latents_mean=[0.0] * 8,
            latents_std=[1.0] * 8,
        ),
    },
    parity_frames=((1, 2, 5), (1, 5, 9)),
    check_configs=(
        # attention in the encoder's down blocks, 3 levels, 1 res block, other temporal downsampling, own decoder width
        (
            "wan2.1-variant",
            dict(
                base_dim=8,
                decoder_base_dim=12,
                z_dim=8,
                dim_mult=[1, 2, 2],
                num_res_blocks=1,
                attn_scales=[1.0],
                temperal_downsample=[True, False],
            ),
        ),
    ),
    clamps_output=True,
)
