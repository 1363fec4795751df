"""Wan's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import SMALL_TILES, FamilyTesting, OriginalFileCase, TilingCase
from .config import WAN22_CONFIG

TESTING = FamilyTesting(
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
        # Wan 2.2's layout (residual blocks, 2x2 patches, decoder wider than encoder) at small widths: 4 levels with
        # its temporal downsampling, then 3 levels downsampling time first
        "wan2.2-layout": dict(
            WAN22_CONFIG,
            base_dim=8,
            decoder_base_dim=12,
            z_dim=4,
            num_res_blocks=1,
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
        ),
        "wan2.2-3-levels": dict(
            WAN22_CONFIG,
            base_dim=8,
            decoder_base_dim=16,
            z_dim=4,
            dim_mult=[1, 2, 2],
            temperal_downsample=[True, False],
            scale_factor_spatial=8,
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
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
        # Wan 2.2's residual layout at 3 levels, downsampling time first, 1 res block
        (
            "wan2.2-variant",
            dict(
                WAN22_CONFIG,
                base_dim=8,
                decoder_base_dim=16,
                z_dim=8,
                dim_mult=[1, 2, 2],
                num_res_blocks=1,
                temperal_downsample=[True, False],
                latents_mean=[0.0] * 8,
                latents_std=[1.0] * 8,
            ),
        ),
    ),
    tiling={
        # 4-latent tiles every 3: rows and columns of 4, 4, 1; the output cropped to 8x the input
        "default-arch": TilingCase(
            SMALL_TILES,
            latent=(2, 7, 7),
            video=(1, 56, 56),
            decode_steps=2,
        ),
        # Wan 2.2 tiles the patchified video: 4-latent tiles every 3 (16x each), and encoder tiles of 64 patches
        # every 48. The 128-pixel video is 64 patches, one tile's worth, yet diffusers tiles it: the unpatchified size
        # exceeds 64.
        "wan2.2-layout": TilingCase(
            dict(
                tile_sample_min_height=64,
                tile_sample_min_width=64,
                tile_sample_stride_height=48,
                tile_sample_stride_width=48,
            ),
            latent=(2, 7, 7),
            video=(5, 128, 128),
            decode_steps=2,
        ),
    },
    # both mesh shapes and both axis types (a family whose layers split as these do names one mesh); Wan 2.2's
    # layout adds patchified input and residual shortcuts around the default architecture's blocks
    meshes={
        "default-arch": ((1, 8, "auto"), (2, 4, "explicit")),
        "wan2.2-layout": ((2, 4, "auto"),),
    },
    export=("default-arch", "wan2.2-layout"),
    original_files={
        "wan2.1-original": OriginalFileCase("default-arch", "Wan2.1_VAE.pth"),
        # Wan2.2_VAE.pth's 2 res blocks a level; validated through the torchax target
        "wan2.2-original": OriginalFileCase(
            "wan2.2-layout", "Wan2.2_VAE.pth", config_changes=dict(num_res_blocks=2), validated_target="torchax"
        ),
    },
    # Wan 2.1 runs the family's code at full size; Wan 2.2's 704.7 M parameters took 85 s more of the suite
    full_size_left_to_first=("Wan 2.2 VAE",),
)
