"""MiniMax-H3's geometry, for both implementations: the clips an encode runs and the chunks a decode runs in time,
cross-faded as diffusers' `_encode` / `_decode` do, and its tiles in space (`_split_tiles`, `_stitch_tiles`); the
decoder's rotary frequencies and token coordinates. Framework-neutral: `run`, `concat` and `as_array` are the
caller's, as in models/common/tiling.py."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..common.tiling import TilePlan, _blend, _take, _window
from .config import AutoencoderKLMiniMaxH3Config


def encode_in_clips(run, x, config: AutoencoderKLMiniMaxH3Config, *, t_axis: int, concat):
    """`run(x, bounds)` (the runner's chunks: each clip through the encoder alone) over `clip_length`-frame clips,
    the last filled by repeating its last frame, less the `token_drop` latent frames at the end; a single image is
    one clip of one frame."""
    frames, clip = x.shape[t_axis], config.clip_length
    if frames == 1:
        return run(x, [(0, 1)])
    last = _take(x, t_axis, slice(frames - 1, frames))
    x = concat([x] + [last] * (-frames % clip), t_axis)
    moments = run(x, [(start, start + clip) for start in range(0, x.shape[t_axis], clip)])
    return _take(moments, t_axis, slice(0, moments.shape[t_axis] - config.token_drop))


def decode_in_chunks(run, z, config: AutoencoderKLMiniMaxH3Config, *, t_axis: int, concat, as_array):
    """`run(chunk)` (one chunk of latent frames through the decoder) over chunks of `tokens_chunk_size` latent frames
    and the `token_overlap` after them, the last latent frame repeated to fill the last; each chunk's output less its
    first `frame_pre_padding` frames, its overlapping part (where an encode drops frames) ramped into the next chunk's
    start; the frames of the repeated latent frames cut off."""
    frames = z.shape[t_axis]
    chunks, pad_tokens = config.decode_chunks(frames)  # refuses too few
    last = _take(z, t_axis, slice(frames - 1, frames))
    z = concat([z] + [last] * pad_tokens, t_axis)
    size, ratio, pre = config.tokens_chunk_size, config.temporal_ratio, config.frame_pre_padding
    kept, overlap = [], None
    for i in range(chunks):
        clip = run(_take(z, t_axis, slice(i * size, (i + 1) * size + config.token_overlap)))
        head = _take(clip, t_axis, slice(pre, size * ratio))
        if overlap is not None:
            head = _blend(overlap, head, t_axis, config.frame_overlap, concat, as_array)
        kept.append(head)
        if config.token_drop:
            overlap = _take(clip, t_axis, slice(size * ratio + pre, 2 * size * ratio))
    kept += [overlap] if overlap is not None else []
    out = concat(kept, t_axis)
    return _take(out, t_axis, slice(0, out.shape[t_axis] - config.padded_frames(frames, pad_tokens)))


@dataclasses.dataclass(frozen=True)
class MiniMaxH3Tiling:
    """`AutoencoderKLMiniMaxH3.enable_tiling`'s keywords and defaults, in pixels: tiles of a fixed size, as few as
    cover the frame with overlaps of at least the minimum, the spare pixels spread over the overlaps round-robin in
    steps of the spatial ratio so every seam stays on the latent grid (its `_split_tiles`)."""

    tile_sample_min_height: int = 256
    tile_sample_min_width: int = 256
    tile_sample_min_overlap_height: int = 64
    tile_sample_min_overlap_width: int = 64

    def plans(self, config: AutoencoderKLMiniMaxH3Config) -> dict[str, TilePlan]:
        tile = (self.tile_sample_min_height, self.tile_sample_min_width)
        overlap = (self.tile_sample_min_overlap_height, self.tile_sample_min_overlap_width)
        return {part: SplitTilePlan.of(tile, overlap, config.spatial_ratio, part) for part in ("encoder", "decoder")}


@dataclasses.dataclass(frozen=True)
class SplitTilePlan(TilePlan):
    """MiniMax-H3's tiles (`_split_tiles`, `_stitch_tiles`): laid out in pixels over the frame, each boundary with an
    overlap of its own; each tile ramps in from its neighbours' outputs as they came from the model (not as blended),
    the one above first, and gives up its last overlap rows and columns to the next."""

    sample_tile: tuple[int, int] = (256, 256)
    min_overlap: tuple[int, int] = (64, 64)
    ratio: int = 16
    decodes: bool = True  # windows in latents, blends in pixels; the encoder the other way round

    @classmethod
    def of(cls, tile, overlap, ratio: int, part: str) -> SplitTilePlan:
        latent_tile = tuple(max(t // ratio, 1) for t in tile)
        return cls(latent_tile, latent_tile, (0, 0), (0, 0), None, sample_tile=tuple(tile), min_overlap=tuple(overlap),
                   ratio=ratio, decodes=part == "decoder")  # fmt: skip

    def split(self, length: int, axis: int) -> tuple[list[int], list[int]]:
        """(tile starts, overlaps) in pixels over a side of `length` pixels, as diffusers' `_split_tiles`."""
        tile, min_overlap = self.sample_tile[axis], self.min_overlap[axis]
        if tile >= length:
            return [0], []
        count = -(-length // tile)
        while tile * count - min_overlap * (count - 1) < length:
            count += 1
        overlaps = [min_overlap] * (count - 1)
        for i in range((tile * count - sum(overlaps) - length) // self.ratio):
            overlaps[i % (count - 1)] += self.ratio
        starts = [0]
        for o in overlaps:
            starts.append(starts[-1] + tile - o)
        return starts, overlaps

    def fits_whole(self, x, h_axis: int) -> bool:
        scale = self.ratio if self.decodes else 1
        return all(x.shape[h_axis + a] * scale <= self.sample_tile[a] for a in (0, 1))

    def window_shapes(self, height: int, width: int) -> list[tuple[int, int]]:
        scale = self.ratio if self.decodes else 1
        (rows, _), (cols, _) = self.split(height * scale, 0), self.split(width * scale, 1)
        tile = [t // scale for t in self.sample_tile]
        return [(min(tile[0], height - i // scale), min(tile[1], width - j // scale)) for i in rows for j in cols]

    def run(self, run, x, *, h_axis: int, concat, as_array):
        if self.fits_whole(x, h_axis):
            return run(x)
        scale = self.ratio if self.decodes else 1  # input units per pixel of the layout
        (rows, row_overlaps), (cols, col_overlaps) = (self.split(x.shape[h_axis + a] * scale, a) for a in (0, 1))
        if not self.decodes:  # the encoder's outputs are latents: its seams blend over latent rows
            row_overlaps, col_overlaps = ([o // self.ratio for o in v] for v in (row_overlaps, col_overlaps))
        height, width = (t // scale for t in self.sample_tile)
        tiles = [
            [run(_window(x, h_axis, slice(i // scale, i // scale + height), slice(j // scale, j // scale + width)))
             for j in cols]
            for i in rows
        ]  # fmt: skip
        out_rows = []
        for r, row in enumerate(tiles):
            kept = []
            for c, tile in enumerate(row):
                if r:
                    tile = _blend(tiles[r - 1][c], tile, h_axis, row_overlaps[r - 1], concat, as_array)
                if c:
                    tile = _blend(row[c - 1], tile, h_axis + 1, col_overlaps[c - 1], concat, as_array)
                if r < len(tiles) - 1:
                    tile = _take(tile, h_axis, slice(0, tile.shape[h_axis] - row_overlaps[r]))
                if c < len(row) - 1:
                    tile = _take(tile, h_axis + 1, slice(0, tile.shape[h_axis + 1] - col_overlaps[c]))
                kept.append(tile)
            out_rows.append(concat(kept, h_axis + 1))
        return concat(out_rows, h_axis)


def rope_angles(config: AutoencoderKLMiniMaxH3Config, frames: int, height: int, width: int) -> np.ndarray:
    """(tokens, rope_dim) float32 angles of the decoder's rotary embedding, as diffusers computes them: each latent
    voxel's (t, h, w) coordinates `2 (i + 0.5) / size - 1` in order, then the register tokens and the zero token at
    0; `2 pi coordinate inv_freq` with `inv_freq = 1 / theta ** arange(0, 1, 6 / rope_dim)`, the three axes'
    concatenated, then repeated for the second half of the turned channels."""
    grids = [
        2.0 * (np.arange(0.5, size, dtype=np.float32) / np.float32(size)) - 1.0 for size in (frames, height, width)
    ]
    grid = np.stack(np.meshgrid(*grids, indexing="ij"), axis=-1).reshape(-1, 3)
    suffix = np.zeros((config.decoder_num_register_tokens + 1, 3), np.float32)
    positions = np.concatenate([grid, suffix]).astype(np.float32)
    inv_freq = 1.0 / np.float32(config.decoder_rope_theta) ** np.arange(0, 1, 6 / config.rope_dim, dtype=np.float32)
    angles = (np.float32(2.0 * np.pi) * positions)[:, :, None] * inv_freq.astype(np.float32)  # (N, 3, F)
    return np.tile(angles.reshape(len(positions), -1), 2).astype(np.float32)
