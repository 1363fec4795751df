"""LTX-2's audio VAE configuration (diffusers' `AutoencoderKLLTX2Audio`: LTX-2, 2.3 and 2.5 share one), read from a
diffusers `config.json`; shared by both implementations."""

from __future__ import annotations

import dataclasses

from ..common.config import LAYERS, MULTIPLIER, PIXELS, WIDTH, Bound, ConfigError, DiffusersConfig

SAMPLE_RATE = Bound(768_000, "a sample rate in Hz; released audio models use up to 48 kHz")
HOP = Bound(65_536, "a hop in samples; released mel spectrograms use 160")
CAUSALITY = ("none", "width", "height", "width-compatibility")  # diffusers' causality axes
LATENT_DOWNSAMPLE = 4  # mel frames per latent frame, as diffusers' LATENT_DOWNSAMPLE_FACTOR


@dataclasses.dataclass(frozen=True)
class AutoencoderKLLTX2AudioConfig(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLLTX2Audio.__init__` (the released LTX-2 audio VAE's)."""

    base_channels: int = 128
    output_channels: int = 2
    ch_mult: tuple[int, ...] = (1, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] | None = None
    in_channels: int = 2
    resolution: int = 256
    latent_channels: int = 8
    norm_type: str = "pixel"
    causality_axis: str = "height"
    dropout: float = 0.0
    mid_block_add_attention: bool = False
    sample_rate: int = 16000
    mel_hop_length: int = 160
    is_causal: bool = True
    mel_bins: int | None = 64
    double_z: bool = True

    class_name = "AutoencoderKLLTX2Audio"
    bounds = {
        "base_channels": WIDTH,
        "output_channels": WIDTH,
        "ch_mult": MULTIPLIER,
        "num_res_blocks": LAYERS,
        "attn_resolutions": PIXELS,
        "in_channels": WIDTH,
        "resolution": PIXELS,
        "latent_channels": WIDTH,
        "sample_rate": SAMPLE_RATE,
        "mel_hop_length": HOP,
        "mel_bins": WIDTH,
    }

    @property
    def variant(self) -> str:
        return "LTX-2 audio VAE"

    @property
    def latent_scaling(self) -> str:
        """As LTX-2's pipelines apply it: the latent's channels and mel bins flattened, then per entry."""
        return f"channels x mel bins, then (z - latents_mean) / latents_std ({self.base_channels})"

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(self.base_channels * m for m in self.ch_mult)

    @property
    def mel_ratio(self) -> int:
        """Mel bins per latent bin: the encoder halves them at every level but the last."""
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def encode_input_limits(self) -> dict:
        """What an encode's input keeps (models/common/inputs.py): the least (mel frames, mel bins) diffusers'
        encoder runs. Its stride-2 downsamplers pad two zeros before along the causal axis, which leaves a row of any
        length, and one after along the others, which needs two rows to leave one, at every level but the last."""
        pads = downsample_padding(self.causality_axis)
        return {"minimum": tuple(1 if sum(pad) == 2 else self.mel_ratio for pad in pads)}

    def attention_at(self, level: int) -> bool:
        """Whether the level's resnets are each followed by attention: its resolution (`resolution` halved per
        level) is one of attn_resolutions."""
        return bool(self.attn_resolutions) and self.resolution // 2**level in self.attn_resolutions

    def ensure_supported(self):
        if not self.ch_mult:
            raise ConfigError("config.json: ch_mult is empty (a level each; diffusers' model needs one at least)")
        if self.norm_type not in ("pixel", "group"):
            raise ConfigError(f"config.json: norm_type {self.norm_type!r} is not supported (pixel, group)")
        if self.causality_axis not in CAUSALITY:
            raise ConfigError(f"config.json: causality_axis {self.causality_axis!r} is not one of {list(CAUSALITY)}")
        if self.norm_type == "group" and self.causality_axis != "none":
            raise ConfigError("config.json: a causal model takes norm_type pixel (diffusers refuses group norm there)")
        if self.norm_type == "group" and any(w % 32 for w in self.widths):
            raise ConfigError("config.json: group norm takes 32 groups: every width must be a multiple of 32")
        if not self.double_z:
            raise ConfigError("config.json: double_z false gives no latent distribution (its log-variance)")


def causal_padding(axis: str, kernel: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) zeros a causal convolution of `kernel` takes: all k - 1 before the causal axis
    (height: time; width: mel bins), split around the other."""
    p = kernel - 1
    around = (p // 2, p - p // 2)
    if axis == "height":
        return (p, 0), around
    if axis in ("width", "width-compatibility"):
        return around, (p, 0)
    return around, around


def downsample_padding(axis: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) zeros before a downsampler's stride-2 3x3 convolution, as diffusers pads."""
    return {
        "none": ((0, 1), (0, 1)),
        "width": ((0, 1), (2, 0)),
        "height": ((2, 0), (0, 1)),
        "width-compatibility": ((0, 1), (1, 0)),
    }[axis]


def upsample_crop(axis: str) -> tuple[int, int]:
    """(rows, columns) an upsampler drops at the start after its causal convolution."""
    return {"height": (1, 0), "width": (0, 1)}.get(axis, (0, 0))


def decoded_size(config: AutoencoderKLLTX2AudioConfig, latent_frames: int, latent_bins: int) -> tuple[int, int]:
    """(mel frames, mel bins) the decoder crops or zero-pads its output to: 4 frames a latent frame, 3 fewer causally
    (at least 1), and the configured mel bins."""
    frames = latent_frames * LATENT_DOWNSAMPLE
    if config.causality_axis is not None:
        frames = max(frames - (LATENT_DOWNSAMPLE - 1), 1)
    return frames, config.mel_bins if config.mel_bins is not None else latent_bins
