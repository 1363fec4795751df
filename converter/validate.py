"""Validation: the written output, loaded back through the load API, must reproduce the reference.

The reference is the project's PyTorch implementation run in plain PyTorch on the *source* weights. Both sides
compute in float32 on weights rounded to the output dtype, so the check isolates the conversion (names, layouts,
the target implementation) from rounding, and the tolerance stays tight for bfloat16 outputs too.
"""

from __future__ import annotations

import dataclasses

import numpy as np

RTOL = 1e-4  # the tolerance is RTOL * max(1, max |reference|)


@dataclasses.dataclass
class Comparison:
    name: str
    shape: tuple
    expected_shape: tuple
    max_abs: float
    mean_abs: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.shape == self.expected_shape and self.max_abs <= self.tol

    def line(self) -> str:
        mark = "✓" if self.ok else "✗"
        shape = "x".join(map(str, self.shape))
        if self.shape != self.expected_shape:
            return f"  {mark} {self.name:<14} shape {shape}, expected {'x'.join(map(str, self.expected_shape))}"
        return (
            f"  {mark} {self.name:<14} {shape:<18} max |Δ| {self.max_abs:.2e}  mean |Δ| {self.mean_abs:.2e}"
            f"  tol {self.tol:.1e}"
        )

    @classmethod
    def from_dict(cls, record: dict) -> Comparison:
        """A comparison as `as_dict` recorded it (a shape mismatch is recorded with an infinite difference)."""
        shape = tuple(record["shape"])
        return cls(record["output"], shape, shape, record["max_abs"], record["mean_abs"], record["tol"])

    def as_dict(self) -> dict:
        return {
            "output": self.name,
            "shape": list(self.shape),
            "max_abs": self.max_abs,
            "mean_abs": self.mean_abs,
            "tol": self.tol,
            "ok": self.ok,
        }


def compare(name: str, got: np.ndarray, expected: np.ndarray) -> Comparison:
    tol = RTOL * max(1.0, float(np.abs(expected).max()))
    if got.shape != expected.shape:
        return Comparison(name, got.shape, expected.shape, float("inf"), float("inf"), tol)
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    return Comparison(name, got.shape, expected.shape, float(diff.max()), float(diff.mean()), tol)


def validation_inputs(family, config) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic latent and video (channels-first) of the family's validation shapes."""
    rng = np.random.default_rng(0)
    latent = rng.standard_normal(family.validation_latent_shape(config)).astype(np.float32)
    video = rng.uniform(-1.0, 1.0, family.validation_video_shape(config)).astype(np.float32)
    return latent, video


def reference_outputs(family, config, source_weights, dtype, latent, video) -> dict[str, np.ndarray]:
    import torch

    model = family.torch_model()(config).eval()
    state = {
        k: torch.from_numpy(np.asarray(source_weights[k]).astype(dtype).astype(np.float32))
        for k in source_weights.specs
    }
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        posterior = model.encode(torch.from_numpy(video)).latent_dist
        return {
            "decode": model.decode(torch.from_numpy(latent)).sample.numpy(),
            "encode.mean": posterior.mean.numpy(),
            "encode.logvar": posterior.logvar.numpy(),
        }


def run(family, config, runner, source_weights, dtype) -> list[Comparison]:
    """Decodes and encodes the validation inputs with `runner` (a target's runner around the converted model)."""
    latent, video = validation_inputs(family, config)
    expected = reference_outputs(family, config, source_weights, dtype, latent, video)
    mean, logvar = runner.encode(video)
    got = {"decode": runner.decode(latent), "encode.mean": mean, "encode.logvar": logvar}
    return [compare(name, got[name], expected[name]) for name in expected]
