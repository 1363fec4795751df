"""MiniMax-H3's video VAE's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting, TilingCase

# diffusers' own test config (convert_minimax_h3_to_diffusers.py's MINIMAX_H3_TEST_VIDEO_VAE_CONFIG) at smaller
# widths: the release's latent channels, clip geometry and rotary share, two levels, 4x in space and time
DEFAULT_ARCH = dict(
    block_out_channels=[16, 32], layers_per_block=1, spatial_downsample_factors=[2, 2],
    temporal_downsample_factors=[2, 2], norm_num_groups=8, decoder_num_layers=2, decoder_num_attention_heads=2,
    decoder_attention_head_dim=24,
)  # fmt: skip
# another rotary share (all of each head's channels), padding mode, clip geometry and depth, no register tokens and
# no latent frames dropped (chunks then meet without a cross-fade): three levels, 8x in space with a level that
# downsamples in space alone, 2x in time
OTHER_CONFIG = dict(
    block_out_channels=[8, 16, 16], layers_per_block=2, spatial_downsample_factors=[2, 2, 2],
    temporal_downsample_factors=[2, 1, 1], norm_num_groups=4, spatial_padding_mode="replicate", latent_channels=4,
    latents_mean=[0.0] * 4, latents_std=[1.0] * 4, decoder_num_layers=1, decoder_num_attention_heads=3,
    decoder_attention_head_dim=12, decoder_num_register_tokens=0, decoder_rope_dim_ratio=1.0, clip_length=9,
    token_drop=0,
)  # fmt: skip

TESTING = FamilyTesting(
    small_configs={"default-arch": DEFAULT_ARCH, "other-config": OTHER_CONFIG},
    # latent frames: one chunk (7), one chunk filled by repeating (3), several cross-faded chunks (12) and several
    # with a filled last one (14); video frames: one image, one clip, two clips, two and a bit
    parity_frames=((3, 7, 12, 14), (1, 17, 22, 40)),
    parity_latent_sizes=((3, 5),),
    parity_video_sizes=((12, 20),),
    tiling={
        # 16-pixel tiles, overlaps of at least 4 (4 latents, at least 1): 24 pixels in 2 rows overlapping by 8, 36
        # in 3 columns overlapping by 8 and 4 (the spare pixels spread in steps of 4); every tile whole
        "default-arch": TilingCase(
            dict(
                tile_sample_min_height=16,
                tile_sample_min_width=16,
                tile_sample_min_overlap_height=4,
                tile_sample_min_overlap_width=4,
            ),
            latent=(7, 6, 9),
            video=(17, 24, 36),
            decode_steps=1,
            targets=("flax", "torchax"),
            tile_shapes=1,
        ),
    },
    # the encoder's width and the decoder's tokens split over "tp" (an uneven token count), the batch over "dp"
    meshes={"default-arch": ((1, 8, "auto"), (2, 4, "explicit"))},
    export=("default-arch", "other-config"),
    check_configs=(("minimaxh3-other-config", OTHER_CONFIG),),
    decode_steps=1,
    full_size=False,  # 10.4 GB in float32: the benchmark's (bench/), not the suite's
)
