"""LTX-2's vocoders' test data (models/common/testing.py says who reads it)."""

from __future__ import annotations

from ..common.testing import FamilyTesting, OriginalFileCase

# LTX-2.0's layout at small widths: leaky ReLUs, tanh, three parallel resblocks a level
RELEASED_LAYOUT = dict(
    in_channels=16, hidden_channels=32, upsample_kernel_sizes=[8, 5, 4], upsample_factors=[4, 3, 2],
    resnet_kernel_sizes=[3, 5, 7], resnet_dilations=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
)  # fmt: skip
# anti-aliased Snake without beta, a clamp, no output bias, two resblocks of other dilations, mono
SNAKE = dict(
    in_channels=8, hidden_channels=16, out_channels=1, upsample_kernel_sizes=[6, 4], upsample_factors=[4, 2],
    resnet_kernel_sizes=[3, 5], resnet_dilations=[[1, 2], [1, 3]], act_fn="snake", antialias=True,
    antialias_kernel_size=8, final_act_fn="clamp", final_bias=False,
)  # fmt: skip

# LTX-2.3's layout at small widths: SnakeBeta anti-aliased, the STFT of the 16 kHz waveform, the extender at 3x
BWE_LAYOUT = dict(
    in_channels=32, hidden_channels=32, upsample_kernel_sizes=[8, 4], upsample_factors=[4, 4],
    resnet_kernel_sizes=[3, 5], resnet_dilations=[[1, 3], [1, 3]],
    bwe_in_channels=32, bwe_hidden_channels=16, bwe_upsample_kernel_sizes=[7, 32], bwe_upsample_factors=[3, 16],
    bwe_resnet_kernel_sizes=[3], bwe_resnet_dilations=[[1, 3, 5]],
    filter_length=64, window_length=64, hop_length=16, num_mel_channels=16,
)  # fmt: skip
# a leaky-ReLU vocoder with tanh before a Snake extender at 2x, mono, another STFT
BWE_LEAKY = dict(
    in_channels=16, hidden_channels=16, out_channels=1, upsample_kernel_sizes=[8, 6], upsample_factors=[4, 4],
    resnet_kernel_sizes=[3], resnet_dilations=[[1, 2]], act_fn="leaky_relu", antialias=False, final_act_fn="tanh",
    final_bias=True, bwe_in_channels=16, bwe_out_channels=1, bwe_hidden_channels=8, bwe_upsample_kernel_sizes=[8, 4],
    bwe_upsample_factors=[8, 4], bwe_act_fn="snake", bwe_resnet_kernel_sizes=[3], bwe_resnet_dilations=[[1]],
    filter_length=32, window_length=32, hop_length=16, num_mel_channels=16, input_sampling_rate=8000,
    output_sampling_rate=16000,
)  # fmt: skip


# the released block structures (LTX-2.0: five upsamplers; LTX-2.3: six, and five in the extender; three resblocks
# each), whose keys the pairings list, at small widths
RELEASED_BLOCKS = dict(
    upsample_kernel_sizes=[4, 3, 3, 3, 3], upsample_factors=[2, 1, 1, 1, 1],
    resnet_kernel_sizes=[3, 3, 3], resnet_dilations=[[1, 3, 5]] * 3,
)  # fmt: skip
RELEASED_BWE_BLOCKS = dict(
    hidden_channels=64, upsample_kernel_sizes=[4, 3, 3, 3, 3, 3], upsample_factors=[2, 1, 1, 1, 1, 1],
    resnet_kernel_sizes=[3, 3, 3], resnet_dilations=[[1, 3, 5]] * 3,
    bwe_hidden_channels=32, bwe_upsample_kernel_sizes=[5, 4, 3, 3, 3], bwe_upsample_factors=[3, 2, 1, 1, 1],
    bwe_resnet_kernel_sizes=[3, 3, 3], bwe_resnet_dilations=[[1, 3, 5]] * 3,
    filter_length=8, window_length=8, hop_length=2,
)  # fmt: skip


def vocoder_testing(
    default: dict, other: dict, bins: int, original: str, file_name: str, released: dict
) -> FamilyTesting:
    return FamilyTesting(
        small_configs={"default-arch": default, "other": other},
        parity_frames=((1,), (1,)),
        # (mel frames, mel bins) decoded: one frame, and an odd count (no encoder: no encode sizes)
        parity_latent_sizes=((1, bins), (7, bins)),
        parity_video_sizes=(),
        tiling={},
        meshes={},
        export=("default-arch", "other"),
        original_files={original: OriginalFileCase("default-arch", file_name, config_changes=released)},
        decode_steps=1,
        full_size=False,  # 56 M and 129 M parameters: the benchmark converts them at full size
    )


TESTING = vocoder_testing(RELEASED_LAYOUT, SNAKE, 8, "ltx-2", "ltx-2-19b-dev.safetensors", RELEASED_BLOCKS)
TESTING_BWE = vocoder_testing(BWE_LAYOUT, BWE_LEAKY, 16, "ltx-2.3", "ltx-2.3-22b-dev.safetensors", RELEASED_BWE_BLOCKS)
