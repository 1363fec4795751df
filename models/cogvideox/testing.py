"""CogVideoX's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting, OriginalFileCase, TilingCase

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

TESTING = FamilyTesting(
    small_configs={
        "default-arch": dict(block_out_channels=[16, 32, 32, 64], norm_num_groups=8, latent_channels=4),
        "other-config": OTHER_CONFIG,
    },
    # latent frames 1 (one chunk), 4 (a first batch of 2, then a cached one) and 7 (the remainder folded into a first
    # batch of 3, which is all of 3 frames' decode, then cached batches of 2, each taking the last one's cache)
    parity_frames=((1, 4, 7), (1, 9, 17)),
    tiling={
        # 6x5-latent tiles every 5x4 with diffusers' overlap factors (1/6, 1/5); one frame batch (the cache carried
        # within a tile and reset between tiles is the same shared code as Wan's, which has two steps a tile)
        "default-arch": TilingCase(
            dict(tile_sample_min_height=48, tile_sample_min_width=40),
            latent=(3, 8, 9),
            video=(9, 64, 72),
            decode_steps=1,
        ),
    },
    # one mesh: the axis types and the (1, 8) split are Wan's cases (the shared code); CogVideoX's own halos show here
    meshes={"default-arch": ((2, 4, "auto"),)},
    export=("default-arch",),
    # SAT's 3d-vae.pt nests the model under "state_dict", beside the training discriminator's tensors
    original_files={
        "cogvideox-sat": OriginalFileCase(
            "default-arch", "3d-vae.pt", wrapper="state_dict", training_key="loss.discriminator.blocks.0.weight"
        )
    },
    check_configs=(("cogvideox-variant", OTHER_CONFIG),),
)
