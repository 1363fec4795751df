"""MiniMax-H3's audio VAE's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting

# the released layout at small widths and hop (40 samples a latent frame): four encoder strides, the decoder's
# rates and kernels in the release's pattern, three AMP blocks a level, 4 heads pooled from 16 to 8 channels
RELEASED_LAYOUT = dict(
    encoder_dim=4, encoder_rates=[2, 2, 2, 5], latent_dim=64, latent_channels=8, num_attention_heads=4,
    decoder_dim=32, decoder_rates=[5, 2, 2, 2], decoder_kernel_sizes=[9, 4, 4, 4], resblock_kernel_sizes=[3, 5, 7],
    resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
)  # fmt: skip
# odd strides and a hop of 12, kernels longer than their rates by an odd count (diffusers' lengths then differ
# from T x hop), a head width pooled unevenly (20 to 6), other dilations, one AMP block a level
OTHER_CONFIG = dict(
    encoder_dim=2, encoder_rates=[3, 4], latent_dim=60, latent_channels=6, num_attention_heads=3, decoder_dim=16,
    decoder_rates=[4, 3], decoder_kernel_sizes=[7, 4], resblock_kernel_sizes=[5], resblock_dilation_sizes=[[1, 2]],
    latents_mean=[0.0] * 6, latents_std=[1.0] * 6,
)  # fmt: skip

TESTING = FamilyTesting(
    small_configs={"default-arch": RELEASED_LAYOUT, "other-config": OTHER_CONFIG},
    parity_frames=((1,), (1,)),
    # latent frames decoded: one, and a length the attention's causality shows in; samples encoded: one hop, and
    # several hops off the hop (zero-padded)
    parity_latent_sizes=((1,), (9,)),
    parity_video_sizes=((40,), (157,)),
    tiling={},
    meshes={},
    export=("default-arch", "other-config"),
    decode_steps=1,
    full_size=False,  # 151 M parameters: the benchmark converts it at full size
)
