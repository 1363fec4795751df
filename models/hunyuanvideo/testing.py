"""HunyuanVideo's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import SMALL_TILES, FamilyTesting, OriginalFileCase, TilingCase

# 3 levels, 1 layer per block, space compressed 4x, no mid-block attention
OTHER_CONFIG = dict(
    block_out_channels=[8, 16, 16],
    down_block_types=["HunyuanVideoDownBlock3D"] * 3,
    up_block_types=["HunyuanVideoUpBlock3D"] * 3,
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    spatial_compression_ratio=4,
    mid_block_add_attention=False,
)

TESTING = FamilyTesting(
    small_configs={
        "default-arch": dict(block_out_channels=[8, 16, 16, 16], norm_num_groups=4, latent_channels=4),
        "other-config": OTHER_CONFIG,
    },
    # up to 4 latent frames decode in one piece, 6 (two tiles, the last short) in diffusers' overlapping temporal tiles
    # (framewise, on by default); up to 16 video frames encode in one piece, 29 in temporal tiles (test_hunyuanvideo.py
    # decodes 6 and encodes 21 with the tiles off)
    parity_frames=((1, 6), (9, 29)),
    tiling={
        # 4-latent tiles every 3 (32 pixels every 24): rows and columns of 4, 4, 1
        "default-arch": TilingCase(
            SMALL_TILES,
            latent=(2, 7, 7),
            video=(5, 56, 56),
            decode_steps=1,
        ),
    },
    meshes={"default-arch": ((2, 4, "explicit"),)},  # one mesh, as CogVideoX's
    export=("default-arch",),
    check_configs=(("hunyuanvideo-variant", OTHER_CONFIG),),
    original_files={
        # widths doubling as the release's do, so the same resnets have shortcuts
        "hunyuanvideo-original": OriginalFileCase(
            "default-arch",
            "pytorch_model.pt",
            config_changes=dict(block_out_channels=[8, 16, 32, 32]),
            wrapper="state_dict",
            validated_target="torchax",
        )
    },
)
