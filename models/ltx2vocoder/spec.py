"""LTX-2's vocoders, the `vocoder` of LTX-2 pipelines: diffusers' `LTX2Vocoder` (LTX-2.0: mel spectrograms
(B, 2, T, 64) to 24 kHz stereo waveforms, 240 samples a frame) and `LTX2VocoderWithBWE` (LTX-2.3 and 2.5: to 16 kHz,
then bandwidth-extended to 48 kHz, 480 samples a frame). Decoders only."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import LTX2VocoderConfig, LTX2VocoderWithBWEConfig

VOCODER = "vocoder"


def mel_shape(config, frames: int) -> tuple[int, ...]:
    """A spectrogram of `frames` mel frames, its channels and mel bins as the config's in_channels splits."""
    return (1, *config.mel_channels[:1], frames, config.mel_channels[1])


def family(name: str, config_class, testing: str, models: tuple[ModelName, ...]) -> FamilySpec:
    return FamilySpec(
        name=name,
        config_class=config_class,
        flax_model=lazy(__package__, ".modeling_flax", config_class.class_name),
        torch_model=lazy(__package__, ".modeling_torch", config_class.class_name),
        testing=lazy(__package__, ".testing", testing),
        mapping_file="ltx2vocoder.yaml",
        models=models,
        # 0.2 s of LTX-2's mel (20 frames at 100 a second); a decoder alone has no sample to encode
        validation_latent_shape=lambda c: mel_shape(c, 20),
        validation_sample_shape=None,
        native_size=(997, 64),  # 10 s of mel frames
        frame_axis=False,
        parts=("decoder",),
        encode_outputs=(),
        clamps_output=True,  # tanh or a clamp: its waveforms lie in [-1, 1]
        component=VOCODER,
        diffusers_module="diffusers.pipelines.ltx2.vocoder",  # beside its pipelines, not among diffusers' models
        sample_rate=lambda c: c.output_sampling_rate,
    )


LTX2VOCODER = family(
    "ltx2vocoder", LTX2VocoderConfig, "TESTING", (ModelName("ltx-2", "Lightricks/LTX-2", subfolder=VOCODER),)
)
LTX2VOCODERBWE = family(
    "ltx2vocoderbwe",
    LTX2VocoderWithBWEConfig,
    "TESTING_BWE",
    (
        ModelName("ltx-2.3", "diffusers/LTX-2.3-Diffusers", subfolder=VOCODER),
        ModelName("ltx-2.5", "Lightricks/LTX-2.5-Diffusers", subfolder=VOCODER, verified=False),
    ),
)
