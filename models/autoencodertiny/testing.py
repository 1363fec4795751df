"""AutoencoderTiny's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting, OriginalFileCase, TilingCase

# TAESD's layout at small widths: four levels (8x), other blocks per level than the release's
TAESD_LAYOUT = dict(
    encoder_block_out_channels=[8] * 4,
    decoder_block_out_channels=[8] * 4,
    num_encoder_blocks=[1, 2, 1, 1],
    num_decoder_blocks=[1, 1, 2, 1],
)
# TAESD3's and TAEF1's 16 latent channels; here three levels (4x), another width and activation, a level of each
# coder with no blocks (its convolution alone)
SIXTEEN_CHANNELS = dict(
    encoder_block_out_channels=[12] * 3,
    decoder_block_out_channels=[12] * 3,
    num_encoder_blocks=[1, 0, 2],
    num_decoder_blocks=[2, 1, 0],
    latent_channels=16,
    act_fn="silu",
)
# the released block structure, whose keys the original files list
RELEASED_STRUCTURE = dict(num_encoder_blocks=[1, 3, 3, 3], num_decoder_blocks=[3, 3, 3, 1])

TESTING = FamilyTesting(
    small_configs={"default-arch": TAESD_LAYOUT, "16-channels": SIXTEEN_CHANNELS},
    parity_frames=((1,), (1,)),
    # square and non-square latents; images of sizes that divide into latents and of sizes that do not
    parity_latent_sizes=((4, 4), (3, 5)),
    parity_video_sizes=((32, 32), (18, 30)),
    tiling={
        # diffusers' enable_tiling takes no settings: its 512-pixel tiles every 448 (64 latents every 56), here 72x76
        # latents in rows of 64 and 8, columns of 64 and 12; diffusers' tiled encode keeps 4 latent channels only
        "default-arch": TilingCase({}, latent=(72, 76), video=(576, 608), decode_steps=1, targets=("flax", "torchax")),
    },
    meshes={"default-arch": ((2, 4, "explicit"),)},
    export=("default-arch", "16-channels"),
    full_size_left_to_first=("TAESD3/TAEF1",),  # TAESD's code with 16 latent channels
    original_files={
        "taesd": OriginalFileCase(
            "default-arch", "taesd.safetensors", config_changes=RELEASED_STRUCTURE, split_by_part=True
        ),
    },
    decode_steps=1,
)
