"""The runners: a model driven with channels-first numpy arrays, as validation, the tests and the benchmark compare
models. One protocol for the Flax model, the torchax model and the PyTorch reference; decode's extra inputs (a
family's conditioning, such as a timestep) go by diffusers' keyword names, as numpy arrays (or sequences of them,
such as LTX's noise maps), to the model's own `decode(latents, **inputs)`."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from converter.models.common.protocol import encoded


class Runner(Protocol):
    def decode(self, latent: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        """(B, z, T, H, W) latents -> (B, C, T', H', W') video; an image model's (B, z, H, W) -> (B, C, H', W')."""

    def encode(self, video: np.ndarray) -> tuple[np.ndarray, ...]:
        """(B, C, T, H, W) video, or (B, C, H, W) image -> what encode gives, named by the family's
        `encode_outputs`: the latent distribution's (mean, logvar), or a deterministic encoder's (latents,)."""


def _converted(inputs: dict, convert) -> dict:
    """The decode inputs in the framework's arrays; a sequence input element by element."""
    return {
        name: [convert(v) for v in value] if isinstance(value, (list, tuple)) else convert(value)
        for name, value in inputs.items()
    }


class FlaxRunner:
    """The Flax model, channels-last, driven with channels-first arrays (as the reference takes them), given in
    `dtype` (None: as they come, float32)."""

    def __init__(self, model, dtype=None):
        self.model, self.dtype = model, dtype

    def decode(self, latent: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        return _first(self.model.decode(self.model_input(latent), **inputs))

    def encode(self, video: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(_first(a) for a in encoded(self.model.encode(self.model_input(video))))

    def model_input(self, x: np.ndarray):
        """A channels-first array as the model takes it: channels-last in the given dtype, moved and cast where the
        model runs, as the torchax runner casts: NumPy
        does it on one host core (0.4-0.9 s for a 121x704x1216 video here, about an H200's whole encode of it)."""
        import jax.numpy as jnp

        x = jnp.moveaxis(x, 1, -1)
        return x if self.dtype is None else x.astype(self.dtype)


def _first(x) -> np.ndarray:
    return np.moveaxis(np.asarray(x), -1, 1)


class TorchaxRunner:
    """The PyTorch model on JAX through torchax, each chunk step jitted, in float32 (`native`: in the model's own
    dtype, its inputs cast to it, as `compile_model` runs it for a user)."""

    def __init__(self, model, native: bool = False):
        from converter import torchax_runtime

        self.vae = torchax_runtime.compile_model((model if native else model.float()).eval())

    def decode(self, latent: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        from converter.torchax_runtime import to_numpy

        inputs = _converted(inputs, self.model_input)
        return to_numpy(self.vae.decode(self.model_input(latent), **inputs).sample)

    def encode(self, video: np.ndarray) -> tuple[np.ndarray, ...]:
        from converter.torchax_runtime import to_numpy

        return tuple(map(to_numpy, encoded(self.vae.encode(self.model_input(video)))))

    def model_input(self, x: np.ndarray):
        """An array as the model takes it: a torchax tensor on the device, floating point in the model's dtype."""
        from converter.torchax_runtime import to_jax_tensor

        return to_jax_tensor(self.vae, x)


class TorchRunner:
    """The project's PyTorch model in plain PyTorch, in float32: the reference side of every validation.

    `exact`: with PyTorch's own convolutions rather than oneDNN's, which on a CPU round a deep model's float32 output
    ten times as far (CogVideoX-2b's encoder at full size: 6.9e-5 of its scale on two threads, 1.3e-4 on one, against
    1.6e-5, about XLA's), at twice the time: what a validation that fails measures again (`exact_runner`)."""

    def __init__(self, model, exact: bool = False):
        self.model, self.exact = model.float().eval(), exact

    def decode(self, latent: np.ndarray, **inputs: np.ndarray) -> np.ndarray:
        import torch

        inputs = _converted(inputs, lambda value: torch.from_numpy(np.asarray(value)))
        with torch.no_grad(), self._convolutions():
            return self.model.decode(torch.from_numpy(latent), **inputs).sample.numpy()

    def encode(self, video: np.ndarray) -> tuple[np.ndarray, ...]:
        import torch

        with torch.no_grad(), self._convolutions():
            return tuple(a.numpy() for a in encoded(self.model.encode(torch.from_numpy(video))))

    def _convolutions(self):
        import contextlib

        import torch

        # oneDNN off, its other settings as they are (setting its TF32 warns on a machine without Intel GPUs)
        return torch.backends.mkldnn.flags(False, None, None, None) if self.exact else contextlib.nullcontext()


def exact_runner(runner):
    """The runner computing nearer exactly, where it can (a PyTorch one: `TorchRunner.exact`), else None."""
    return TorchRunner(runner.model, exact=True) if isinstance(runner, TorchRunner) and not runner.exact else None
