"""Running a PyTorch VAE chunk by chunk, shared by both families: the causal cache passed explicitly from one step
to the next (so torchax can jit each step, see converter/torchax_runtime.py), and tile by tile when tiling is on."""
from __future__ import annotations

import torch
from torch import nn

from models.tiling import TilingMixin, run_tiled


class ChunkedAutoencoder(TilingMixin, nn.Module):
    """Subclasses define encoder, decoder, quant_conv and post_quant_conv (either may be None), and `config`."""

    def run_step(self, block: nn.Module, x, cache):
        """One encoder/decoder chunk. The torchax runtime replaces this with a compiled step."""
        return block(x, cache)

    def run_chunks(self, part: str, x: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
        """x (B, C, T, H, W) through the encoder (then quant_conv) or the decoder (after post_quant_conv) in chunks
        of frames [start, end); the 1x1x1 quant convs act per pixel, so applying them per chunk is exact."""

        def run(x):
            outs, cache = [], None
            for start, end in bounds:
                chunk = x[:, :, start:end]
                if part == "decoder" and self.post_quant_conv is not None:
                    chunk = self.post_quant_conv(chunk)
                out, cache = self.run_step(getattr(self, part), chunk, cache)
                outs.append(self.quant_conv(out) if part == "encoder" and self.quant_conv is not None else out)
            return torch.cat(outs, dim=2)

        return run_tiled(run, x, self.tile_plan(part), h_axis=3, concat=torch.cat,
                         as_array=lambda values, like: torch.as_tensor(values, dtype=like.dtype, device=like.device))
