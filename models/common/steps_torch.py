"""Running a PyTorch VAE chunk by chunk, for every family: the same step as the Flax models'
(models/common/steps_flax.py), with the causal cache passed explicitly from one chunk to the next, so that torchax can
jit each step (converter/torchax_runtime.py); tile by tile when tiling is on."""

from __future__ import annotations

import torch
from torch import nn

from .protocol import keeps_cache
from .tiling import TilingMixin, run_framewise, run_tiled


class ChunkedAutoencoder(TilingMixin, nn.Module):
    """Subclasses define encoder, decoder, quant_conv and post_quant_conv (either may be None), and `config`."""

    def chunk_step(self, part: str, x: torch.Tensor, cache, inputs: dict, keep_cache: bool = True):
        """One chunk through the encoder then quant_conv, or post_quant_conv then the decoder, with the part's extra
        inputs (tensors by keyword, {} for most families), and its cache (None without `keep_cache`: no later chunk
        takes it). The 1x1x1 quant convs act per pixel, so applying them per chunk is exact."""
        if part == "decoder" and self.post_quant_conv is not None:
            x = self.post_quant_conv(x)
        x, cache = getattr(self, part)(x, cache, **inputs)
        if part == "encoder" and self.quant_conv is not None:
            x = self.quant_conv(x)
        return x, cache if keep_cache else None

    def run_chunks(
        self, part: str, x: torch.Tensor, bounds: list[tuple[int, int]] | None, step=None, inputs=None
    ) -> torch.Tensor:
        """x (B, C, T, H, W) through `part` ("encoder" or "decoder") in chunks of frames [start, end), the cache
        carried from one to the next (bounds None: x is an image (B, C, H, W), run in one step), `inputs` (keyword
        tensors) given to every chunk of every tile (or a function of the tile's input that returns them).
        `step(part, chunk, cache, inputs, keep_cache)` runs one chunk: `chunk_step` unless the torchax runtime passes
        its compiled one."""
        step = step or self.chunk_step

        def run(x):
            outs, cache, given = [], None, inputs(x) if callable(inputs) else inputs or {}
            if bounds is None:  # an image: no frames, one step
                return step(part, x, None, given, False)[0]
            keep = keeps_cache(bounds)
            for start, end in bounds:
                out, cache = step(part, x[:, :, start:end], cache, given, keep)
                outs.append(out)
            return torch.cat(outs, dim=2)

        return run_tiled(
            run,
            x,
            self.tile_plan(part),
            h_axis=x.ndim - 2,
            concat=torch.cat,
            as_array=lambda values, like: torch.as_tensor(values, dtype=like.dtype, device=like.device),
        )

    def run_image(self, part: str, x: torch.Tensor, step=None) -> torch.Tensor:
        """x (B, C, H, W) through `part` in one step (an image model: no frames, no cache), tile by tile when tiling
        is on."""
        return self.run_chunks(part, x, None, step)

    def run_clip(self, part: str, x, out_frames: int, framewise: bool, step=None, inputs=None, drop_last=False):
        """x (B, C, T, H, W) through `part` whole (families with no causal cache), or, with `framewise` and more
        frames than one temporal tile, in diffusers' overlapping temporal tiles (steps_flax.run_clip)."""

        def run(clip):
            return self.run_chunks(part, clip, [(0, clip.shape[2])], step, inputs)

        tiles = (self.tiling or self.tiling_class()).frame_tiles(self.config, part)
        if not framewise or x.shape[2] < tiles[0]:
            return run(x)
        return run_framewise(
            run,
            x,
            tiles,
            out_frames,
            t_axis=2,
            concat=torch.cat,
            as_array=lambda values, like: torch.as_tensor(values, dtype=like.dtype, device=like.device),
            drop_last=drop_last,
        )
