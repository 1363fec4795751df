"""The LTX-Video VAE configuration, read from a diffusers `config.json`; shared by both implementations, with the
block structure it implies (each encoder and decoder level's widths and strides, computed as diffusers' constructors
compute them) and diffusers' tiling settings."""

from __future__ import annotations

import dataclasses
import math
import typing

from ..common.config import LAYERS, STRIDE, WIDTH, ConfigError, DiffusersConfig
from ..common.tiling import SampleTiling

STRIDES = {"conv": (2, 2, 2), "spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2)}


@dataclasses.dataclass(frozen=True)
class ConvStyle:
    """How the encoder's or the decoder's convolutions pad: time by repeating edge frames (causal: the first k-1
    times; else the first and last (k-1)/2 times each), space with zeros or by reflection; and whether resnets'
    1x1x1 shortcuts are plain convolutions (LTX-2) or causal ones."""

    causal: bool
    padding: str
    plain_shortcut: bool


@dataclasses.dataclass(frozen=True)
class DownLevel:
    """One encoder block: `num_layers` resnets at `in_channels`, then its downsampler (None: none), then, in
    LTXVideoDownBlock3D, a resnet to `out_channels` where the width changes (`conv_out`)."""

    block_type: str
    in_channels: int
    out_channels: int
    num_layers: int
    downsample: str | None  # "conv" (0.9.0's strided conv) or a space-to-depth stride name of STRIDES


@dataclasses.dataclass(frozen=True)
class UpLevel:
    """One decoder block as diffusers builds it: a resnet to `out_channels` where the width changes (`conv_in`),
    the depth-to-space upsampler (None: none), then `num_layers` resnets."""

    in_channels: int
    out_channels: int
    num_layers: int
    upsample: tuple[int, int, int] | None  # (time, height, width) strides
    residual: bool
    upscale_factor: int
    inject_noise: bool


@dataclasses.dataclass(frozen=True)
class LTXVideoVAEConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLLTXVideo.__init__` (the LTX-Video 0.9.0 layout)."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 128
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    down_block_types: tuple[str, ...] = ("LTXVideoDownBlock3D",) * 4
    decoder_block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: tuple[int, ...] = (4, 3, 3, 3, 4)
    decoder_layers_per_block: tuple[int, ...] = (4, 3, 3, 3, 4)
    spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, False)
    decoder_spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, False)
    decoder_inject_noise: tuple[bool, ...] = (False,) * 5
    downsample_type: tuple[str, ...] = ("conv",) * 4
    upsample_residual: tuple[bool, ...] = (False,) * 4
    upsample_factor: tuple[int, ...] = (1,) * 4
    timestep_conditioning: bool = False
    patch_size: int = 4
    patch_size_t: int = 1
    resnet_norm_eps: float = 1e-6
    scaling_factor: float = 1.0
    encoder_causal: bool = True
    decoder_causal: bool = False
    spatial_compression_ratio: int | None = None
    temporal_compression_ratio: int | None = None

    class_name = "AutoencoderKLLTXVideo"
    bounds = {
        "in_channels": WIDTH,
        "out_channels": WIDTH,
        "latent_channels": WIDTH,
        "block_out_channels": WIDTH,
        "decoder_block_out_channels": WIDTH,
        "layers_per_block": LAYERS,
        "decoder_layers_per_block": LAYERS,
        "upsample_factor": STRIDE,
        "patch_size": STRIDE,
        "patch_size_t": STRIDE,
        "spatial_compression_ratio": STRIDE,
        "temporal_compression_ratio": STRIDE,
    }

    @property
    def variant(self) -> str:
        return "LTX-Video VAE"

    @property
    def latent_scaling(self) -> str:
        return f"(z - latents_mean) * {self.scaling_factor} / latents_std"

    # what LTX-2's class changes (LTX2VideoVAEConfig below)
    down_block_names: typing.ClassVar[tuple[str, ...]] = ("LTXVideoDownBlock3D", "LTXVideo095DownBlock3D")
    plain_shortcut: typing.ClassVar[bool] = False  # resnets' 1x1x1 shortcut: a causal conv (`.conv.weight`)
    encoder_padding: typing.ClassVar[str] = "zeros"  # the convolutions' spatial padding
    decoder_padding: typing.ClassVar[str] = "zeros"

    @property
    def spatial_ratio(self) -> int:
        """diffusers' `spatial_compression_ratio` attribute: the config's, else patch * 2 ** (scaled levels)."""
        return self.spatial_compression_ratio or self.patch_size * 2 ** sum(self.encoder_scaling)

    @property
    def temporal_ratio(self) -> int:
        return self.temporal_compression_ratio or self.patch_size_t * 2 ** sum(self.encoder_scaling)

    @property
    def encode_input_limits(self) -> dict:
        """What an encode's input keeps (models/common/inputs.py): diffusers patchifies by patch_size, and each
        space-to-depth downsampler folds its strides into channels (1 + hop * k frames, the first frame padded in
        front); a strided convolution (0.9.0's) takes any size. PyTorch pads by reflection only a side wider than
        the padding: the last level's, at 1/multiple of the input's."""
        hop, multiple = 1, self.patch_size
        for level in self.down_levels():
            if level.downsample not in (None, "conv"):
                time, height, _ = STRIDES[level.downsample]
                hop, multiple = hop * time, multiple * height
        return {"frame_hop": hop, "multiple": multiple, "minimum": multiple * self._reflected(self.encoder_padding)}

    @property
    def decode_input_limits(self) -> dict:
        """A latent's sides, padded by reflection in the decoder's first convolutions, are wider than the padding."""
        return {"minimum": self._reflected(self.decoder_padding)}

    @staticmethod
    def _reflected(padding: str) -> int:
        return 2 if padding == "reflect" else 1

    @property
    def is_095(self) -> bool:
        """diffusers' test for the 0.9.5 encoder layout (its last down block's type)."""
        return self.down_block_types[-1] == "LTXVideo095DownBlock3D"

    @property
    def encoder_levels(self) -> int:
        return len(self.block_out_channels) - (1 if self.is_095 else 0)

    @property
    def encoder_in_width(self) -> int:
        """conv_in's output width."""
        return self.block_out_channels[0]

    # the per-block lists, as the constructors read them (LTX-2's may be one bool for all)
    @property
    def encoder_scaling(self) -> tuple[bool, ...]:
        return self.spatio_temporal_scaling

    @property
    def decoder_scaling(self) -> tuple[bool, ...]:
        return self.decoder_spatio_temporal_scaling

    @property
    def inject_noise(self) -> tuple[bool, ...]:
        return self.decoder_inject_noise

    @property
    def residual(self) -> tuple[bool, ...]:
        return self.upsample_residual

    def ensure_supported(self):
        for name in ("block_out_channels", "decoder_block_out_channels", "down_block_types"):
            if not getattr(self, name):
                raise ConfigError(f"config.json: {name} is empty (diffusers' model needs a block at least)")
        if self.patch_size_t != 1:
            # its decoder leaves patch_size_t out of its output width, and neither part runs
            raise ConfigError(f"config.json: patch_size_t {self.patch_size_t}: diffusers' LTX classes run 1 only")
        unknown = sorted(set(self.down_block_types) - set(self.down_block_names))
        if unknown:
            raise ConfigError(
                f"config.json: down_block_types {unknown} do not exist (known: {list(self.down_block_names)})"
            )
        levels = self.encoder_levels
        if len(self.down_block_types) < levels or len(self.encoder_scaling) < levels:
            raise ConfigError("config.json: down_block_types and spatio_temporal_scaling are shorter than the blocks")
        if len(self.layers_per_block) < levels + 1:
            raise ConfigError("config.json: layers_per_block needs one entry per block and one for the mid block")
        if (
            any(t != "LTXVideoDownBlock3D" for t in self.down_block_types[:levels])
            and len(self.downsample_type) < levels
        ):
            raise ConfigError("config.json: downsample_type is shorter than the blocks")
        if any(t not in STRIDES for t in self.downsample_type[:levels]):
            raise ConfigError(f"config.json: downsample_type entries must be among {sorted(STRIDES)}")
        up = len(self.decoder_block_out_channels)
        for name, values in (
            ("decoder_spatio_temporal_scaling", self.decoder_scaling),
            ("upsample_residual", self.residual),
            ("upsample_factor", self.upsample_factor),
        ):
            if len(values) < up:
                raise ConfigError(f"config.json: {name} is shorter than decoder_block_out_channels")
        if len(self.decoder_layers_per_block) < up + 1 or len(self.inject_noise) < up + 1:
            raise ConfigError(
                "config.json: decoder_layers_per_block and decoder_inject_noise need one entry per decoder block and "
                "one for the mid block"
            )
        for level in self.down_levels():
            # only 0.9.0's block ends in a resnet to its width; the later ones change width in their
            # space-to-depth downsampler alone, so without one the next block is handed this block's input width
            keeps_width = level.block_type != "LTXVideoDownBlock3D" and level.downsample in (None, "conv")
            if keeps_width and level.in_channels != level.out_channels:
                raise ConfigError(
                    f"config.json: an encoder block of {level.in_channels} channels with no space-to-depth "
                    f"downsampler would hand them to one built for {level.out_channels} (block_out_channels, "
                    "spatio_temporal_scaling and downsample_type do not fit together)"
                )
            if level.downsample not in (None, "conv"):
                product = math.prod(STRIDES[level.downsample])
                if level.out_channels % product or (level.in_channels * product) % level.out_channels:
                    raise ConfigError(
                        f"config.json: a {level.downsample} downsampler from {level.in_channels} to "
                        f"{level.out_channels} channels does not divide into whole channel groups"
                    )
        entering = self.decoder_width
        for level in self.up_levels():
            # what diffusers builds the block's first module for must be the width it is handed
            if level.in_channels != level.out_channels:
                expected = level.in_channels
            else:
                expected = level.out_channels * (level.upscale_factor if level.upsample else 1)
            if expected != entering:
                raise ConfigError(
                    f"config.json: a decoder block built for {expected} channels would be handed {entering} "
                    "(decoder_block_out_channels and upsample_factor do not fit together)"
                )
            if level.upsample and level.residual and math.prod(level.upsample) % level.upscale_factor:
                raise ConfigError("config.json: upsample_factor must divide the upsampler's stride product")
            if level.in_channels != level.out_channels and level.inject_noise:
                # its conv_in's noise scales are as wide as its input, the noise is added to its output
                raise ConfigError(
                    "config.json: decoder_inject_noise on decoder blocks that change width fails in diffusers"
                )
            if level.in_channels != level.out_channels and self.timestep_conditioning:
                # diffusers hands such a block's conv_in the raw timestep, which it cannot unflatten
                raise ConfigError(
                    "config.json: timestep_conditioning with decoder blocks that change width fails in diffusers"
                )
            entering = level.out_channels

    def conv_style(self, part: str) -> ConvStyle:
        if part == "encoder":
            return ConvStyle(self.encoder_causal, self.encoder_padding, self.plain_shortcut)
        return ConvStyle(self.decoder_causal, self.decoder_padding, self.plain_shortcut)

    def down_levels(self) -> list[DownLevel]:
        """The encoder's blocks as LTXVideoEncoder3d builds them."""
        levels = self.encoder_levels
        out, blocks = self.block_out_channels[0], []
        for i in range(levels):
            in_channels = out
            if self.is_095:
                out = self.block_out_channels[i + 1]
            else:
                out = self.block_out_channels[i + 1] if i + 1 < levels else self.block_out_channels[i]
            block_type = self.down_block_types[i]
            downsample = None
            if self.encoder_scaling[i]:
                downsample = "conv" if block_type == "LTXVideoDownBlock3D" else self.downsample_type[i]
            blocks.append(DownLevel(block_type, in_channels, out, self.layers_per_block[i], downsample))
        return blocks

    def up_levels(self) -> list[UpLevel]:
        """The decoder's blocks as LTXVideoDecoder3d builds them (its lists reversed, widths divided by each
        block's upsample_factor)."""
        channels = tuple(reversed(self.decoder_block_out_channels))
        scaling = tuple(reversed(self.decoder_scaling))
        layers = tuple(reversed(self.decoder_layers_per_block))
        noise = tuple(reversed(self.inject_noise))
        residual = tuple(reversed(self.residual))
        factor = tuple(reversed(self.upsample_factor))
        out, blocks = channels[0], []
        for i in range(len(channels)):
            in_channels = out // factor[i]
            out = channels[i] // factor[i]
            blocks.append(
                UpLevel(
                    in_channels,
                    out,
                    layers[i + 1],
                    self.upsample_stride(i) if scaling[i] else None,
                    residual[i],
                    factor[i],
                    noise[i + 1],
                )
            )
        return blocks

    def upsample_stride(self, level: int) -> tuple[int, int, int]:
        """The level-th decoder block's upsampling strides (time, height, width)."""
        return (2, 2, 2)

    @property
    def decoder_width(self) -> int:
        """The decoder's conv_in / mid block width."""
        return self.decoder_block_out_channels[-1]

    @property
    def mid_inject_noise(self) -> bool:
        return tuple(reversed(self.inject_noise))[0]

    @property
    def mid_layers(self) -> int:
        return tuple(reversed(self.decoder_layers_per_block))[0]

    @property
    def injects_noise(self) -> bool:
        """Whether the decoder adds noise (0.9.1's decoder_inject_noise) anywhere."""
        return self.mid_inject_noise or any(level.inject_noise for level in self.up_levels())

    def noise_map_sizes(self, height: int, width: int) -> list[tuple[int, int]]:
        """The (height, width) of each noise map a decode of a (height, width) latent draws, in diffusers' order:
        two per noise-injecting resnet (after conv1 and after conv2), mid block first."""
        sizes = [(height, width)] * (2 * self.mid_layers if self.mid_inject_noise else 0)
        for level in self.up_levels():
            if level.upsample:
                height, width = height * level.upsample[1], width * level.upsample[2]
            if level.inject_noise:
                sizes += [(height, width)] * (2 * level.num_layers)
        return sizes


@dataclasses.dataclass(frozen=True)
class LTX2VideoVAEConfig(LTXVideoVAEConfig):
    """diffusers' `AutoencoderKLLTX2Video.__init__` (LTX-2.0's layout by default): 0.9.5's blocks with the encoder's
    widths counted after conv_in (which makes latent_channels), upsamplers of any stride kind, plain 1x1x1
    shortcuts, spatial padding chosen per side, and per-block lists that may be one bool for all."""

    block_out_channels: tuple[int, ...] = (256, 512, 1024, 2048)
    down_block_types: tuple[str, ...] = ("LTX2VideoDownBlock3D",) * 4
    decoder_block_out_channels: tuple[int, ...] = (256, 512, 1024)
    layers_per_block: tuple[int, ...] = (4, 6, 6, 2, 2)
    decoder_layers_per_block: tuple[int, ...] = (5, 5, 5, 5)
    spatio_temporal_scaling: bool | tuple[bool, ...] = (True, True, True, True)
    decoder_spatio_temporal_scaling: bool | tuple[bool, ...] = (True, True, True)
    decoder_inject_noise: bool | tuple[bool, ...] = (False, False, False, False)
    downsample_type: tuple[str, ...] = ("spatial", "temporal", "spatiotemporal", "spatiotemporal")
    upsample_type: tuple[str, ...] = ("spatiotemporal", "spatiotemporal", "spatiotemporal")
    upsample_residual: bool | tuple[bool, ...] = (True, True, True)
    upsample_factor: tuple[int, ...] = (2, 2, 2)
    decoder_causal: bool = True
    encoder_spatial_padding_mode: str = "zeros"
    decoder_spatial_padding_mode: str = "reflect"

    class_name = "AutoencoderKLLTX2Video"
    down_block_names = ("LTX2VideoDownBlock3D",)
    plain_shortcut = True

    @property
    def variant(self) -> str:
        return "LTX-2 video VAE"

    @property
    def encoder_padding(self) -> str:
        return self.encoder_spatial_padding_mode

    @property
    def decoder_padding(self) -> str:
        return self.decoder_spatial_padding_mode

    @property
    def is_095(self) -> bool:
        return False

    @property
    def encoder_levels(self) -> int:
        return len(self.block_out_channels)

    @property
    def encoder_in_width(self) -> int:
        return self.latent_channels

    @staticmethod
    def _each(value, count: int) -> tuple:
        return (value,) * count if isinstance(value, bool) else value

    @property
    def encoder_scaling(self) -> tuple[bool, ...]:
        return self._each(self.spatio_temporal_scaling, len(self.layers_per_block) - 1)

    @property
    def decoder_scaling(self) -> tuple[bool, ...]:
        return self._each(self.decoder_spatio_temporal_scaling, len(self.decoder_layers_per_block) - 1)

    @property
    def inject_noise(self) -> tuple[bool, ...]:
        return self._each(self.decoder_inject_noise, len(self.decoder_layers_per_block))

    @property
    def residual(self) -> tuple[bool, ...]:
        return self._each(self.upsample_residual, len(self.decoder_layers_per_block) - 1)

    def ensure_supported(self):
        modes = ("zeros", "reflect")
        for name in ("encoder_spatial_padding_mode", "decoder_spatial_padding_mode"):
            if getattr(self, name) not in modes:
                raise ConfigError(f"config.json: {name} must be one of {list(modes)}")
        if len(self.upsample_type) < len(self.decoder_block_out_channels):
            raise ConfigError("config.json: upsample_type is shorter than decoder_block_out_channels")
        if any(t not in STRIDES or t == "conv" for t in self.upsample_type):
            raise ConfigError("config.json: upsample_type entries must be spatial, temporal or spatiotemporal")
        super().ensure_supported()

    def down_levels(self) -> list[DownLevel]:
        """The encoder's blocks as LTX2VideoEncoder3d builds them: block i goes to block_out_channels[i]."""
        widths = (self.latent_channels, *self.block_out_channels)
        return [
            DownLevel(
                self.down_block_types[i],
                widths[i],
                widths[i + 1],
                self.layers_per_block[i],
                self.downsample_type[i] if self.encoder_scaling[i] else None,
            )
            for i in range(len(self.block_out_channels))
        ]

    def upsample_stride(self, level: int) -> tuple[int, int, int]:
        return STRIDES[self.upsample_type[level]]  # diffusers reads this list in its own order, not reversed


@dataclasses.dataclass(frozen=True)
class LTXVideoTiling(SampleTiling):
    """diffusers' `AutoencoderKLLTXVideo.enable_tiling` defaults."""

    tile_sample_min_height: int = 512
    tile_sample_min_width: int = 512
    tile_sample_min_num_frames: int = 16
    tile_sample_stride_height: int = 448
    tile_sample_stride_width: int = 448
    tile_sample_stride_num_frames: int = 8


# The published layouts, as changes to the class defaults (0.9.0's): diffusers' scripts/convert_ltx_to_diffusers.py
LTX_091_CONFIG = dict(
    decoder_block_out_channels=(256, 512, 1024),
    decoder_layers_per_block=(5, 6, 7, 8),
    decoder_spatio_temporal_scaling=(True, True, True),
    decoder_inject_noise=(True, True, True, False),
    upsample_residual=(True, True, True),
    upsample_factor=(2, 2, 2),
    timestep_conditioning=True,
)
LTX_095_CONFIG = dict(
    block_out_channels=(128, 256, 512, 1024, 2048),
    down_block_types=("LTXVideo095DownBlock3D",) * 4,
    decoder_block_out_channels=(256, 512, 1024),
    layers_per_block=(4, 6, 6, 2, 2),
    decoder_layers_per_block=(5, 5, 5, 5),
    spatio_temporal_scaling=(True, True, True, True),
    decoder_spatio_temporal_scaling=(True, True, True),
    decoder_inject_noise=(False, False, False, False),
    downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
    upsample_residual=(True, True, True),
    upsample_factor=(2, 2, 2),
    timestep_conditioning=True,
    spatial_compression_ratio=32,
    temporal_compression_ratio=8,
)

# LTX-2.0 is the LTX-2 class's defaults with a non-causal decoder and explicit ratios; 2.3 (and 2.5's conv VAE) from
# diffusers' scripts/convert_ltx2_to_diffusers.py and the published config
LTX2_20_CONFIG = dict(decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8)
LTX2_23_CONFIG = dict(
    block_out_channels=(256, 512, 1024, 1024),
    decoder_block_out_channels=(256, 512, 512, 1024),
    layers_per_block=(4, 6, 4, 2, 2),
    decoder_layers_per_block=(4, 6, 4, 2, 2),
    decoder_spatio_temporal_scaling=(True, True, True, True),
    decoder_inject_noise=(False, False, False, False, False),
    upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
    upsample_residual=(False, False, False, False),
    upsample_factor=(2, 2, 1, 2),
    decoder_spatial_padding_mode="zeros",
    decoder_causal=False,
    spatial_compression_ratio=32,
    temporal_compression_ratio=8,
)
