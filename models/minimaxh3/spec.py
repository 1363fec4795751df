"""MiniMax-H3's video VAE (diffusers' `AutoencoderKLMiniMaxH3`): a causal Conv3d encoder run a 17-frame clip at a
time and a ViT decoder run a chunk of latent frames at a time, tiled by default."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import AutoencoderKLMiniMaxH3Config

# the latents' per-channel statistics of the released config (video_vae/config.json; the pipelines normalise by
# them, diffusers' class defaults to zeros and ones): what an original file, which brings no config, is converted with
RELEASED_LATENTS = dict(
    latents_mean=[
        0.858090341091156, -0.9606591463088989, 1.0661640167236328, -0.5090325474739075, -0.2727581858634949,
        -1.3675414323806763, -0.2553254961967468, -0.26907554268836975, -0.5376840829849243, -0.0464097298681736,
        0.6657370328903198, 0.19690127670764923, -0.5460608005523682, -0.4035342037677765, -0.23683024942874908,
        0.25928452610969543, -0.30133944749832153, 0.211341992020607, -1.1206848621368408, 0.3581933379173279,
        -0.04225143790245056, 0.2604829967021942, 0.22864092886447906, 0.7056031823158264,
    ],
    latents_std=[
        1.2223774194717407, 1.2767263650894165, 1.6831774711608887, 1.7549455165863037, 1.5636216402053833,
        2.194143533706665, 0.9653137922286987, 1.0569885969161987, 0.841948926448822, 0.7729952931404114,
        1.8955937623977661, 0.946841835975647, 0.7996809482574463, 0.44988900423049927, 0.7197399735450745,
        0.6936293244361877, 2.961095094680786, 2.7694199085235596, 3.0496184825897217, 2.1088054180145264,
        3.276226282119751, 3.1627357006073, 2.2816812992095947, 2.6127843856811523,
    ],
)  # fmt: skip

MINIMAXH3 = FamilySpec(
    name="minimaxh3",
    config_class=AutoencoderKLMiniMaxH3Config,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLMiniMaxH3"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLMiniMaxH3"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="minimaxh3.yaml",
    models=(
        # one VAE for the t2va, fl2va and ref2va workflows (the repo's transformer/ and transformer_ref/)
        ModelName("minimax-h3", "MiniMaxAI/MiniMax-H3", config=RELEASED_LATENTS),
        # lightx2v's LightVAE: the ViT decoder pruned to 12 blocks, the encoder and latents H3's own
        ModelName(
            "minimax-h3-lightvae",
            "diffusers-modular/MiniMax-H3-LightVAE",
            config=dict(decoder_num_layers=12, **RELEASED_LATENTS),
        ),
    ),
    # one decoded chunk of 7 latent frames (the fewest a clip's encode gives beyond one image: 5 n + 2), and the 22
    # frames (17 n + 5) that encode to it in two clips; 2 x 2 latents, inside one tile
    validation_latent_shape=lambda c: (1, c.latent_channels, c.tokens_chunk_size + c.token_overlap, 2, 2),
    validation_sample_shape=lambda c: (
        1,
        c.in_channels,
        c.validation_frames,
        2 * c.spatial_ratio,
        2 * c.spatial_ratio,
    ),
    native_size=(124, 768, 1344),  # 4 s at 30 frames a second (17 x 7 + 5)
    # the encoder and the cast-sensitive decoder modules; the ViT's projections take the output's dtype
    keep_in_float32=("encoder", "quant_conv", "norm1", "norm2", "norm_out", "scale1", "scale2"),
)
