"""MiniMax-H3's video VAE configuration (diffusers' `AutoencoderKLMiniMaxH3`), read from a diffusers `config.json`;
shared by both implementations, with the temporal geometry its encode and decode derive from it and diffusers'
tile placement (tiling is on by default, as the model was released)."""

from __future__ import annotations

import dataclasses
import itertools
import math

from ..common.config import LAYERS, STRIDE, WIDTH, Bound, ConfigError, DiffusersConfig

DEPTH = Bound(256, "a transformer depth; the released ViT decoder has 36 blocks")
TOKENS = Bound(1024, "a count of register tokens; the release has 4", minimum=0)
FRAMES = Bound(1024, "frames of a clip; the release encodes 17 at a time")
DROPPED = Bound(1024, "latent frames an encode drops from each clip's end; the release drops 3", minimum=0)


@dataclasses.dataclass(frozen=True)
class AutoencoderKLMiniMaxH3Config(DiffusersConfig):
    """Fields and defaults as in diffusers' `AutoencoderKLMiniMaxH3.__init__` (the released MiniMax-H3 video VAE's)."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 24
    block_out_channels: tuple[int, ...] = (128, 256, 256, 512, 512, 1024)
    layers_per_block: int = 2
    spatial_downsample_factors: tuple[int, ...] = (2, 2, 2, 2, 1, 1)
    temporal_downsample_factors: tuple[int, ...] = (1, 2, 2, 1, 1, 1)
    norm_num_groups: int = 32
    norm_eps: float = 1e-6
    spatial_padding_mode: str = "reflect"
    decoder_num_layers: int = 36
    decoder_num_attention_heads: int = 32
    decoder_attention_head_dim: int = 64
    decoder_num_register_tokens: int = 4
    decoder_ffn_mult: int = 4
    decoder_rope_theta: float = 100.0
    decoder_rope_dim_ratio: float = 0.75
    decoder_norm_eps: float = 1e-5
    clip_length: int = 17
    token_drop: int = 3
    latents_mean: tuple[float, ...] = (0.0,) * 24
    latents_std: tuple[float, ...] = (1.0,) * 24

    class_name = "AutoencoderKLMiniMaxH3"
    bounds = {
        "in_channels": WIDTH,
        "out_channels": WIDTH,
        "latent_channels": WIDTH,
        "block_out_channels": WIDTH,
        "layers_per_block": LAYERS,
        "spatial_downsample_factors": STRIDE,
        "temporal_downsample_factors": STRIDE,
        "norm_num_groups": WIDTH,
        "decoder_num_layers": DEPTH,
        "decoder_num_attention_heads": WIDTH,
        "decoder_attention_head_dim": WIDTH,
        "decoder_num_register_tokens": TOKENS,
        "decoder_ffn_mult": STRIDE,
        "clip_length": FRAMES,
        "token_drop": DROPPED,
    }

    @property
    def variant(self) -> str:
        return "MiniMax-H3 video VAE"

    @property
    def latent_scaling(self) -> str:
        return "per channel: (z - latents_mean) / latents_std (config); pixels ImageNet-normalised [0, 1] RGB"

    @property
    def spatial_ratio(self) -> int:
        return math.prod(self.spatial_downsample_factors)

    @property
    def temporal_ratio(self) -> int:
        return math.prod(self.temporal_downsample_factors)

    @property
    def dim(self) -> int:
        """The ViT decoder's width."""
        return self.decoder_num_attention_heads * self.decoder_attention_head_dim

    @property
    def rope_dim(self) -> int:
        """The leading channels of each head the rotary embedding turns."""
        return int(self.decoder_attention_head_dim * self.decoder_rope_dim_ratio)

    # The temporal geometry, as diffusers derives it: a clip of `clip_length` frames is not a whole number of
    # latent frames, so the decoder drops `frame_pre_padding` frames in front of each chunk's output, and the
    # `token_drop` latent frames an encode removes leave consecutive decoded chunks overlapping.
    @property
    def frame_pre_padding(self) -> int:
        return -self.clip_length % self.temporal_ratio

    @property
    def tokens_chunk_size(self) -> int:
        return -(-self.clip_length // self.temporal_ratio)

    @property
    def token_overlap(self) -> int:
        return -self.token_drop % self.tokens_chunk_size

    @property
    def frame_overlap(self) -> int:
        return max(self.token_overlap * self.temporal_ratio - self.frame_pre_padding, 0)

    def ensure_supported(self):
        levels = len(self.block_out_channels)
        if not levels == len(self.spatial_downsample_factors) == len(self.temporal_downsample_factors):
            raise ConfigError(
                "config.json: block_out_channels, spatial_downsample_factors and temporal_downsample_factors differ "
                "in length"
            )
        # diffusers' downsampler pads space only for a spatial stride of 2: at stride 1 its 3x3x3 convolution cuts a
        # row and a column off each side, so latents no longer map to pixels by the ratio
        for level, (space, time) in enumerate(zip(self.spatial_downsample_factors, self.temporal_downsample_factors)):
            if space == 1 and time > 1:
                raise ConfigError(
                    f"config.json: level {level} downsamples in time alone, where diffusers' downsampler also "
                    "shrinks each frame by 2 pixels; a level that downsamples time must downsample space too"
                )
        # diffusers' decode runs (latent frames + token_drop) / tokens_chunk_size - 1 chunks: from two clips' latent
        # frames on, the last one starts at the latent's end
        if self.token_drop >= 2 * self.tokens_chunk_size:
            raise ConfigError(
                f"config.json: token_drop {self.token_drop} is two clips' latent frames or more (a clip of "
                f"{self.clip_length} frames encodes to {self.tokens_chunk_size}), so diffusers' decode would run a "
                "chunk past the latent's end"
            )
        if any(c % self.norm_num_groups for c in self.block_out_channels):
            raise ConfigError("config.json: norm_num_groups must divide every block_out_channels entry")
        if self.spatial_padding_mode not in ("reflect", "replicate", "zeros", "circular"):
            raise ConfigError(f"config.json: spatial_padding_mode {self.spatial_padding_mode!r} is not a padding mode")
        if not 0 < self.decoder_rope_dim_ratio <= 1 or self.rope_dim % 6:
            raise ConfigError(
                "config.json: decoder_rope_dim_ratio must give a share of decoder_attention_head_dim in (0, 1] that "
                f"is a multiple of 6 (two halves of three axes); it gives {self.rope_dim}"
            )
        if len(self.latents_mean) != self.latent_channels or len(self.latents_std) != self.latent_channels:
            raise ConfigError("config.json: latents_mean and latents_std take one value per latent channel")
        if self.spatial_ratio > 64 or self.temporal_ratio > 16:
            raise ConfigError("config.json: the downsample factors multiply to more than 64 in space or 16 in time")

    def decoded_frames(self, latent_frames: int) -> int:
        """Frames `latent_frames` decode to, as diffusers' `_decode` cuts them: each chunk's first part less the
        frames in front, the last chunk's overlapping part, less the frames of repeated latent frames. Every chunk is
        whole but where token_drop passes a clip's latent frames: then the last one is short, and has no overlap."""
        chunks, pad_tokens = self.decode_chunks(latent_frames)
        size, ratio, pre = self.tokens_chunk_size, self.temporal_ratio, self.frame_pre_padding
        frames = overlap = 0
        for start in range(0, chunks * size, size):
            decoded = min(size + self.token_overlap, latent_frames + pad_tokens - start) * ratio
            frames += max(min(decoded, size * ratio) - pre, 0)
            overlap = max(min(decoded - size * ratio, size * ratio) - pre, 0) if self.token_drop else 0
        return frames + overlap - self.padded_frames(latent_frames, pad_tokens)

    def encoded_frames(self, frames: int) -> int:
        """Latent frames an encode of `frames` gives (diffusers' `_encode`): each clip's, the last filled, less the
        `token_drop` at the end; one for a single image."""
        return 1 if frames == 1 else -(-frames // self.clip_length) * self.tokens_chunk_size - self.token_drop

    @property
    def validation_frames(self) -> int:
        """The validation video's frames: those one decoded chunk gives, and a clip more where an encode of those
        would drop every latent frame (a `token_drop` of a clip's latent frames or more)."""
        frames = self.decoded_frames(self.tokens_chunk_size + self.token_overlap)
        return frames if self.encoded_frames(frames) > 0 else frames + self.clip_length

    @property
    def encode_input_limits(self) -> dict:
        """What an encode's input keeps (models/common/inputs.py): the least height and width diffusers' encoder
        runs. PyTorch pads by reflection only an axis wider than the padding (each 3x3x3 convolution's 1, a
        downsampler's 1 after), and a strided convolution must leave a row; the side shrinks level by level as the
        encoder's downsamplers shrink it."""
        wider_than = 1 if self.spatial_padding_mode == "reflect" else 0

        def runs(side: int) -> bool:
            for space, time in zip(self.spatial_downsample_factors, self.temporal_downsample_factors):
                if side <= wider_than:
                    return False
                if space * time > 1:
                    side = (side + (space == 2) - 3) // space + 1
            return side > wider_than

        return {"minimum": next(side for side in itertools.count(1) if runs(side))}

    @property
    def min_decoded_latent_frames(self) -> int:
        """diffusers' decode makes no chunk of fewer (a single encoded image's one latent frame included)."""
        return max(self.tokens_chunk_size - self.token_drop + 1, 1) if self.token_drop else 1

    def decode_chunks(self, latent_frames: int) -> tuple[int, int]:
        """(chunks decoded, latent frames repeated at the end to fill the last one), as diffusers' `_decode`: where
        an encode drops frames, the chunk after the last is its overlap alone, decoded with it. Too few latent frames
        for one chunk are refused (diffusers' decode fails inside)."""
        if latent_frames < self.min_decoded_latent_frames:
            raise ValueError(
                f"decode: takes at least {self.min_decoded_latent_frames} latent frames (one chunk of "
                f"{self.tokens_chunk_size} with the {self.token_drop} an encode drops); got {latent_frames}"
            )
        tokens = latent_frames + self.token_drop
        pad_tokens = -tokens % self.tokens_chunk_size
        return (tokens + pad_tokens) // self.tokens_chunk_size - (self.token_drop > 0), pad_tokens

    def padded_frames(self, latent_frames: int, pad_tokens: int) -> int:
        """The trailing frames the `pad_tokens` repeated latent frames decoded to: a chunk's last latent frame covers
        `clip_length % temporal_ratio` frames where that is not zero, the others `temporal_ratio`."""
        tail = self.clip_length % self.temporal_ratio
        return sum(
            tail if tail and (latent_frames + k) % self.tokens_chunk_size == 0 else self.temporal_ratio
            for k in range(pad_tokens)
        )
