"""The CogVideoX VAE configuration, read from a diffusers `config.json`; shared by both implementations."""

from __future__ import annotations

import dataclasses
import math

from ..common.config import LAYERS, PIXELS, STRIDE, WIDTH, ConfigError, DiffusersConfig, Level
from ..common.tiling import TilePlan


@dataclasses.dataclass(frozen=True)
class CogVideoXVAEConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLCogVideoX.__init__`."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("CogVideoXDownBlock3D",) * 4
    up_block_types: tuple[str, ...] = ("CogVideoXUpBlock3D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 256, 512)
    latent_channels: int = 16
    layers_per_block: int = 3
    act_fn: str = "silu"
    norm_eps: float = 1e-6
    norm_num_groups: int = 32
    temporal_compression_ratio: float = 4
    sample_height: int = 480
    sample_width: int = 720
    scaling_factor: float = 1.15258426
    shift_factor: float | None = None
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None
    force_upcast: bool = True
    use_quant_conv: bool = False
    use_post_quant_conv: bool = False
    invert_scale_latents: bool = False

    class_name = "AutoencoderKLCogVideoX"
    bounds = {
        "in_channels": WIDTH,
        "out_channels": WIDTH,
        "block_out_channels": WIDTH,
        "latent_channels": WIDTH,
        "layers_per_block": LAYERS,
        "norm_num_groups": WIDTH,
        "temporal_compression_ratio": STRIDE,
        "sample_height": PIXELS,
        "sample_width": PIXELS,
    }

    @property
    def variant(self) -> str:
        return "CogVideoX VAE"

    @property
    def latent_scaling(self) -> str:
        return f"scaling_factor {self.scaling_factor}" + (", inverted" if self.invert_scale_latents else "")

    def ensure_supported(self):
        if self.act_fn not in ("silu", "swish"):
            raise ConfigError(f"config.json: act_fn {self.act_fn!r} is not supported (silu only)")
        if set(self.down_block_types) != {"CogVideoXDownBlock3D"} or set(self.up_block_types) != {"CogVideoXUpBlock3D"}:
            raise ConfigError("config.json: only CogVideoXDownBlock3D / CogVideoXUpBlock3D blocks exist")
        if not len(self.down_block_types) == len(self.up_block_types) == len(self.block_out_channels):
            raise ConfigError("config.json: down_block_types, up_block_types and block_out_channels differ in length")
        if any(c % self.norm_num_groups for c in self.block_out_channels):
            raise ConfigError("config.json: norm_num_groups must divide every block_out_channels entry")

    @property
    def encode_input_limits(self) -> dict:
        """What an encode's input keeps (models/common/inputs.py): sides of at least the spatial ratio, as each level
        but the last halves them with a stride-2 convolution after one row and column of zeros, which needs two to
        leave one."""
        return {"minimum": 2 ** (len(self.block_out_channels) - 1)}

    @property
    def temporal_compress_level(self) -> int:
        return int(math.log2(self.temporal_compression_ratio))

    def down_levels(self) -> list[Level]:
        """The encoder's levels; the first `temporal_compress_level` downsamplers also halve time."""
        widths = self.block_out_channels
        return [
            Level(widths[max(i - 1, 0)], widths[i], i != len(widths) - 1, i < self.temporal_compress_level)
            for i in range(len(widths))
        ]

    def up_levels(self) -> list[Level]:
        """The decoder's levels, from the widest; the first `temporal_compress_level` upsamplers also double time."""
        widths = self.block_out_channels[::-1]
        return [
            Level(widths[max(i - 1, 0)], widths[i], i != len(widths) - 1, i < self.temporal_compress_level)
            for i in range(len(widths))
        ]


def frame_batches(num_frames: int, batch: int) -> list[tuple[int, int]]:
    """diffusers' frame batching: batches of `batch` frames, the remainder folded into the first one."""
    remainder = num_frames % batch
    return [
        (0 if i == 0 else batch * i + remainder, batch * (i + 1) + remainder)
        for i in range(max(num_frames // batch, 1))
    ]


@dataclasses.dataclass(frozen=True)
class CogVideoXTiling:
    """diffusers' `AutoencoderKLCogVideoX.enable_tiling` keywords and defaults: tiles of half the config's sample
    size, overlap factors found by CogVideoX's authors for 720x480."""

    tile_sample_min_height: int | None = None
    tile_sample_min_width: int | None = None
    tile_overlap_factor_height: float = 1 / 6
    tile_overlap_factor_width: float = 1 / 5

    def plans(self, config: CogVideoXVAEConfig) -> dict[str, TilePlan]:
        sample_min = (
            self.tile_sample_min_height or config.sample_height // 2,
            self.tile_sample_min_width or config.sample_width // 2,
        )
        downsampling = 2 ** (len(config.block_out_channels) - 1)
        latent_min = tuple(int(s / downsampling) for s in sample_min)
        factors = (self.tile_overlap_factor_height, self.tile_overlap_factor_width)

        def plan(tile, out_tile):  # the same int() roundings as diffusers
            blend = tuple(int(o * f) for o, f in zip(out_tile, factors))
            return TilePlan(
                tile,
                stride=tuple(int(t * (1 - f)) for t, f in zip(tile, factors)),
                blend=blend,
                keep=tuple(o - b for o, b in zip(out_tile, blend)),
                crop_scale=None,
            )

        return {"decoder": plan(latent_min, sample_min), "encoder": plan(sample_min, latent_min)}
