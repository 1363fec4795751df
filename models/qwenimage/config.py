"""The Qwen-Image VAE configuration (diffusers' `AutoencoderKLQwenImage`): Wan 2.1's architecture, configured by
fewer fields; the rest of Wan's are fixed by the class."""

from __future__ import annotations

import dataclasses
import typing

from ..common.config import LAYERS, MULTIPLIER, WIDTH, DiffusersConfig
from ..wan.config import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, WanLayout


@dataclasses.dataclass(frozen=True)
class QwenImageVAEConfig(WanLayout, DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLQwenImage.__init__`."""

    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    input_channels: int = 3
    latents_mean: tuple[float, ...] = tuple(WAN21_LATENTS_MEAN)
    latents_std: tuple[float, ...] = tuple(WAN21_LATENTS_STD)

    class_name = "AutoencoderKLQwenImage"
    bounds = {
        "base_dim": WIDTH,
        "z_dim": WIDTH,
        "input_channels": WIDTH,
        "dim_mult": MULTIPLIER,
        "num_res_blocks": LAYERS,
    }
    # what AutoencoderKLWan configures and this class fixes: Wan 2.1's layout, no patches, one decoder width
    decoder_base_dim: typing.ClassVar[None] = None
    is_residual: typing.ClassVar[bool] = False
    patch_size: typing.ClassVar[None] = None
    scale_factor_temporal: typing.ClassVar[int] = 4

    @property
    def in_channels(self) -> int:
        return self.input_channels

    @property
    def out_channels(self) -> int:
        return self.input_channels

    @property
    def scale_factor_spatial(self) -> int:
        """diffusers' spatial_compression_ratio for this class: 2 per temperal_downsample entry."""
        return 2 ** len(self.temperal_downsample)

    @property
    def variant(self) -> str:
        return "Qwen-Image VAE"
