"""The tiny VAEs' configuration (diffusers' `AutoencoderTiny`: TAESD, TAESDXL, TAESD3, TAEF1), read from a diffusers
`config.json`; shared by both implementations, with diffusers' tiling settings."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..common.config import LAYERS, MULTIPLIER, STRIDE, WIDTH, Bound, ConfigError, DiffusersConfig
from ..common.tiling import TilePlan, _window

ACTIVATIONS = ("relu", "silu", "swish", "mish", "gelu")  # diffusers' get_activation, which the blocks take
# a level may hold no blocks: diffusers builds it of its strided or upsampling convolution alone
BLOCKS = Bound(LAYERS.maximum, "blocks per level; the releases have up to 3", minimum=0)


@dataclasses.dataclass(frozen=True)
class AutoencoderTinyConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderTiny.__init__` (the defaults are TAESD's)."""

    in_channels: int = 3
    out_channels: int = 3
    encoder_block_out_channels: tuple[int, ...] = (64, 64, 64, 64)
    decoder_block_out_channels: tuple[int, ...] = (64, 64, 64, 64)
    act_fn: str = "relu"
    upsample_fn: str = "nearest"
    latent_channels: int = 4
    upsampling_scaling_factor: int = 2
    num_encoder_blocks: tuple[int, ...] = (1, 3, 3, 3)
    num_decoder_blocks: tuple[int, ...] = (3, 3, 3, 1)
    latent_magnitude: int = 3
    latent_shift: float = 0.5
    force_upcast: bool = False
    scaling_factor: float = 1.0
    shift_factor: float = 0.0

    class_name = "AutoencoderTiny"
    bounds = {
        "in_channels": WIDTH,
        "out_channels": WIDTH,
        "encoder_block_out_channels": WIDTH,
        "decoder_block_out_channels": WIDTH,
        "latent_channels": WIDTH,
        "upsampling_scaling_factor": STRIDE,
        "num_encoder_blocks": BLOCKS,
        "num_decoder_blocks": BLOCKS,
        "latent_magnitude": MULTIPLIER,
    }

    @classmethod
    def from_dict(cls, raw: dict):
        """diffusers writes the decoder's widths a second time, as `block_out_channels` (it registers them after
        `__init__`): read back as that, and checked to be."""
        raw = dict(raw)
        written = raw.pop("block_out_channels", None)
        config = super().from_dict(raw)
        widths = list(config.decoder_block_out_channels)
        if written is not None and (not isinstance(written, (list, tuple)) or list(written) != widths):
            raise ConfigError(
                "config.json: block_out_channels, which diffusers writes as the decoder's widths, differs from "
                "decoder_block_out_channels"
            )
        return config

    def to_dict(self) -> dict:
        return {**super().to_dict(), "block_out_channels": list(self.decoder_block_out_channels)}

    @property
    def variant(self) -> str:
        """The 4-channel latents of SD 1.x/2.x and SDXL, or the 16 of SD3 and Flux.1."""
        return "TAESD/TAESDXL" if self.latent_channels <= 4 else "TAESD3/TAEF1"

    @property
    def latent_scaling(self) -> str:
        shift = f"(z - {self.shift_factor}) * " if self.shift_factor else ""
        return f"{shift}scaling_factor {self.scaling_factor}"

    @property
    def spatial_ratio(self) -> int:
        """Pixels per latent along each side: the encoder halves the image at every level but the first."""
        return 2 ** (len(self.encoder_block_out_channels) - 1)

    def ensure_supported(self):
        if self.act_fn not in ACTIVATIONS:
            raise ConfigError(f"config.json: act_fn {self.act_fn!r} is not supported ({', '.join(ACTIVATIONS)})")
        if self.upsample_fn != "nearest":
            raise ConfigError(f"config.json: upsample_fn {self.upsample_fn!r} is not supported (nearest)")
        if len(self.encoder_block_out_channels) != len(self.num_encoder_blocks):
            raise ConfigError("config.json: encoder_block_out_channels and num_encoder_blocks differ in length")
        if len(self.decoder_block_out_channels) != len(self.num_decoder_blocks):
            raise ConfigError("config.json: decoder_block_out_channels and num_decoder_blocks differ in length")
        # diffusers builds every level's strided or upsampling convolution from the level's own width, so its
        # models run only where each coder keeps one width (as every released one does)
        for name in ("encoder_block_out_channels", "decoder_block_out_channels"):
            if len(set(getattr(self, name))) != 1:
                raise ConfigError(f"config.json: {name} must hold one width (diffusers' blocks never change it)")
        if self.upsampling_scaling_factor != 2 and len(self.decoder_block_out_channels) > 1:
            raise ConfigError("config.json: upsampling_scaling_factor must be 2, the encoder's ratio per level")
        if len(self.decoder_block_out_channels) != len(self.encoder_block_out_channels):
            raise ConfigError("config.json: the encoder and the decoder must have as many levels")


@dataclasses.dataclass(frozen=True)
class AutoencoderTinyTiling:
    """diffusers' tiling of `AutoencoderTiny`: square tiles of `tile_sample_min_size` pixels, stepping by all but
    `tile_overlap_factor` of a tile; each tile is written over the earlier ones through a mask that ramps up over
    its first overlap rows and columns (its `_tiled_decode` / `_tiled_encode`). diffusers' class takes the pixels per
    latent as 2 ** out_channels (8 for RGB); the config's own ratio is taken here, the same for released models."""

    tile_sample_min_size: int = 512
    tile_overlap_factor: float = 0.125

    def plans(self, config: AutoencoderTinyConfig) -> dict[str, TilePlan]:
        ratio, sample = config.spatial_ratio, self.tile_sample_min_size
        latent = sample // ratio
        latent_blend, sample_blend = int(latent * self.tile_overlap_factor), int(sample * self.tile_overlap_factor)
        return {
            "decoder": MaskedTilePlan.of(
                latent, latent - latent_blend, (ratio, 1), latent * ratio, latent_blend * ratio
            ),
            "encoder": MaskedTilePlan.of(
                sample, sample - sample_blend, (1, ratio), sample / ratio, sample_blend / ratio
            ),
        }


@dataclasses.dataclass(frozen=True)
class MaskedTilePlan(TilePlan):
    """Tiles written in row-major order into the output, each through a mask: a ramp over its first rows times one
    over its first columns (ones for the first row or column of tiles), `out = mask * tile + (1 - mask) * out` where
    earlier tiles wrote. Each output region's value is that fold over the tiles covering it, computed region by
    region, so no output buffer is updated in place."""

    start_scale: tuple[int, int] = (1, 1)  # (num, den): a tile's output starts at its input start * num // den
    ramp: tuple[float, ...] = ()  # the mask along one side, over a whole tile's output

    @classmethod
    def of(cls, tile: int, stride: int, start_scale, ramp_length: float, ramp_extent: float) -> MaskedTilePlan:
        """diffusers' ramp: arange(ramp_length) / (ramp_extent - 1), clamped to [0, 1]."""
        ramp = np.clip(np.arange(ramp_length) / (ramp_extent - 1), 0.0, 1.0)
        return cls((tile, tile), (stride, stride), (0, 0), (0, 0), None, start_scale=start_scale, ramp=tuple(ramp))

    def fits_whole(self, x, h_axis: int) -> bool:
        """diffusers tiles whatever the size: one tile (an input no larger than a step) is the untiled result."""
        return x.shape[h_axis] <= self.stride[0] and x.shape[h_axis + 1] <= self.stride[1]

    def run(self, run, x, *, h_axis: int, concat, as_array):
        if self.fits_whole(x, h_axis):
            return run(x)
        num, den = self.start_scale
        grid = self.windows(x, h_axis)
        tiles = {
            (r, c): run(_window(x, h_axis, rows, cols))
            for r, row in enumerate(grid)
            for c, (rows, cols) in enumerate(row)
        }
        # each tile's output extent along each axis: [start, start + size)
        extents = [
            [(grid[r][0][0].start * num // den, tiles[r, 0].shape[h_axis]) for r in range(len(grid))],
            [(grid[0][c][1].start * num // den, tiles[0, c].shape[h_axis + 1]) for c in range(len(grid[0]))],
        ]
        cuts = [sorted({p for start, size in axis for p in (start, start + size)}) for axis in extents]
        rows_out = []
        for top, bottom in zip(cuts[0], cuts[0][1:]):
            cells = []
            for left, right in zip(cuts[1], cuts[1][1:]):
                value = None
                for (r, c), tile in tiles.items():  # row-major: the order diffusers writes them
                    (r0, _), (c0, _) = extents[0][r], extents[1][c]
                    if not (r0 <= top and bottom <= sum(extents[0][r]) and c0 <= left and right <= sum(extents[1][c])):
                        continue
                    part = _window(tile, h_axis, slice(top - r0, bottom - r0), slice(left - c0, right - c0))
                    mask = self._mask(r, c, top - r0, bottom - r0, left - c0, right - c0, part.ndim - h_axis)
                    masked = part * as_array(mask, part)
                    value = masked if value is None else masked + value * as_array(1 - mask, part)
                cells.append(value)
            rows_out.append(concat(cells, h_axis + 1))
        return concat(rows_out, h_axis)

    def _mask(self, r: int, c: int, top: int, bottom: int, left: int, right: int, trailing: int) -> np.ndarray:
        """The tile's mask over rows [top, bottom) and columns [left, right) of its output, shaped to broadcast over
        (rows, columns, ...the `trailing` - 2 axes after them)."""
        ramp = np.asarray(self.ramp)
        rows = np.ones(bottom - top) if r == 0 else ramp[top:bottom]
        cols = np.ones(right - left) if c == 0 else ramp[left:right]
        return (rows[:, None] * cols[None, :]).reshape(bottom - top, right - left, *(1,) * (trailing - 2))


def config_from_shapes(shapes: dict[str, tuple], named: dict) -> dict:
    """`named` (the model name's config) with what an AutoencoderTiny file's tensors show in its place: channels in,
    out and of the latent, the widths, and each coder's levels and blocks per level, read along its list of layers (a
    block has `conv.0`; a bare convolution opens an encoder level or closes a decoder one; the one with a bias at the
    end gives the coder's output). What tensors do not show (activation, upsampling, scaling) stays the name's.
    Tensors of another layout leave `named` as it is: planning says what does not fit."""
    encoder, decoder = _coder_layers(shapes, "encoder"), _coder_layers(shapes, "decoder")
    if not encoder or not decoder or encoder[0][0] != "conv" or decoder[0][0] != "conv":
        return named
    in_channels, width = encoder[0][1][1], encoder[0][1][0]
    encoder_blocks = [0]
    for kind, _, biased in encoder[1:-1]:
        if kind == "block":
            encoder_blocks[-1] += 1
        elif biased:  # only the first and the last encoder convolutions have a bias
            return named
        else:
            encoder_blocks.append(0)
    decoder_blocks = [0]
    for kind, _, _ in decoder[1:-1]:
        if kind == "block":
            decoder_blocks[-1] += 1
        else:
            decoder_blocks.append(0)
    if encoder[-1][0] != "conv" or decoder[-1][0] != "conv" or not decoder[-1][2]:
        return named
    return {
        **named,
        "in_channels": in_channels,
        "out_channels": decoder[-1][1][0],
        "latent_channels": encoder[-1][1][0],
        "encoder_block_out_channels": [width] * len(encoder_blocks),
        "decoder_block_out_channels": [decoder[0][1][0]] * len(decoder_blocks),
        "num_encoder_blocks": encoder_blocks,
        "num_decoder_blocks": decoder_blocks,
    }


def _coder_layers(shapes: dict[str, tuple], coder: str) -> list[tuple[str, tuple, bool]]:
    """A coder's layers that hold parameters, in order: ("conv", kernel shape, has a bias) or ("block", the first
    convolution's kernel shape, True); [] where a kernel is not 4-d."""
    indices = sorted(
        {int(k.split(".")[2]) for k in shapes if k.startswith(f"{coder}.layers.") and k.split(".")[2].isdigit()}
    )
    layers = []
    for n in indices:
        block = shapes.get(f"{coder}.layers.{n}.conv.0.weight")
        kernel = block or shapes.get(f"{coder}.layers.{n}.weight")
        if kernel is None or len(kernel) != 4:
            return []
        layers.append(("block", kernel, True) if block else ("conv", kernel, f"{coder}.layers.{n}.bias" in shapes))
    return layers
