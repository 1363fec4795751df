"""The noise LTX-Video 0.9.1's decoder adds after its convolutions (`decoder_inject_noise`), as explicit inputs.

diffusers draws one (height, width) map of standard normal noise after each convolution of a noise-injecting resnet,
from torch's global generator, inside decode. Here a decode draws the maps of each decoder call (each tile) before
the call, in diffusers' order and shapes (`LTXVideoVAEConfig.noise_map_sizes`), and hands them to the decoder as one
of its inputs; the decoder scales and adds them as diffusers does. Where they come from is the caller's choice: a
sequence of maps (one untiled decode), an integer seed (NumPy draws: the same maps on every target, which is what
validation uses), or the framework's own generator (modeling_flax.py, modeling_torch.py)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import numpy as np

from .config import LTXVideoVAEConfig


def noise_maps(config: LTXVideoVAEConfig, source, draw: Callable, as_array: Callable) -> Callable:
    """-> (latent window (height, width)) -> the tuple of maps one decoder call adds.

    source: a sequence of maps (used as they are, for a single decoder call), an integer seed (0-d arrays too) or a
    NumPy generator, or anything else, which `draw(shapes, call)` turns into maps for the `call`-th decoder call of
    this decode.
    as_array(a numpy or the framework's array) -> the framework's array."""
    calls = iter(range(1 << 30))
    if isinstance(source, Sequence):
        maps = tuple(as_array(m) for m in source)

        def given(height, width):
            expected = config.noise_map_sizes(height, width)
            shapes = [tuple(m.shape) for m in maps]
            if shapes != expected:
                raise ValueError(f"noise: expected maps of shapes {expected} for this decode, got {shapes}")
            return maps

        return given
    if isinstance(source, np.random.Generator) or _is_seed(source):
        generator = source if isinstance(source, np.random.Generator) else np.random.default_rng(int(source))

        def seeded(height, width):
            return tuple(
                as_array(generator.standard_normal(shape, np.float32))
                for shape in config.noise_map_sizes(height, width)
            )

        return seeded

    def drawn(height, width):
        return tuple(draw(config.noise_map_sizes(height, width), next(calls)))

    return drawn


def _is_seed(source) -> bool:
    if isinstance(source, numbers.Integral) and not isinstance(source, bool):
        return True
    dtype = getattr(source, "dtype", None)
    return getattr(source, "ndim", None) == 0 and dtype is not None and "int" in str(dtype)
