"""The image VAE configuration (diffusers' `AutoencoderKL`: SD 1.x/2.x, SDXL, SD3/3.5, Flux.1, Z-Image), read from a
diffusers `config.json`; shared by both implementations, with diffusers' tiling settings."""

from __future__ import annotations

import dataclasses

from ..common.config import LAYERS, LEVELS, PIXELS, WIDTH, ConfigError, DiffusersConfig
from ..common.tiling import TilePlan


@dataclasses.dataclass(frozen=True)
class AutoencoderKLConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKL.__init__` (its defaults are a one-level toy model: every
    published VAE sets its widths)."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",)
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",)
    block_out_channels: tuple[int, ...] = (64,)
    layers_per_block: int = 1
    act_fn: str = "silu"
    latent_channels: int = 4
    norm_num_groups: int = 32
    sample_size: int = 32
    scaling_factor: float = 0.18215
    shift_factor: float | None = None
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None
    force_upcast: bool = True
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True

    class_name = "AutoencoderKL"
    bounds = {
        "in_channels": WIDTH,
        "out_channels": WIDTH,
        "latent_channels": WIDTH,
        "block_out_channels": WIDTH,
        "layers_per_block": LAYERS,
        "norm_num_groups": WIDTH,
        "sample_size": PIXELS,
    }

    @property
    def variant(self) -> str:
        """SD 1.x/2.x/SDXL keep the 1x1 convolutions around the latent; SD3 and Flux.1 dropped them."""
        return "SD VAE" if self.use_quant_conv else "SD3/Flux.1 VAE"

    @property
    def latent_scaling(self) -> str:
        """As diffusers' pipelines apply it to an encoded latent."""
        if self.latents_mean is not None:
            return f"(z - latents_mean) * {self.scaling_factor} / latents_std"
        if self.shift_factor:
            return f"(z - {self.shift_factor}) * {self.scaling_factor}"
        return f"scaling_factor {self.scaling_factor}"

    @property
    def spatial_ratio(self) -> int:
        """Pixels per latent along each side: every level but the last halves the image."""
        return 2 ** (len(self.block_out_channels) - 1)

    def ensure_supported(self):
        if self.act_fn not in ("silu", "swish"):
            raise ConfigError(f"config.json: act_fn {self.act_fn!r} is not supported (silu only)")
        if set(self.down_block_types) != {"DownEncoderBlock2D"}:
            raise ConfigError("config.json: only DownEncoderBlock2D down blocks are supported")
        if set(self.up_block_types) != {"UpDecoderBlock2D"}:
            raise ConfigError("config.json: only UpDecoderBlock2D up blocks are supported")
        levels = len(self.block_out_channels)
        if not len(self.down_block_types) == len(self.up_block_types) == levels:
            raise ConfigError("config.json: the block types and block_out_channels differ in length")
        if any(c % self.norm_num_groups for c in self.block_out_channels):
            raise ConfigError("config.json: norm_num_groups must divide every block_out_channels entry")
        for name in ("latents_mean", "latents_std"):
            stats = getattr(self, name)
            if stats is not None and len(stats) != self.latent_channels:
                raise ConfigError(
                    f"config.json: {name} has {len(stats)} entries, latent_channels is {self.latent_channels}"
                )


@dataclasses.dataclass(frozen=True)
class AutoencoderKLTiling:
    """diffusers' tiling of `AutoencoderKL`: square tiles of `sample_size` pixels (its `tile_sample_min_size`), a
    quarter of each overlapping its neighbours (`tile_overlap_factor`); None takes the config's sample_size."""

    tile_sample_min_size: int | None = None
    tile_overlap_factor: float = 0.25

    def plans(self, config: AutoencoderKLConfig) -> dict[str, TilePlan]:
        sample = self.tile_sample_min_size or config.sample_size
        latent = int(sample / config.spatial_ratio)
        overlap = self.tile_overlap_factor
        sample_blend, latent_blend = int(sample * overlap), int(latent * overlap)
        return {
            "decoder": TilePlan(
                (latent,) * 2,
                (int(latent * (1 - overlap)),) * 2,
                blend=(sample_blend,) * 2,
                keep=(sample - sample_blend,) * 2,
                crop_scale=None,
            ),
            "encoder": TilePlan(
                (sample,) * 2,
                (int(sample * (1 - overlap)),) * 2,
                blend=(latent_blend,) * 2,
                keep=(latent - latent_blend,) * 2,
                crop_scale=None,
            ),
        }


def config_from_shapes(shapes: dict[str, tuple], named: dict) -> dict:
    """`named` (the model name's config) with what an AutoencoderKL file's tensors show in its place: the widths,
    levels, layers per level, channels in, out and of the latent, and which optional layers exist (the quant convs,
    the mid blocks' attention). What tensors do not show (norm groups, scaling, tile size) stays the name's. Tensors
    of another layout leave `named` as it is: planning says what does not fit."""
    first_convs = [shapes.get(f"encoder.down_blocks.{i}.resnets.0.conv1.weight") for i in range(LEVELS)]
    levels = next((i for i, shape in enumerate(first_convs) if shape is None), LEVELS)
    ends = ("encoder.conv_in.weight", "decoder.conv_in.weight", "decoder.conv_out.weight")
    if not levels or any(len(shapes.get(key, ())) != 4 for key in ends):
        return named
    layers = next(
        j for j in range(LAYERS.maximum + 1) if f"encoder.down_blocks.0.resnets.{j}.conv1.weight" not in shapes
    )
    return {
        **named,
        "block_out_channels": [first_convs[i][0] for i in range(levels)],
        "down_block_types": ["DownEncoderBlock2D"] * levels,
        "up_block_types": ["UpDecoderBlock2D"] * levels,
        "layers_per_block": layers,
        "in_channels": shapes["encoder.conv_in.weight"][1],
        "out_channels": shapes["decoder.conv_out.weight"][0],
        "latent_channels": shapes["decoder.conv_in.weight"][1],
        "use_quant_conv": "quant_conv.weight" in shapes,
        "use_post_quant_conv": "post_quant_conv.weight" in shapes,
        "mid_block_add_attention": "encoder.mid_block.attentions.0.to_q.weight" in shapes,
    }
