"""The image VAE configurations, read from a diffusers `config.json`: `AutoencoderKL` (SD 1.x/2.x, SDXL, SD3/3.5,
Flux.1, Z-Image) and `AutoencoderKLFlux2` (Flux.2), which build the same encoder and decoder; shared by both
implementations, with diffusers' tiling settings."""

from __future__ import annotations

import dataclasses
import math

from ..common.config import LAYERS, LEVELS, PIXELS, STRIDE, WIDTH, ConfigError, DiffusersConfig
from ..common.tiling import TilePlan

_CODER_BOUNDS = {
    "in_channels": WIDTH,
    "out_channels": WIDTH,
    "latent_channels": WIDTH,
    "block_out_channels": WIDTH,
    "layers_per_block": LAYERS,
    "norm_num_groups": WIDTH,
    "sample_size": PIXELS,
}


@dataclasses.dataclass(frozen=True)
class _CoderConfig(DiffusersConfig):
    """The fields of diffusers' `Encoder` and `Decoder` (vae.py) that both classes take, with AutoencoderKL's
    defaults (a one-level toy model: every published VAE sets its widths)."""

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
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True

    @property
    def decoder_widths(self) -> tuple[int, ...]:
        """The decoder's block widths, from the top as `block_out_channels` lists them."""
        return self.block_out_channels

    @property
    def spatial_ratio(self) -> int:
        """Pixels per latent along each side: every level but the last halves the image."""
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def encode_input_limits(self) -> dict:
        """What an encode's input keeps (models/common/inputs.py): sides the downsamplers leave a pixel of."""
        return {"minimum": self.spatial_ratio}

    def ensure_supported(self):
        if self.act_fn not in ("silu", "swish"):
            raise ConfigError(f"config.json: act_fn {self.act_fn!r} is not supported (silu only)")
        if set(self.down_block_types) != {"DownEncoderBlock2D"}:
            raise ConfigError("config.json: only DownEncoderBlock2D down blocks are supported")
        if set(self.up_block_types) != {"UpDecoderBlock2D"}:
            raise ConfigError("config.json: only UpDecoderBlock2D up blocks are supported")
        levels = len(self.block_out_channels)
        if not len(self.down_block_types) == len(self.up_block_types) == len(self.decoder_widths) == levels:
            raise ConfigError("config.json: the block types and the encoder's and decoder's widths differ in length")
        if any(c % self.norm_num_groups for c in (*self.block_out_channels, *self.decoder_widths)):
            raise ConfigError("config.json: norm_num_groups must divide every block width")


@dataclasses.dataclass(frozen=True)
class AutoencoderKLConfig(_CoderConfig):
    """Fields and defaults as in diffusers' `AutoencoderKL.__init__`."""

    scaling_factor: float = 0.18215
    shift_factor: float | None = None
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None
    force_upcast: bool = True

    class_name = "AutoencoderKL"
    bounds = _CODER_BOUNDS

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

    def ensure_supported(self):
        super().ensure_supported()
        for name in ("latents_mean", "latents_std"):
            stats = getattr(self, name)
            if stats is not None and len(stats) != self.latent_channels:
                raise ConfigError(
                    f"config.json: {name} has {len(stats)} entries, latent_channels is {self.latent_channels}"
                )


@dataclasses.dataclass(frozen=True)
class AutoencoderKLFlux2Config(_CoderConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLFlux2.__init__`: AutoencoderKL's encoder and decoder (the
    decoder's widths may differ), no latent scaling, and a BatchNorm over the patchified latent whose running
    statistics Flux.2's pipelines normalise latents with."""

    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4
    layers_per_block: int = 2
    latent_channels: int = 32
    sample_size: int = 1024
    decoder_block_out_channels: tuple[int, ...] | None = None
    batch_norm_eps: float = 1e-4
    batch_norm_momentum: float = 0.1
    patch_size: tuple[int, ...] = (2, 2)

    class_name = "AutoencoderKLFlux2"
    bounds = {**_CODER_BOUNDS, "decoder_block_out_channels": WIDTH, "patch_size": STRIDE}
    # Flux.2's published configs carry AutoencoderKL's `force_upcast`, which this class does not take
    retired_fields = ("force_upcast",)

    @property
    def variant(self) -> str:
        return "Flux.2 VAE"

    @property
    def decoder_widths(self) -> tuple[int, ...]:
        return self.decoder_block_out_channels or self.block_out_channels

    @property
    def batch_norm_channels(self) -> int:
        """The patchified latent's channels: each latent channel's patch_size pixels side by side."""
        return math.prod(self.patch_size) * self.latent_channels

    @property
    def latent_scaling(self) -> str:
        patch = "x".join(map(str, self.patch_size))
        return f"{patch} patches, then (z - bn.running_mean) / sqrt(bn.running_var + {self.batch_norm_eps})"

    def ensure_supported(self):
        super().ensure_supported()
        if len(self.patch_size) != 2:
            raise ConfigError(f"config.json: patch_size has {len(self.patch_size)} entries, an image patch 2")


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


def flux2_config_from_shapes(shapes: dict[str, tuple], named: dict) -> dict:
    """As `config_from_shapes`, for an AutoencoderKLFlux2 file: also the decoder's own widths (None where they are
    the encoder's, as published configs leave them) and a square patch from the BatchNorm's channel count."""
    inferred = config_from_shapes(shapes, named)
    if inferred is named or "bn.running_mean" not in shapes:
        return named
    levels = len(inferred["block_out_channels"])
    decoder = [shapes.get(f"decoder.up_blocks.{i}.resnets.0.conv1.weight", (0,))[0] for i in range(levels)][::-1]
    patch_pixels = shapes["bn.running_mean"][0] // inferred["latent_channels"]
    side = math.isqrt(patch_pixels)
    return {
        **inferred,
        "decoder_block_out_channels": None if decoder == inferred["block_out_channels"] else decoder,
        "patch_size": [side, side] if side * side == patch_pixels else named.get("patch_size", [2, 2]),
    }
