"""AutoencoderKL's and AutoencoderKLFlux2's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting, OriginalFileCase, TilingCase

# SD 1.x/2.x/SDXL's layout at small widths: 3 levels (4x), quant convs, mid-block attention; 32-pixel tiles
SD_LAYOUT = dict(
    block_out_channels=[8, 16, 16],
    down_block_types=["DownEncoderBlock2D"] * 3,
    up_block_types=["UpDecoderBlock2D"] * 3,
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=32,
)
# SD3 and Flux.1's layout: 16 latent channels and no quant convs; here 2 levels of 2 layers, other groups, and the
# mid blocks without attention
SD3_LAYOUT = dict(
    block_out_channels=[8, 24],
    down_block_types=["DownEncoderBlock2D"] * 2,
    up_block_types=["UpDecoderBlock2D"] * 2,
    layers_per_block=2,
    latent_channels=16,
    norm_num_groups=8,
    use_quant_conv=False,
    use_post_quant_conv=False,
    mid_block_add_attention=False,
    shift_factor=0.1159,
    scaling_factor=0.3611,
)

# the block structure of every released VAE, whose keys the original files list: four levels (numbered from the top
# in the decoder) of two layers, widths doubling as 128, 256, 512, 512 do (the same resnets have shortcuts), attention
RELEASED_STRUCTURE = dict(
    block_out_channels=[8, 16, 32, 32],
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    layers_per_block=2,
    mid_block_add_attention=True,
)

TESTING = FamilyTesting(
    small_configs={"default-arch": SD_LAYOUT, "sd3-layout": SD3_LAYOUT},
    # images: no frames
    parity_frames=((1,), (1,)),
    # square and non-square latents; images of sizes that divide into latents and of sizes that do not (each
    # downsampler pads an odd size at the bottom and right)
    parity_latent_sizes=((4, 4), (3, 5)),
    parity_video_sizes=((32, 32), (18, 30)),
    tiling={
        # 8-latent tiles every 6 (32 pixels every 24): 14x15 latents in rows of 8, 8, 2 and columns of 8, 8, 3
        "default-arch": TilingCase({}, latent=(14, 15), video=(56, 60), decode_steps=1, targets=("flax", "torchax")),
    },
    meshes={"default-arch": ((2, 4, "explicit"),)},  # one mesh, as CogVideoX's
    export=("default-arch", "sd3-layout"),
    full_size_left_to_first=("SD3/Flux.1 VAE",),  # SD 1.5's code less the 1x1 convolutions around the latent
    check_configs=(
        # a quant_conv without its post_quant_conv, 8 latent channels, widths 8, 8, 16
        (
            "autoencoderkl-mixed",
            dict(
                SD_LAYOUT,
                latent_channels=8,
                use_post_quant_conv=False,
                norm_num_groups=8,
                block_out_channels=[8, 8, 16],
            ),
        ),
    ),
    original_files={
        "ldm": OriginalFileCase("default-arch", "sdxl_vae.pt", config_changes=RELEASED_STRUCTURE),
        "bfl-flux1": OriginalFileCase(
            "sd3-layout", "ae.pt", config_changes=RELEASED_STRUCTURE, validated_target="torchax"
        ),
    },
    decode_steps=1,
)

# Flux.2's layout at small widths: SD's, with 8 latent channels in 2x2 patches for the BatchNorm
FLUX2_LAYOUT = dict(SD_LAYOUT, latent_channels=8)
# a decoder narrower than the encoder (as FLUX.2-small-decoder's), no quant convs, no attention, 1x2 patches and
# another BatchNorm epsilon
FLUX2_NARROW_DECODER = dict(
    FLUX2_LAYOUT,
    decoder_block_out_channels=[4, 8, 12],
    layers_per_block=2,
    use_quant_conv=False,
    use_post_quant_conv=False,
    mid_block_add_attention=False,
    patch_size=[1, 2],
    batch_norm_eps=1e-3,
)

TESTING_FLUX2 = FamilyTesting(
    small_configs={"default-arch": FLUX2_LAYOUT, "narrow-decoder": FLUX2_NARROW_DECODER},
    parity_frames=((1,), (1,)),
    # the encoder and decoder are AutoencoderKL's, whose tests take every size and the tiles: one odd, non-square
    # size each here
    parity_latent_sizes=((3, 5),),
    parity_video_sizes=((18, 30),),
    tiling={},
    meshes={},
    export=("default-arch", "narrow-decoder"),
    original_files={
        "bfl-flux2": OriginalFileCase("default-arch", "flux2-vae.safetensors", config_changes=RELEASED_STRUCTURE),
    },
    decode_steps=1,
)
