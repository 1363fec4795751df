"""MiniMax-H3's video VAE (diffusers' `AutoencoderKLMiniMaxH3`): a causal Conv3d encoder run a 17-frame clip at a
time and a ViT decoder run a chunk of latent frames at a time, tiled by default."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import AutoencoderKLMiniMaxH3Config

MINIMAXH3 = FamilySpec(
    name="minimaxh3",
    config_class=AutoencoderKLMiniMaxH3Config,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLMiniMaxH3"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLMiniMaxH3"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="minimaxh3.yaml",
    models=(
        # one VAE for the t2va, fl2va and ref2va workflows (the repo's transformer/ and transformer_ref/)
        ModelName("minimax-h3", "MiniMaxAI/MiniMax-H3"),
        # lightx2v's LightVAE: the ViT decoder pruned to 12 blocks, the encoder and latents H3's own
        ModelName("minimax-h3-lightvae", "diffusers-modular/MiniMax-H3-LightVAE", config=dict(decoder_num_layers=12)),
    ),
    # one decoded chunk of 7 latent frames (the fewest a clip's encode gives beyond one image: 5 n + 2), and the 22
    # frames (17 n + 5) that encode to it in two clips; 2 x 2 latents, inside one tile
    validation_latent_shape=lambda c: (1, c.latent_channels, c.tokens_chunk_size + c.token_overlap, 2, 2),
    validation_sample_shape=lambda c: (
        1,
        c.in_channels,
        c.decoded_frames(c.tokens_chunk_size + c.token_overlap),
        2 * c.spatial_ratio,
        2 * c.spatial_ratio,
    ),
    native_size=(124, 768, 1344),  # 4 s at 30 frames a second (17 x 7 + 5)
    # the encoder and the cast-sensitive decoder modules; the ViT's projections take the output's dtype
    keep_in_float32=("encoder", "quant_conv", "norm1", "norm2", "norm_out", "scale1", "scale2"),
)
