"""The Wan 2.1 VAE configuration, read from a diffusers `config.json`; shared by both implementations."""

from __future__ import annotations

import dataclasses

from ..common.config import ConfigError, DiffusersConfig
from ..common.tiling import TilePlan

WAN21_LATENTS_MEAN = [
    -0.7571,
    -0.7089,
    -0.9113,
    0.1075,
    -0.1745,
    0.9653,
    -0.1517,
    1.5508,
    0.4134,
    -0.0715,
    0.5517,
    -0.3632,
    -0.1922,
    -0.9497,
    0.2503,
    -0.2921,
]
WAN21_LATENTS_STD = [
    2.8184,
    1.4541,
    2.3275,
    2.6558,
    1.2196,
    1.7708,
    2.6052,
    2.0743,
    3.2687,
    2.1526,
    2.8652,
    1.5579,
    1.6382,
    1.1253,
    2.8251,
    1.9160,
]


@dataclasses.dataclass(frozen=True)
class WanVAEConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLWan.__init__`."""

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    latents_mean: tuple[float, ...] = tuple(WAN21_LATENTS_MEAN)
    latents_std: tuple[float, ...] = tuple(WAN21_LATENTS_STD)
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int | None = 4
    scale_factor_spatial: int | None = 8

    class_name = "AutoencoderKLWan"

    def ensure_supported(self):
        if self.is_residual or self.patch_size is not None:
            raise ConfigError(
                "config.json describes a Wan 2.2 VAE (is_residual / patch_size); only Wan 2.1 is supported"
            )
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ConfigError("config.json: temperal_downsample needs one entry per dim_mult level but the last")

    @property
    def temperal_upsample(self) -> tuple[bool, ...]:
        return tuple(reversed(self.temperal_downsample))


def encode_chunks(num_frames: int) -> list[tuple[int, int]]:
    """diffusers' encoder chunks: the first frame alone, then 4 at a time; frames past the last full chunk drop."""
    return [(0, 1)] + [(1 + 4 * i, 5 + 4 * i) for i in range((num_frames - 1) // 4)]


def decode_chunks(num_frames: int) -> list[tuple[int, int]]:
    """One latent frame a step."""
    return [(i, i + 1) for i in range(num_frames)]


@dataclasses.dataclass(frozen=True)
class WanTiling:
    """diffusers' `AutoencoderKLWan.enable_tiling` keywords and defaults, in pixels."""

    tile_sample_min_height: int = 256
    tile_sample_min_width: int = 256
    tile_sample_stride_height: int = 192
    tile_sample_stride_width: int = 192

    def plans(self, config: WanVAEConfig) -> dict[str, TilePlan]:
        ratio = config.scale_factor_spatial  # diffusers' spatial_compression_ratio, as it uses it
        sample_min = (self.tile_sample_min_height, self.tile_sample_min_width)
        sample_stride = (self.tile_sample_stride_height, self.tile_sample_stride_width)
        latent_min = tuple(s // ratio for s in sample_min)
        latent_stride = tuple(s // ratio for s in sample_stride)
        return {
            "decoder": TilePlan(
                latent_min,
                latent_stride,
                blend=_minus(sample_min, sample_stride),
                keep=sample_stride,
                crop_scale=(ratio, 1),
            ),
            "encoder": TilePlan(
                sample_min,
                sample_stride,
                blend=_minus(latent_min, latent_stride),
                keep=latent_stride,
                crop_scale=(1, ratio),
            ),
        }


def _minus(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] - b[0], a[1] - b[1])
