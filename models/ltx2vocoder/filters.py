"""The anti-aliasing filters of LTX-2's vocoders, as diffusers computes them at init: the Kaiser-windowed sinc of
the anti-aliased activations (stored in the checkpoint too, where they are loaded from) and the Hann-windowed sinc
of the bandwidth extender's resampler (not stored: computed here, for both implementations)."""

from __future__ import annotations

import functools
import math

import numpy as np


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> np.ndarray:
    """A low-pass filter of `kernel_size` taps, normalised to sum to one (diffusers' `kaiser_sinc_filter1d`)."""
    half_size = kernel_size // 2
    amplitude = 2.285 * (half_size - 1) * math.pi * 4 * half_width + 7.95
    if amplitude > 50.0:
        beta = 0.1102 * (amplitude - 8.7)
    elif amplitude >= 21.0:
        beta = 0.5842 * (amplitude - 21) ** 0.4 + 0.07886 * (amplitude - 21.0)
    else:
        beta = 0.0
    window = np.kaiser(kernel_size, beta)
    time = np.arange(-half_size, half_size) + 0.5 if kernel_size % 2 == 0 else np.arange(kernel_size) - half_size
    taps = 2 * cutoff * window * np.sinc(2 * cutoff * time)
    return (taps / taps.sum()).astype(np.float32)


@functools.cache
def hann_resampler(ratio: int) -> tuple[np.ndarray, int, int, int]:
    """The resampler's filter (torchaudio's sinc interpolation with a squared-cosine window: 6 zero crossings,
    rolloff 0.99) and its (pad, crop at the start, crop at the end) around a transposed convolution of stride
    `ratio`."""
    rolloff, zero_crossings = 0.99, 6
    width = math.ceil(zero_crossings / rolloff)
    kernel_size = 2 * width * ratio + 1
    time = (np.arange(kernel_size, dtype=np.float32) / ratio - width) * np.float32(rolloff)
    window = np.cos(np.clip(time, -zero_crossings, zero_crossings) * math.pi / zero_crossings / 2) ** 2
    taps = (np.sinc(time.astype(np.float64)) * window * rolloff / ratio).astype(np.float32)
    return taps, width, 2 * width * ratio, kernel_size - ratio
