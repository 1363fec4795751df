"""The CogVideoX VAE family (diffusers' `AutoencoderKLCogVideoX`): its config, implementations, mapping file, model
names, validation shapes and the small widths tests use."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName
from .config import CogVideoXVAEConfig


def _flax_model():
    from .modeling_flax import AutoencoderKLCogVideoX

    return AutoencoderKLCogVideoX


def _torch_model():
    from .modeling_torch import AutoencoderKLCogVideoX

    return AutoencoderKLCogVideoX


# 2 levels, 1 layer per block, time compressed once, quant convs on (diffusers sizes them from out_channels)
OTHER_CONFIG = dict(
    block_out_channels=[16, 32],
    down_block_types=["CogVideoXDownBlock3D"] * 2,
    up_block_types=["CogVideoXUpBlock3D"] * 2,
    layers_per_block=1,
    latent_channels=3,
    temporal_compression_ratio=2,
    norm_num_groups=4,
    use_quant_conv=True,
    use_post_quant_conv=True,
)

COGVIDEOX = FamilySpec(
    name="cogvideox",
    config_class=CogVideoXVAEConfig,
    flax_model=_flax_model,
    torch_model=_torch_model,
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
    validation_video_shape=lambda c: (1, c.in_channels, 9, 64, 64),
    small_configs={
        "default-arch": dict(block_out_channels=[16, 32, 32, 64], norm_num_groups=8, latent_channels=4),
        "other-config": OTHER_CONFIG,
    },
    # 1..4 and 13 latent frames: odd and even counts, the remainder folded into the first batch of 2
    parity_frames=((1, 2, 3, 4, 13), (1, 5, 9, 17)),
    check_configs=(("cogvideox-variant", OTHER_CONFIG),),
)
