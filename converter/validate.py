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


class TorchRunner:
    """The project's PyTorch model in plain PyTorch, in float32: the reference side of every validation."""

    def __init__(self, model):
        self.model = model.float().eval()

    def decode(self, latent: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.model.decode(torch.from_numpy(latent)).sample.numpy()

    def encode(self, video: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        with torch.no_grad():
            posterior = self.model.encode(torch.from_numpy(video)).latent_dist
            return posterior.mean.numpy(), posterior.logvar.numpy()


def reference_model(family, config, source_weights, dtype):
    """The PyTorch model on the source weights rounded to `dtype`."""
    import torch

    model = family.torch_model()(config)
    state = {
        k: torch.from_numpy(np.asarray(source_weights[k]).astype(dtype).astype(np.float32))
        for k in source_weights.specs
    }
    model.load_state_dict(state, strict=True)
    return model


@dataclasses.dataclass
class Outcome:
    """A validation: its comparisons, and what the picture of it needs (both runners, both decodes)."""

    comparisons: list[Comparison]
    runner: object
    reference: object
    decoded: tuple[np.ndarray, np.ndarray]  # the validation latent decoded by runner, by reference

    def picture(self, path, family, config) -> dict:
        from converter import preview

        return preview.write(path, family, config, self.runner, self.reference, self.decoded)


def compare_runners(family, config, runner, reference) -> Outcome:
    """Decodes and encodes the validation inputs with both (channels-first runners); `reference` is the expected."""
    latent, video = validation_inputs(family, config)
    outputs = {}
    for name, drive in (("got", runner), ("expected", reference)):
        mean, logvar = drive.encode(video)
        outputs[name] = {"decode": drive.decode(latent), "encode.mean": mean, "encode.logvar": logvar}
    comparisons = [compare(name, outputs["got"][name], outputs["expected"][name]) for name in outputs["expected"]]
    return Outcome(comparisons, runner, reference, (outputs["got"]["decode"], outputs["expected"]["decode"]))


def run(family, config, runner, source_weights, dtype) -> Outcome:
    """`runner` (a target's runner around the converted model) against the PyTorch reference on the source weights."""
    reference = TorchRunner(reference_model(family, config, source_weights, dtype))
    return compare_runners(family, config, runner, reference)
