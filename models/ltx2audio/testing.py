"""LTX-2's audio VAE's test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting, OriginalFileCase

# the released layout at small widths: pixel norms, causal in time, three levels, no attention
RELEASED_LAYOUT = dict(base_channels=16, ch_mult=[1, 2, 4], num_res_blocks=1, latent_channels=4, mel_bins=16)
# attention in the mid blocks and at the first level's resolution, two levels, another width and mel bins
WITH_ATTENTION = dict(
    base_channels=8, ch_mult=[1, 2], num_res_blocks=2, latent_channels=4, mel_bins=12, resolution=64,
    attn_resolutions=[64], mid_block_add_attention=True,
)  # fmt: skip

TESTING = FamilyTesting(
    small_configs={"default-arch": RELEASED_LAYOUT, "with-attention": WITH_ATTENTION},
    parity_frames=((1,), (1,)),
    # (latent frames, latent mel bins) decoded, (mel frames, mel bins) encoded: a latent of one frame (decoded to
    # one, past the causal crop), an odd one, and spectrograms off the hop, longer and shorter than the mel bins
    parity_latent_sizes=((1, 4), (5, 3)),
    parity_video_sizes=((9, 16), (13, 10), (6, 16)),
    tiling={},
    meshes={},
    export=("default-arch", "with-attention"),
    # the released block structure (two resnets a level), whose keys the pairings list
    original_files={
        "ltx-2": OriginalFileCase("default-arch", "ltx-2-19b-dev.safetensors", config_changes=dict(num_res_blocks=2))
    },
    # group norms (32 groups), which diffusers takes only where nothing is causal
    check_configs=(
        ("ltx2audio-group-norm", dict(RELEASED_LAYOUT, base_channels=32, norm_type="group", causality_axis="none")),
    ),
    decode_steps=1,
)
