"""LTX-2's audio VAE (diffusers' `AutoencoderKLLTX2Audio`), the `audio_vae` of LTX-2, 2.3 and 2.5 pipelines (one
config for all three): mel spectrograms (B, 2, T, 64) to latents (B, 8, T/4, 16), decoded to 4T - 3 frames."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import AutoencoderKLLTX2AudioConfig

AUDIO_VAE = "audio_vae"

LTX2AUDIO = FamilySpec(
    name="ltx2audio",
    config_class=AutoencoderKLLTX2AudioConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLLTX2Audio"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLLTX2Audio"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="ltx2audio.yaml",
    # the LTX-2 pipelines' audio VAE, beside their video VAE (family ltx2) and vocoder
    models=(
        ModelName("ltx-2", "Lightricks/LTX-2", subfolder=AUDIO_VAE),
        ModelName("ltx-2.3", "diffusers/LTX-2.3-Diffusers", subfolder=AUDIO_VAE),
        ModelName("ltx-2.5", "Lightricks/LTX-2.5-Diffusers", subfolder=AUDIO_VAE, verified=False),
    ),
    # a spectrogram (B, C, T, mel bins), no frame axis: validation decodes 3 latent frames and encodes the 9 mel
    # frames they decode to (4T - 3)
    validation_latent_shape=lambda c: (1, c.latent_channels, 3, (c.mel_bins or 64) // c.mel_ratio),
    validation_sample_shape=lambda c: (1, c.in_channels, 9, c.mel_bins or 64),
    recorded_tensors=("latents_mean", "latents_std"),
    native_size=(997, 64),  # 10 s at 100 mel frames a second (250 latent frames)
    frame_axis=False,
    component=AUDIO_VAE,
)
