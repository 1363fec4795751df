"""LTX-Video's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting, TilingCase

# 0.9.5's layout at small widths: space-to-depth downsamplers of each kind, residual depth-to-space upsamplers that
# halve the channels, a timestep-conditioned decoder
LTX_095_SMALL = dict(
    block_out_channels=[8, 16, 32, 64, 128],
    down_block_types=["LTXVideo095DownBlock3D"] * 4,
    layers_per_block=[1, 1, 1, 1, 1],
    spatio_temporal_scaling=[True, True, True, True],
    downsample_type=["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
    decoder_block_out_channels=[16, 32, 64],
    decoder_layers_per_block=[1, 1, 1, 1],
    decoder_spatio_temporal_scaling=[True, True, True],
    decoder_inject_noise=[False, False, False, False],
    upsample_residual=[True, True, True],
    upsample_factor=[2, 2, 2],
    timestep_conditioning=True,
    latent_channels=8,
    spatial_compression_ratio=32,
    temporal_compression_ratio=8,
)
# 0.9.1's decoder at small widths: noise after every decoder convolution but the mid block's
LTX_091_SMALL = dict(
    block_out_channels=[8, 16, 32, 32],
    layers_per_block=[1, 1, 1, 1, 1],
    decoder_block_out_channels=[16, 32, 64],
    decoder_layers_per_block=[1, 1, 2, 1],
    decoder_spatio_temporal_scaling=[True, True, True],
    decoder_inject_noise=[True, True, True, False],
    upsample_residual=[True, True, True],
    upsample_factor=[2, 2, 2],
    timestep_conditioning=True,
    latent_channels=8,
)

TESTING = FamilyTesting(
    small_configs={
        # 0.9.0's layout: strided-conv downsamplers, width-changing resnets with a LayerNorm shortcut
        "default-arch": dict(
            block_out_channels=[8, 16, 32, 32],
            decoder_block_out_channels=[8, 16, 32, 32],
            layers_per_block=[1, 1, 2, 1, 1],
            decoder_layers_per_block=[1, 2, 1, 1, 1],
            latent_channels=8,
        ),
        "ltx-0.9.5": LTX_095_SMALL,
    },
    # 1 + 8k video frames: each temporal downsampler halves 2k + 1 frames to k + 1 (test_ltx.py decodes 2 and 4
    # latent frames and encodes 9 and 25 elsewhere); test_sharding.py encodes the shortest clip of these on its
    # meshes (LTX-2's space-to-depth went wrong there from 17 frames: models/common/sharding.py)
    parity_frames=((1, 3), (1, 17)),
    parity_video_sizes=((64, 64),),
    decode_steps=1,
    tiling={
        # 64-pixel tiles every 32 (2 latents every 1)
        "default-arch": TilingCase(
            dict(
                tile_sample_min_height=64,
                tile_sample_min_width=64,
                tile_sample_stride_height=32,
                tile_sample_stride_width=32,
            ),
            latent=(2, 3, 4),
            video=(9, 96, 128),
            decode_steps=1,
        ),
    },
    meshes={"default-arch": ((1, 8, "auto"), (2, 4, "explicit"))},
    export=("default-arch", "ltx-0.9.5"),
    check_configs=(("ltx-video-0.9.1-small", LTX_091_SMALL),),
)

# LTX-2.0's layout at small widths: widths counted after conv_in, reflect padding in the decoder, no timestep
LTX2_SMALL = dict(
    block_out_channels=[16, 32, 64, 128],
    layers_per_block=[1, 1, 1, 1, 1],
    decoder_block_out_channels=[16, 32, 64],
    decoder_layers_per_block=[1, 1, 1, 1],
    latent_channels=8,
    decoder_causal=False,
    spatial_compression_ratio=32,
    temporal_compression_ratio=8,
)
# LTX-2.3's: a temporal-only and a spatial-only upsampler, one without channel upscaling, no residuals, zero padding
LTX23_SMALL = dict(
    block_out_channels=[16, 32, 64, 64],
    layers_per_block=[1, 1, 1, 1, 1],
    decoder_block_out_channels=[16, 32, 32, 64],
    decoder_layers_per_block=[1, 1, 1, 1, 1],
    decoder_spatio_temporal_scaling=[True, True, True, True],
    decoder_inject_noise=[False, False, False, False, False],
    upsample_type=["spatiotemporal", "spatiotemporal", "temporal", "spatial"],
    upsample_residual=[False, False, False, False],
    upsample_factor=[2, 2, 1, 2],
    decoder_spatial_padding_mode="zeros",
    decoder_causal=False,
    latent_channels=8,
    spatial_compression_ratio=32,
    temporal_compression_ratio=8,
)

# what no published LTX-2 config does: 2x2 patches, one bool for every level's scaling, a non-causal encoder with
# reflect padding, decoder blocks that change width (plain 1x1x1 shortcuts) and upsamplers without channel upscaling
LTX2_VARIANT = dict(
    block_out_channels=[16, 32, 64, 64],
    layers_per_block=[1, 1, 1, 1, 1],
    spatio_temporal_scaling=True,
    decoder_block_out_channels=[16, 32, 64],
    decoder_layers_per_block=[1, 1, 1, 1],
    upsample_factor=[1, 1, 1],
    patch_size=2,
    encoder_causal=False,
    encoder_spatial_padding_mode="reflect",
    latent_channels=8,
    spatial_compression_ratio=16,
    temporal_compression_ratio=8,
)

TESTING_LTX2 = FamilyTesting(
    small_configs={"default-arch": LTX2_SMALL, "ltx-2.3": LTX23_SMALL, "variant": LTX2_VARIANT},
    parity_frames=((1, 3), (1, 17)),
    parity_video_sizes=((64, 64),),
    decode_steps=1,
    tiling={},
    meshes={"default-arch": ((1, 8, "auto"), (2, 4, "explicit"))},  # reflect padding under a width split
    export=("ltx-2.3",),
    # LTX-2.0 is 4.9 GB in float32: its model, the reference and the output would not fit beside another worker;
    # LTX-Video 0.9.0's full-size test runs the same code
    full_size=False,
)
