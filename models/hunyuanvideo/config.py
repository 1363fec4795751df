"""The HunyuanVideo VAE configuration, read from a diffusers `config.json`; shared by both implementations, with
the layout it implies (which levels downsample in space and in time) and diffusers' tiling settings."""

from __future__ import annotations

import dataclasses
import math

from ..common.config import LAYERS, STRIDE, WIDTH, ConfigError, DiffusersConfig
from ..common.tiling import SampleTiling


@dataclasses.dataclass(frozen=True)
class HunyuanVideoVAEConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLHunyuanVideo.__init__`."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 16
    down_block_types: tuple[str, ...] = ("HunyuanVideoDownBlock3D",) * 4
    up_block_types: tuple[str, ...] = ("HunyuanVideoUpBlock3D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    act_fn: str = "silu"
    norm_num_groups: int = 32
    scaling_factor: float = 0.476986
    spatial_compression_ratio: int = 8
    temporal_compression_ratio: int = 4
    mid_block_add_attention: bool = True

    class_name = "AutoencoderKLHunyuanVideo"
    bounds = {
        "in_channels": WIDTH,
        "out_channels": WIDTH,
        "latent_channels": WIDTH,
        "block_out_channels": WIDTH,
        "layers_per_block": LAYERS,
        "norm_num_groups": WIDTH,
        "spatial_compression_ratio": STRIDE,
        "temporal_compression_ratio": STRIDE,
    }

    @property
    def variant(self) -> str:
        return "HunyuanVideo VAE"

    @property
    def latent_scaling(self) -> str:
        return f"scaling_factor {self.scaling_factor}"

    def ensure_supported(self):
        if self.act_fn not in ("silu", "swish"):
            raise ConfigError(f"config.json: act_fn {self.act_fn!r} is not supported (silu only)")
        if set(self.down_block_types) != {"HunyuanVideoDownBlock3D"}:
            raise ConfigError("config.json: only HunyuanVideoDownBlock3D down blocks exist")
        if set(self.up_block_types) != {"HunyuanVideoUpBlock3D"}:
            raise ConfigError("config.json: only HunyuanVideoUpBlock3D up blocks exist")
        if not len(self.down_block_types) == len(self.up_block_types) == len(self.block_out_channels):
            raise ConfigError("config.json: down_block_types, up_block_types and block_out_channels differ in length")
        if any(c % self.norm_num_groups for c in self.block_out_channels):
            raise ConfigError("config.json: norm_num_groups must divide every block_out_channels entry")
        # diffusers builds the encoder for a temporal ratio of 4 or 8, the decoder for 4 only
        if self.temporal_compression_ratio != 4:
            raise ConfigError("config.json: temporal_compression_ratio must be 4 (diffusers' decoder takes no other)")
        if self.spatial_compression_ratio not in (2**i for i in range(len(self.block_out_channels))):
            raise ConfigError(
                "config.json: spatial_compression_ratio must be 2 ** n, n below the number of blocks "
                f"({len(self.block_out_channels)})"
            )

    def down_strides(self) -> list[tuple[int, int] | None]:
        """Each encoder level's downsampler stride (time, space), or None where it has none: diffusers' rule, space
        in the first levels, time in the last ones before the final level."""
        levels, space, time = len(self.block_out_channels), self._log2_space, self._log2_time
        strides = []
        for i in range(levels):
            final = i == levels - 1
            down_space = i < space
            down_time = i >= levels - 1 - time and not final
            strides.append((2 if down_time else 1, 2 if down_space else 1) if down_space or down_time else None)
        return strides

    def up_factors(self) -> list[tuple[int, int] | None]:
        """Each decoder level's upsampling factor (time, space), or None: the encoder's levels in reverse."""
        return self.down_strides()  # diffusers applies the same rule to the up blocks in their own order

    @property
    def spatial_ratio(self) -> int:
        return self.spatial_compression_ratio

    @property
    def temporal_ratio(self) -> int:
        return self.temporal_compression_ratio

    @property
    def _log2_space(self) -> int:
        return int(math.log2(self.spatial_compression_ratio))

    @property
    def _log2_time(self) -> int:
        return int(math.log2(self.temporal_compression_ratio))


@dataclasses.dataclass(frozen=True)
class HunyuanVideoTiling(SampleTiling):
    """diffusers' `AutoencoderKLHunyuanVideo.enable_tiling` defaults."""

    tile_sample_min_height: int = 256
    tile_sample_min_width: int = 256
    tile_sample_min_num_frames: int = 16
    tile_sample_stride_height: int = 192
    tile_sample_stride_width: int = 192
    tile_sample_stride_num_frames: int = 12
