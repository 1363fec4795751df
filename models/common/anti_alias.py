"""The edges of an anti-aliased activation's two filters (BigVGAN's UpSample1d and DownSample1d, as diffusers sets
them), framework-free: the Flax models' function (models/common/resample.py) and the PyTorch models' op
(models/common/layers_torch.py) both take them from here."""

from __future__ import annotations


def edges(up_kernel: int, down_kernel: int, ratio: int) -> tuple[int, tuple[int, int], tuple[int, int]]:
    """(samples replicated each side before upsampling, (start, end) samples cropped after it, (before, after)
    samples replicated around the upsampled signal before the strided low-pass), so that L samples come back as L."""
    pad = up_kernel // ratio - 1
    crop = (pad * ratio + (up_kernel - ratio) // 2, pad * ratio + (up_kernel - ratio + 1) // 2)
    return pad, crop, (down_kernel // 2 + down_kernel % 2 - 1, down_kernel // 2)
