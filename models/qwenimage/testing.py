"""Qwen-Image's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting

# Qwen-Image-Layered's 4 channels (RGBA), 3 levels (attention in the encoder's down blocks, `attn_scales`, fails in
# diffusers' own encoder: its attention block takes no cache arguments)
OTHER_CONFIG = dict(
    base_dim=8,
    z_dim=4,
    dim_mult=[1, 2, 2],
    num_res_blocks=1,
    temperal_downsample=[False, True],
    input_channels=4,
    latents_mean=[0.0] * 4,
    latents_std=[1.0] * 4,
)

TESTING = FamilyTesting(
    small_configs={
        "default-arch": dict(base_dim=8, z_dim=4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4),
        "other-config": OTHER_CONFIG,
    },
    # single images (T = 1) and short clips
    parity_frames=((1, 2, 3), (1, 5)),
    # tiling, meshes and full size: Wan 2.1's code and size, which its own cases cover (the CI time goes to what
    # differs)
    tiling={},
    meshes={},
    export=("default-arch",),
    check_configs=(("qwenimage-variant", OTHER_CONFIG),),
    full_size=False,
)
