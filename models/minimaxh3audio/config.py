"""MiniMax-H3's audio VAE configuration (diffusers' `AutoencoderKLMiniMaxH3Audio`), read from a diffusers
`config.json`; shared by both implementations."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..common.config import MULTIPLIER, STRIDE, WIDTH, Bound, ConfigError, DiffusersConfig

SAMPLE_RATE = Bound(768_000, "a sample rate in Hz; the released audio VAE runs at 32 kHz")
KERNEL = Bound(64, "a 1-D kernel size; the released audio VAE uses up to 11")
DILATION = Bound(64, "a dilation; the released audio VAE uses up to 5")


@dataclasses.dataclass(frozen=True)
class AutoencoderKLMiniMaxH3AudioConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLMiniMaxH3Audio.__init__` (the released audio VAE's)."""

    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 4, 5, 5)
    latent_dim: int = 2048
    latent_channels: int = 32
    num_attention_heads: int = 8
    decoder_dim: int = 1024
    decoder_rates: tuple[int, ...] = (5, 5, 2, 2, 2, 2, 2)
    decoder_kernel_sizes: tuple[int, ...] = (9, 9, 4, 4, 4, 4, 4)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    sampling_rate: int = 32000
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None

    class_name = "AutoencoderKLMiniMaxH3Audio"
    bounds = {
        "encoder_dim": WIDTH,
        "encoder_rates": STRIDE,
        "latent_dim": WIDTH,
        "latent_channels": WIDTH,
        "num_attention_heads": MULTIPLIER,
        "decoder_dim": WIDTH,
        "decoder_rates": STRIDE,
        "decoder_kernel_sizes": KERNEL,
        "resblock_kernel_sizes": KERNEL,
        "resblock_dilation_sizes": DILATION,
        "sampling_rate": SAMPLE_RATE,
    }

    @property
    def variant(self) -> str:
        return "MiniMax-H3 audio VAE"

    @property
    def latent_scaling(self) -> str:
        return "per channel: (z - latents_mean) / latents_std (config); stereo as a batch of two mono waveforms"

    @property
    def hop(self) -> int:
        """Waveform samples per latent frame: the encoder's strides, and the decoder's upsampling."""
        return math.prod(self.encoder_rates)

    @property
    def head_dim(self) -> int:
        return self.latent_dim // self.num_attention_heads

    def encoder_widths(self) -> list[int]:
        """The width after the first convolution and after each strided block: doubled each time."""
        return [self.encoder_dim * 2**i for i in range(len(self.encoder_rates) + 1)]

    def decoder_widths(self) -> list[int]:
        """The width before the first upsampler and after each: halved each time."""
        return [self.decoder_dim // 2**i for i in range(len(self.decoder_rates) + 1)]

    def ensure_supported(self):
        if math.prod(self.decoder_rates) != self.hop:
            raise ConfigError(f"config.json: decoder_rates must upsample by the encoder's hop ({self.hop})")
        if len(self.decoder_kernel_sizes) != len(self.decoder_rates):
            raise ConfigError("config.json: decoder_kernel_sizes and decoder_rates differ in length")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ConfigError("config.json: resblock_kernel_sizes and resblock_dilation_sizes differ in length")
        if self.latent_dim % self.latent_channels:
            raise ConfigError("config.json: latent_dim must be a multiple of latent_channels")
        if self.latent_dim % self.num_attention_heads:
            raise ConfigError("config.json: latent_dim must be a multiple of num_attention_heads")
        if self.head_dim < self.latent_channels:
            raise ConfigError("config.json: latent_dim / num_attention_heads is pooled to latent_channels, not below")
        if min(self.decoder_widths()) < 1:
            raise ConfigError("config.json: decoder_dim is halved per upsampler and must stay at least 1")
        if any(k < r for k, r in zip(self.decoder_kernel_sizes, self.decoder_rates)):
            raise ConfigError("config.json: a decoder kernel is shorter than its rate")
        if any(k % 2 == 0 for k in self.resblock_kernel_sizes):
            # an AMP block adds each convolution's output to its input: an even kernel's is a sample shorter
            raise ConfigError("config.json: resblock_kernel_sizes must be odd")
        for name in ("latents_mean", "latents_std"):
            values = getattr(self, name)
            if values is not None and len(values) != self.latent_channels:
                raise ConfigError(f"config.json: {name} takes one value per latent channel")


def adaptive_pool_matrix(length: int, size: int) -> np.ndarray:
    """(length, size): PyTorch's adaptive average pooling of `length` values to `size` as a matrix, window i
    averaging [floor(i L / n), ceil((i + 1) L / n))."""
    matrix = np.zeros((length, size), np.float32)
    for i in range(size):
        start, end = i * length // size, -(-(i + 1) * length // size)
        matrix[start:end, i] = 1.0 / (end - start)
    return matrix
