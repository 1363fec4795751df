"""Qwen-Image 2.1's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting, TilingCase

TESTING = FamilyTesting(
    small_configs={
        # the class's 5 levels (16x), RGBA, a decoder wider than the encoder
        "default-arch": dict(base_dim=8, decoder_base_dim=12, z_dim=4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4),
        # 3 levels downsampling time first, 2x2 patches of RGB, 1 residual block a level
        "other-config": dict(
            base_dim=8,
            decoder_base_dim=16,
            z_dim=8,
            dim_mult=[1, 2, 2],
            num_res_blocks=1,
            temperal_downsample=[True, False],
            patch_size=2,
            in_channels=12,
            out_channels=12,
            scale_factor_spatial=8,
            latents_mean=[0.0] * 8,
            latents_std=[1.0] * 8,
        ),
    },
    # one image: diffusers' model takes a single frame
    parity_frames=((1,), (1,)),
    # a square latent and a non-square one, decoded; images of both kinds, encoded (to 4x4 and 2x5 at 16x)
    parity_latent_sizes=((4, 4), (3, 5)),
    parity_video_sizes=((64, 64), (32, 80)),
    tiling={
        # 128-pixel tiles every 96: at 16x, 8-latent tiles every 6, so 14x15 latents are cut into rows of 8, 8, 2
        # and columns of 8, 8, 3
        "default-arch": TilingCase(
            dict(
                tile_sample_min_height=128,
                tile_sample_min_width=128,
                tile_sample_stride_height=96,
                tile_sample_stride_width=96,
            ),
            latent=(1, 14, 15),
            video=(1, 208, 240),
            # Flax alone: the tiling is one piece of code for both targets, and torchax tiles images in
            # autoencoderkl's and TAESD's cases
            decode_steps=1,
        ),
    },
    # Wan 2.2's blocks, whose mesh cases cover them; what differs is 2-D convolutions, whose width halos the
    # resamplers of every Wan case already exchange
    meshes={},
    export=("default-arch", "other-config"),
    check_configs=(
        # Wan 2.1's layout (no residual shortcuts) under this class, 3 levels
        (
            "qwenimage21-plain",
            dict(
                base_dim=8,
                decoder_base_dim=None,
                z_dim=8,
                dim_mult=[1, 2, 2],
                num_res_blocks=1,
                temperal_downsample=[False, True],
                is_residual=False,
                in_channels=3,
                out_channels=3,
                latents_mean=[0.0] * 8,
                latents_std=[1.0] * 8,
            ),
        ),
    ),
    decode_steps=1,
)
