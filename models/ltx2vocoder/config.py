"""LTX-2's vocoders' configurations (diffusers' `LTX2Vocoder`, LTX-2.0's, and `LTX2VocoderWithBWE`, LTX-2.3's and
2.5's), read from a diffusers `config.json`; shared by both implementations."""

from __future__ import annotations

import dataclasses
import math

from ..common.config import MULTIPLIER, STRIDE, WIDTH, Bound, ConfigError, DiffusersConfig

SAMPLE_RATE = Bound(768_000, "a sample rate in Hz; released vocoders give up to 48 kHz")
KERNEL = Bound(64, "a 1-D kernel size; released vocoders use up to 16")
DILATION = Bound(64, "a dilation; released vocoders use up to 5")
STFT = Bound(8192, "an STFT length in samples; the released one uses 512")
ACTIVATIONS = ("leaky_relu", "snake", "snakebeta")
FINAL_ACTIVATIONS = ("tanh", "clamp", None)


@dataclasses.dataclass(frozen=True)
class LTX2VocoderConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `LTX2Vocoder.__init__` (LTX-2.0's released vocoder's)."""

    in_channels: int = 128
    hidden_channels: int = 1024
    out_channels: int = 2
    upsample_kernel_sizes: tuple[int, ...] = (16, 15, 8, 4, 4)
    upsample_factors: tuple[int, ...] = (6, 5, 2, 2, 2)
    resnet_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resnet_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    act_fn: str = "leaky_relu"
    leaky_relu_negative_slope: float = 0.1
    antialias: bool = False
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    final_act_fn: str | None = "tanh"
    final_bias: bool = True
    output_sampling_rate: int = 24000

    class_name = "LTX2Vocoder"
    bounds = {
        "in_channels": WIDTH,
        "hidden_channels": WIDTH,
        "out_channels": WIDTH,
        "upsample_kernel_sizes": KERNEL,
        "upsample_factors": STRIDE,
        "resnet_kernel_sizes": KERNEL,
        "resnet_dilations": DILATION,
        "antialias_ratio": MULTIPLIER,
        "antialias_kernel_size": KERNEL,
        "output_sampling_rate": SAMPLE_RATE,
    }

    @property
    def variant(self) -> str:
        return "LTX-2 vocoder"

    @property
    def latent_scaling(self) -> str:
        return "none: it takes the audio VAE's decoded mel spectrogram"

    @property
    def hop(self) -> int:
        """Waveform samples per mel frame."""
        return math.prod(self.upsample_factors)

    @property
    def mel_channels(self) -> tuple[int, int]:
        """(channels, mel bins) of the spectrogram it takes, whose product is in_channels: LTX-2's stereo mel
        (2, 64) when out_channels divides it, else one channel."""
        channels = self.out_channels if self.in_channels % self.out_channels == 0 else 1
        return channels, self.in_channels // channels

    def resnet_widths(self) -> list[int]:
        """The width after each upsampler: halved each time."""
        return [self.hidden_channels // 2 ** (i + 1) for i in range(len(self.upsample_factors))]

    def ensure_supported(self):
        if self.act_fn not in ACTIVATIONS:
            raise ConfigError(f"config.json: act_fn {self.act_fn!r} is not one of {list(ACTIVATIONS)}")
        if self.final_act_fn not in FINAL_ACTIVATIONS:
            raise ConfigError(f"config.json: final_act_fn {self.final_act_fn!r} is not one of tanh, clamp, null")
        if len(self.upsample_kernel_sizes) != len(self.upsample_factors):
            raise ConfigError("config.json: upsample_kernel_sizes and upsample_factors differ in length")
        if len(self.resnet_kernel_sizes) != len(self.resnet_dilations):
            raise ConfigError("config.json: resnet_kernel_sizes and resnet_dilations differ in length")
        if self.act_fn == "leaky_relu" and self.antialias:
            # diffusers' ResBlock wraps its second activations in one anti-aliasing filter more each time
            raise ConfigError("config.json: antialias with act_fn leaky_relu is not supported (no released vocoder)")
        if min(self.resnet_widths()) < 1:
            raise ConfigError("config.json: hidden_channels is halved per upsampler and must stay at least 1")
        if any(k < s for k, s in zip(self.upsample_kernel_sizes, self.upsample_factors)):
            raise ConfigError("config.json: an upsample kernel is shorter than its factor")


@dataclasses.dataclass(frozen=True)
class LTX2VocoderWithBWEConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `LTX2VocoderWithBWE.__init__` (LTX-2.3's and 2.5's released vocoder's):
    a vocoder, the mel spectrogram of its waveform, and a bandwidth-extension vocoder of that (`bwe_*`)."""

    in_channels: int = 128
    hidden_channels: int = 1536
    out_channels: int = 2
    upsample_kernel_sizes: tuple[int, ...] = (11, 4, 4, 4, 4, 4)
    upsample_factors: tuple[int, ...] = (5, 2, 2, 2, 2, 2)
    resnet_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resnet_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    act_fn: str = "snakebeta"
    leaky_relu_negative_slope: float = 0.1
    antialias: bool = True
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    final_act_fn: str | None = None
    final_bias: bool = False
    bwe_in_channels: int = 128
    bwe_hidden_channels: int = 512
    bwe_out_channels: int = 2
    bwe_upsample_kernel_sizes: tuple[int, ...] = (12, 11, 4, 4, 4)
    bwe_upsample_factors: tuple[int, ...] = (6, 5, 2, 2, 2)
    bwe_resnet_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    bwe_resnet_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    bwe_act_fn: str = "snakebeta"
    bwe_leaky_relu_negative_slope: float = 0.1
    bwe_antialias: bool = True
    bwe_antialias_ratio: int = 2
    bwe_antialias_kernel_size: int = 12
    bwe_final_act_fn: str | None = None
    bwe_final_bias: bool = False
    filter_length: int = 512
    hop_length: int = 80
    window_length: int = 512
    num_mel_channels: int = 64
    input_sampling_rate: int = 16000
    output_sampling_rate: int = 48000

    class_name = "LTX2VocoderWithBWE"
    bounds = {
        **{f"{prefix}{name}": bound for prefix in ("", "bwe_") for name, bound in LTX2VocoderConfig.bounds.items()
           if name != "output_sampling_rate"},
        "filter_length": STFT,
        "hop_length": STFT,
        "window_length": STFT,
        "num_mel_channels": WIDTH,
        "input_sampling_rate": SAMPLE_RATE,
        "output_sampling_rate": SAMPLE_RATE,
    }  # fmt: skip

    @property
    def variant(self) -> str:
        return "LTX-2 vocoder with bandwidth extension"

    @property
    def latent_scaling(self) -> str:
        return "none: it takes the audio VAE's decoded mel spectrogram"

    def stage(self, prefix: str, output_sampling_rate: int) -> LTX2VocoderConfig:
        """The config of its vocoder (prefix "") or its bandwidth extender ("bwe_"), as diffusers builds them."""
        fields = {f.name: getattr(self, prefix + f.name) for f in dataclasses.fields(LTX2VocoderConfig)
                  if f.name != "output_sampling_rate"}  # fmt: skip
        return LTX2VocoderConfig(**fields, output_sampling_rate=output_sampling_rate)

    @property
    def vocoder(self) -> LTX2VocoderConfig:
        return self.stage("", self.input_sampling_rate)

    @property
    def bwe(self) -> LTX2VocoderConfig:
        return self.stage("bwe_", self.output_sampling_rate)

    @property
    def mel_channels(self) -> tuple[int, int]:
        return self.vocoder.mel_channels

    @property
    def resample_ratio(self) -> int:
        return self.output_sampling_rate // self.input_sampling_rate

    def ensure_supported(self):
        self.vocoder.ensure_supported()
        self.bwe.ensure_supported()
        if any(
            (k - s) % 2 for c in (self.vocoder, self.bwe) for k, s in zip(c.upsample_kernel_sizes, c.upsample_factors)
        ):
            raise ConfigError(
                "config.json: an upsample kernel and its factor differ by an odd number: the waveform would not be "
                "T x hop samples long, which the bandwidth extension adds up"
            )
        if self.output_sampling_rate % self.input_sampling_rate:
            raise ConfigError("config.json: output_sampling_rate must be a multiple of input_sampling_rate")
        if self.out_channels * self.num_mel_channels != self.bwe_in_channels:
            raise ConfigError(
                "config.json: bwe_in_channels must be out_channels x num_mel_channels (the bandwidth extender takes "
                "the vocoder's waveform's mel spectrogram)"
            )
        if self.bwe.hop != self.hop_length * self.resample_ratio:
            raise ConfigError(
                "config.json: the bandwidth extender's upsampling must be hop_length x the sampling-rate ratio, so "
                "that its output and the resampled waveform have one length"
            )
        if self.window_length != self.filter_length or self.hop_length > self.window_length:
            # a shorter window gives fewer mel frames than the waveform has hops: diffusers' sum would not fit
            raise ConfigError("config.json: the STFT takes window_length = filter_length >= hop_length")
