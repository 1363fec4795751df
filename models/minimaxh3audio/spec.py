"""MiniMax-H3's audio VAE (diffusers' `AutoencoderKLMiniMaxH3Audio`), the `audio_vae` of MiniMax-H3 pipelines: mono
32 kHz waveforms (B, 1, samples) to latents (B, 32, samples / 800) and back; stereo is a batch of two."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import AutoencoderKLMiniMaxH3AudioConfig

AUDIO_VAE = "audio_vae"

MINIMAXH3AUDIO = FamilySpec(
    name="minimaxh3audio",
    config_class=AutoencoderKLMiniMaxH3AudioConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLMiniMaxH3Audio"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLMiniMaxH3Audio"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="minimaxh3audio.yaml",
    # the MiniMax-H3 pipelines' audio VAE, beside their video VAE (family minimaxh3)
    models=(ModelName("minimax-h3", "MiniMaxAI/MiniMax-H3", subfolder=AUDIO_VAE),),
    # a waveform (B, 1, samples), no frame axis: validation decodes 4 latent frames and encodes the 4 hops of
    # samples they decode to
    validation_latent_shape=lambda c: (1, c.latent_channels, 4),
    validation_sample_shape=lambda c: (1, 1, 4 * c.hop),
    native_size=(320_000,),  # 10 s at 32 kHz (400 latent frames)
    frame_axis=False,
    encode_outputs=("mean", "logs"),  # the posterior's mean and log standard deviation, as diffusers' holds them
    clamps_output=True,
    component=AUDIO_VAE,
    sample_rate=lambda c: c.sampling_rate,
    # every module: the DAC/BigVGAN stack degrades audibly in bfloat16 (diffusers' note), so every output is float32
    keep_in_float32=("encoder", "decoder", "pre_block", "dec_in_proj", "mean_proj", "logs_proj"),
)
