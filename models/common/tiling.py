"""Spatial tiling as diffusers' `enable_tiling` does it, for every family's models (Flax and PyTorch).

A tiled encode or decode runs the untiled one on overlapping windows of the input, then (`TilePlan.run`, which a
family whose diffusers class joins its tiles otherwise overrides in a subclass of its own) in row-major order, ramps
each tile's first rows into its upper neighbour and its first columns into its left neighbour (both neighbours
already blended, as diffusers' in-place loops leave them), keeps the leading part of each tile and stitches the kept
parts. The tile sizes, strides, ramps and crops are diffusers', so results match `enable_tiling` within tolerance.
Tiles of one size share one compiled step: a video compiles at most four tile shapes (inner, last column, last row,
corner), each once for the first chunk and once for the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class TilePlan:
    """Tiling of one direction (encode or decode); (height, width) pairs. Input sizes are in the input's units
    (latents for decode, pixels for encode), output sizes in the output's."""

    tile: tuple[int, int]  # input window
    stride: tuple[int, int]  # input distance between window starts
    blend: tuple[int, int]  # output rows / columns ramped in from the upper / left neighbour
    keep: tuple[int, int]  # output rows / columns each tile contributes
    crop_scale: tuple[int, int] | None  # (num, den): crop to input size * num // den (Wan); None: no crop
    untiled_max: tuple[int, int] | None = None  # largest input run untiled; None: one tile

    def __post_init__(self):
        if min(self.tile + self.stride) < 1:
            raise ValueError(f"tiling: tile {self.tile} and stride {self.stride} must be at least 1 (tiles too small)")

    def fits_whole(self, x, h_axis: int) -> bool:
        """Whether `x` runs untiled: no larger than one tile (or than `untiled_max`)."""
        limit = self.untiled_max or self.tile
        return x.shape[h_axis] <= limit[0] and x.shape[h_axis + 1] <= limit[1]

    def windows(self, x, h_axis: int) -> list[list[tuple[slice, slice]]]:
        """The tiles' input windows, row by row."""
        height, width = x.shape[h_axis], x.shape[h_axis + 1]
        return [
            [(slice(i, i + self.tile[0]), slice(j, j + self.tile[1])) for j in range(0, width, self.stride[1])]
            for i in range(0, height, self.stride[0])
        ]

    def window_shapes(self, height: int, width: int) -> list[tuple[int, int]]:
        """The (height, width) of each tile's input window over an input of that size, row by row."""
        return [
            (min(self.tile[0], height - i), min(self.tile[1], width - j))
            for i in range(0, height, self.stride[0])
            for j in range(0, width, self.stride[1])
        ]

    def run(self, run: Callable, x, *, h_axis: int, concat: Callable, as_array: Callable):
        """`run(x)` tile by tile: x is any array with height at `h_axis` and width right after it; `run` maps a window
        to an output tile of the same layout; concat(arrays, axis) and as_array(numpy float64 array, like) are the
        framework's."""
        if self.fits_whole(x, h_axis):
            return run(x)
        above, kept_rows = None, []
        for windows in self.windows(x, h_axis):
            row = []
            for n, (rows, cols) in enumerate(windows):
                tile = run(_window(x, h_axis, rows, cols))
                if above is not None:
                    tile = _blend(above[n], tile, h_axis, self.blend[0], concat, as_array)
                if row:
                    tile = _blend(row[-1], tile, h_axis + 1, self.blend[1], concat, as_array)
                row.append(tile)
            kept_rows.append(
                concat([_window(t, h_axis, slice(0, self.keep[0]), slice(0, self.keep[1])) for t in row], h_axis + 1)
            )
            above = row
        out = concat(kept_rows, h_axis)
        if self.crop_scale is not None:
            num, den = self.crop_scale
            height, width = x.shape[h_axis], x.shape[h_axis + 1]
            out = _window(out, h_axis, slice(0, height * num // den), slice(0, width * num // den))
        return out


@dataclasses.dataclass(frozen=True)
class SampleTiling:
    """`enable_tiling` settings as HunyuanVideo's and LTX's diffusers classes take them, in pixels and frames (each
    family's subclass sets diffusers' defaults): spatial tiles, and the overlapping temporal tiles of framewise
    encoding and decoding. The config gives `spatial_ratio` and `temporal_ratio`, as diffusers' attributes."""

    tile_sample_min_height: int
    tile_sample_min_width: int
    tile_sample_min_num_frames: int
    tile_sample_stride_height: int
    tile_sample_stride_width: int
    tile_sample_stride_num_frames: int

    def plans(self, config) -> dict[str, TilePlan]:
        """Spatial tiles, as diffusers' tiled_decode / tiled_encode cut, blend and crop them."""
        ratio = config.spatial_ratio
        sample_min = (self.tile_sample_min_height, self.tile_sample_min_width)
        sample_stride = (self.tile_sample_stride_height, self.tile_sample_stride_width)
        latent_min = tuple(s // ratio for s in sample_min)
        latent_stride = tuple(s // ratio for s in sample_stride)
        return {
            "decoder": TilePlan(
                latent_min,
                latent_stride,
                blend=tuple(m - s for m, s in zip(sample_min, sample_stride)),
                keep=sample_stride,
                crop_scale=(ratio, 1),
            ),
            "encoder": TilePlan(
                sample_min,
                sample_stride,
                blend=tuple(m - s for m, s in zip(latent_min, latent_stride)),
                keep=latent_stride,
                crop_scale=(1, ratio),
            ),
        }

    def frame_tiles(self, config, part: str) -> tuple[int, int, int, int]:
        """diffusers' framewise tiling of `part`: (input frames a tile, input stride, output frames blended, output
        frames each tile keeps after the first), as its _temporal_tiled_decode / _temporal_tiled_encode compute
        them."""
        ratio = config.temporal_ratio
        sample_min, sample_stride = self.tile_sample_min_num_frames, self.tile_sample_stride_num_frames
        latent_min, latent_stride = sample_min // ratio, sample_stride // ratio
        if part == "decoder":
            return latent_min + 1, latent_stride, sample_min - sample_stride, sample_stride
        return sample_min + 1, sample_stride, latent_min - latent_stride, latent_stride


class TilingMixin:
    """diffusers' `enable_tiling` / `disable_tiling`, same keywords. `tiling_class` is the family's settings dataclass
    (fields named like diffusers' keywords, `plans(config)` -> {"encoder": TilePlan, "decoder": TilePlan}), or None
    where diffusers' class does not tile."""

    tiling_class: type | None
    tiling = None

    def enable_tiling(self, **settings):
        """Encode and decode large videos tile by tile; keywords left out (or None) take diffusers' defaults."""
        if self.tiling_class is None:  # as diffusers' AutoencoderMixin says it
            raise NotImplementedError(f"Tiling doesn't seem to be implemented for {type(self).__name__}.")
        self.tiling = self.tiling_class(**{k: v for k, v in settings.items() if v is not None})

    def disable_tiling(self):
        self.tiling = None

    def tile_plan(self, part: str) -> TilePlan | None:
        return None if self.tiling is None else self.tiling.plans(self.config)[part]


def _take(x, axis: int, part: slice):
    index = [slice(None)] * x.ndim
    index[axis] = part
    return x[tuple(index)]


def _window(x, h_axis: int, rows: slice, cols: slice):
    return _take(_take(x, h_axis, rows), h_axis + 1, cols)


def _blend(a, b, axis: int, extent: int, concat: Callable, as_array: Callable):
    """b with its first `extent` entries along `axis` ramped from a's last ones: a * (1 - y/e) + b * (y/e)."""
    extent = min(a.shape[axis], b.shape[axis], extent)
    if extent == 0:
        return b
    ramp = (np.arange(extent) / extent).reshape((extent,) + (1,) * (b.ndim - axis - 1))  # float64, as Python floats
    head = _take(a, axis, slice(a.shape[axis] - extent, None)) * as_array(1 - ramp, b) + _take(
        b, axis, slice(0, extent)
    ) * as_array(ramp, b)
    return concat([head, _take(b, axis, slice(extent, None))], axis)


def run_tiled(run: Callable, x, plan: TilePlan | None, *, h_axis: int, concat: Callable, as_array: Callable):
    """`run(x)`, tile by tile as `plan` runs them where there is one (TilePlan.run)."""
    if plan is None:
        return run(x)
    return plan.run(run, x, h_axis=h_axis, concat=concat, as_array=as_array)


def run_framewise(
    run: Callable,
    x,
    tiles: tuple[int, int, int, int],
    out_frames: int,
    *,
    t_axis: int,
    concat,
    as_array,
    drop_last: bool = False,
):
    """diffusers' overlapping temporal tiles (framewise encoding and decoding): `run` on windows of `tile` frames
    every `stride`; each later tile drops its first output frame (its last with `drop_last`, as LTX's decode does),
    ramps its first `blend` frames in from the previous tile (already blended, as diffusers' in-place loop leaves it)
    and keeps `keep` frames, the first tile `keep + 1`; the result is cropped to `out_frames`.
    tiles: (tile, stride, blend, keep)."""
    tile, stride, blend, keep = tiles
    done = []
    for start in range(0, x.shape[t_axis], stride):
        out = run(_take(x, t_axis, slice(start, start + tile)))
        if done:
            out = _take(out, t_axis, slice(0, -1) if drop_last else slice(1, None))
            out = _blend(done[-1], out, t_axis, blend, concat, as_array)
        done.append(out)
    kept = [_take(t, t_axis, slice(0, keep + (n == 0))) for n, t in enumerate(done)]
    return _take(concat(kept, t_axis), t_axis, slice(0, out_frames))
