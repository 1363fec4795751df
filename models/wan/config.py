"""The Wan 2.1 VAE configuration, read from a diffusers `config.json`; shared by both implementations."""

from __future__ import annotations

import dataclasses
import typing

from ..common.config import LAYERS, MULTIPLIER, STRIDE, WIDTH, ConfigError, DiffusersConfig, Level
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

WAN22_LATENTS_MEAN = [
    -0.2289,
    -0.0052,
    -0.1323,
    -0.2339,
    -0.2799,
    0.0174,
    0.1838,
    0.1557,
    -0.1382,
    0.0542,
    0.2813,
    0.0891,
    0.157,
    -0.0098,
    0.0375,
    -0.1825,
    -0.2246,
    -0.1207,
    -0.0698,
    0.5109,
    0.2665,
    -0.2108,
    -0.2158,
    0.2502,
    -0.2055,
    -0.0322,
    0.1109,
    0.1567,
    -0.0729,
    0.0899,
    -0.2799,
    -0.123,
    -0.0313,
    -0.1649,
    0.0117,
    0.0723,
    -0.2839,
    -0.2083,
    -0.052,
    0.3748,
    0.0152,
    0.1957,
    0.1433,
    -0.2944,
    0.3573,
    -0.0548,
    -0.1681,
    -0.0667,
]
WAN22_LATENTS_STD = [
    0.4765,
    1.0364,
    0.4514,
    1.1677,
    0.5313,
    0.499,
    0.4818,
    0.5013,
    0.8158,
    1.0344,
    0.5894,
    1.0901,
    0.6885,
    0.6165,
    0.8454,
    0.4978,
    0.5759,
    0.3523,
    0.7135,
    0.6804,
    0.5833,
    1.4146,
    0.8986,
    0.5659,
    0.7069,
    0.5338,
    0.4889,
    0.4917,
    0.4069,
    0.4999,
    0.6866,
    0.4093,
    0.5709,
    0.6065,
    0.6415,
    0.4944,
    0.5726,
    1.2042,
    0.5458,
    1.6887,
    0.3971,
    1.06,
    0.3943,
    0.5537,
    0.5444,
    0.4089,
    0.7468,
    0.7744,
]

# Wan 2.2 TI2V-5B's VAE, as its published config.json describes it: what differs from the defaults (Wan 2.1's)
WAN22_CONFIG = dict(
    base_dim=160,
    decoder_base_dim=256,
    z_dim=48,
    is_residual=True,
    patch_size=2,
    in_channels=12,
    out_channels=12,
    scale_factor_spatial=16,
    latents_mean=WAN22_LATENTS_MEAN,
    latents_std=WAN22_LATENTS_STD,
)


class WanLayout:
    """Wan's architecture read from a config: what the models, the tiling and the registry ask of it. The configs of
    the classes diffusers builds on it (`AutoencoderKLWan`, `AutoencoderKLQwenImage`, `AutoencoderKLQwenImage21`)
    provide the fields used here."""

    frames: typing.ClassVar[int | None] = None  # the frames every input has (1: an image model's); None: any

    def ensure_supported(self):
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ConfigError("config.json: temperal_downsample needs one entry per dim_mult level but the last")
        patch_area = self.patch * self.patch
        if self.in_channels % patch_area or self.out_channels % patch_area:
            raise ConfigError(
                f"config.json: in_channels and out_channels must be multiples of patch_size**2 ({patch_area})"
            )
        if self.is_residual:
            self._ensure_shortcuts_fit()

    def _ensure_shortcuts_fit(self):
        """The residual blocks' parameter-free shortcuts regroup channels: each level's widths must divide evenly."""
        dims = [self.base_dim * u for u in (1, *self.dim_mult)]
        decoder_dims = [self.decoder_width * u for u in (self.dim_mult[-1], *self.dim_mult[::-1])]
        for i in range(len(self.dim_mult)):
            last = i == len(self.dim_mult) - 1
            down = 1 if last else 4 * (2 if self.temperal_downsample[i] else 1)
            up = 0 if last else 4 * (2 if self.temperal_upsample[i] else 1)  # the last up block has no shortcut
            if (dims[i] * down) % dims[i + 1] or (decoder_dims[i + 1] * up) % decoder_dims[i]:
                raise ConfigError(
                    f"config.json: with is_residual, level {i}'s widths do not regroup evenly "
                    f"(encoder {dims[i]} -> {dims[i + 1]}, decoder {decoder_dims[i]} -> {decoder_dims[i + 1]})"
                )

    @property
    def variant(self) -> str:
        return "Wan 2.2 VAE" if self.is_residual else "Wan 2.1 VAE"

    @property
    def latent_scaling(self) -> str:
        return f"latents_mean/std per channel ({self.z_dim})"

    @property
    def patch(self) -> int:
        """The side of the pixel patches folded into channels (1: none)."""
        return self.patch_size or 1

    @property
    def video_channels(self) -> int:
        """Channels of the videos encoded and decoded; in_channels counts them after patchify."""
        return self.in_channels // (self.patch * self.patch)

    @property
    def decoder_width(self) -> int:
        return self.decoder_base_dim or self.base_dim

    @property
    def spatial_ratio(self) -> int:
        """Pixels per latent along each side, as the architecture has it (2 per level but the last, times the
        patch): what validation sizes its images by, whatever `scale_factor_spatial` says."""
        return 2 ** (len(self.dim_mult) - 1) * self.patch

    @property
    def encode_input_limits(self) -> dict:
        """What an encode's input keeps (models/common/inputs.py): its sides multiples of the patch, and in the
        residual layout of the whole spatial ratio (its parameter-free shortcuts fold pixels at every level); at
        least the spatial ratio, as each stride-2 downsampler pads one row after and needs two to leave one."""
        return {"multiple": self.spatial_ratio if self.is_residual else self.patch, "minimum": self.spatial_ratio}

    @property
    def temperal_upsample(self) -> tuple[bool, ...]:
        return tuple(reversed(self.temperal_downsample))

    def down_levels(self) -> list[Level]:
        """The encoder's levels: widths base_dim * (1, *dim_mult); Wan 2.1's attention where the scale (1, 1/2, ...,
        halved at each downsampler) is one of attn_scales."""
        dims, levels, scale = [self.base_dim * u for u in (1, *self.dim_mult)], [], 1.0
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            resample = i != len(self.dim_mult) - 1
            levels.append(
                Level(in_dim, out_dim, resample, resample and self.temperal_downsample[i], scale in self.attn_scales)
            )
            scale /= 2.0 if resample else 1.0
        return levels

    def up_levels(self) -> list[Level]:
        """The decoder's levels, from the widest: in Wan 2.1 each upsampler halves the channels it passes on."""
        dims, levels = [self.decoder_width * u for u in (self.dim_mult[-1], *self.dim_mult[::-1])], []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            resample = i != len(self.dim_mult) - 1
            halved = i > 0 and not self.is_residual
            levels.append(
                Level(in_dim // 2 if halved else in_dim, out_dim, resample, resample and self.temperal_upsample[i])
            )
        return levels


@dataclasses.dataclass(frozen=True)
class WanVAEConfig(WanLayout, DiffusersConfig):
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
    bounds = {
        "base_dim": WIDTH,
        "decoder_base_dim": WIDTH,
        "z_dim": WIDTH,
        "in_channels": WIDTH,
        "out_channels": WIDTH,
        "dim_mult": MULTIPLIER,
        "num_res_blocks": LAYERS,
        "patch_size": STRIDE,
        "scale_factor_temporal": STRIDE,
        "scale_factor_spatial": STRIDE,
    }
    retired_fields = ("clip_output",)  # in Wan 2.2's published config; diffusers dropped the option


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
        """Both directions tile the patchified video (Wan 2.2), as diffusers does: the pixel sizes below then count
        patches, except that encoding starts tiling once the unpatchified frame exceeds one tile."""
        # diffusers' spatial_compression_ratio (null in a config: the architecture's, where diffusers' would fail)
        ratio, patch = config.scale_factor_spatial or config.spatial_ratio, config.patch
        encode_ratio = ratio // patch
        sample_min = (self.tile_sample_min_height, self.tile_sample_min_width)
        sample_stride = (self.tile_sample_stride_height, self.tile_sample_stride_width)
        decoded_min, decoded_stride = _div(sample_min, patch), _div(sample_stride, patch)
        latent_min, latent_stride = _div(sample_min, ratio), _div(sample_stride, ratio)
        encoded_min, encoded_stride = _div(sample_min, encode_ratio), _div(sample_stride, encode_ratio)
        return {
            "decoder": TilePlan(
                latent_min,
                latent_stride,
                blend=_minus(decoded_min, decoded_stride),
                keep=decoded_stride,
                crop_scale=(ratio, patch),
            ),
            "encoder": TilePlan(
                sample_min,
                sample_stride,
                blend=_minus(encoded_min, encoded_stride),
                keep=encoded_stride,
                crop_scale=(1, encode_ratio),
                untiled_max=_div(sample_min, patch),
            ),
        }


def _div(a: tuple[int, int], n: int) -> tuple[int, int]:
    return (a[0] // n, a[1] // n)


def _minus(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] - b[0], a[1] - b[1])
