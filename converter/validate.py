"""Validation: the written output, loaded back through the load API, must reproduce the reference.

The reference is the project's PyTorch implementation run in plain PyTorch on the *source* weights. Both sides
compute in float32 on weights rounded to the output dtype, so the check isolates the conversion (names, layouts,
the target implementation) from rounding, and the tolerance stays tight for bfloat16 outputs too.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from converter.runners import TorchRunner

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
    """A deterministic latent and video (channels-first) of the family's validation shapes. The video encodes to a
    latent the decode steps are already compiled for, so decoding it again for the picture compiles nothing."""
    latent = np.random.default_rng(0).standard_normal(family.validation_latent_shape(config)).astype(np.float32)
    return latent, validation_clip(family.validation_video_shape(config))


def validation_clip(shape: tuple) -> np.ndarray:
    """A (B, C, T, H, W) clip in [-1, 1] where reconstruction errors show: a diagonal colour gradient, a disc moving
    right, a square moving down, and a patch of one-pixel stripes whose phase shifts each frame; for a (B, C, H, W)
    shape, the clip's first frame as an image."""
    if len(shape) == 4:
        return validation_clip((shape[0], shape[1], 1, *shape[2:]))[:, :, 0]
    batch, channels, frames, height, width = shape
    y, x = np.mgrid[0:height, 0:width] / np.array([max(height - 1, 1), max(width - 1, 1)])[:, None, None]
    columns = np.arange(width)[None, :].repeat(height, 0)
    clip = np.empty((frames, 3, height, width))
    for t in range(frames):
        phase = t / max(frames - 1, 1)
        frame = np.stack([x, y, 1.0 - (x + y) / 2])
        disc = (x - 0.15 - 0.6 * phase) ** 2 + (y - 0.35) ** 2 < 0.02
        frame[:, disc] = np.array([1.0, 0.1, 0.1])[:, None]
        square = (np.abs(x - 0.75) < 0.1) & (np.abs(y - 0.1 - 0.5 * phase) < 0.1)
        frame[:, square] = np.array([0.1, 0.2, 1.0])[:, None]
        stripes = (x < 0.4) & (y > 0.65)
        frame[:, stripes] = ((columns[stripes] + t) % 2).astype(np.float64)[None, :]
        clip[t] = frame
    clip = clip[:, np.arange(channels) % 3].transpose(1, 0, 2, 3)  # (C, T, H, W); other channel counts repeat RGB
    return np.broadcast_to(clip * 2.0 - 1.0, (batch, channels, frames, height, width)).astype(np.float32)


def reference_model(family, config, source_weights, dtype):
    """The PyTorch model on the source weights rounded to `dtype` (counts as they are)."""
    import torch

    def rounded(array):
        return array if array.dtype.kind in "iu" else array.astype(dtype).astype(np.float32)

    model = family.torch_model()(config)
    state = {k: torch.from_numpy(rounded(np.asarray(source_weights[k]))) for k in source_weights.specs}
    model.load_state_dict(state, strict=True)
    return model


@dataclasses.dataclass
class Outcome:
    """A validation: its comparisons, and what the picture of it needs. Each pair is (converted, reference)."""

    comparisons: list[Comparison]
    runners: tuple
    video: np.ndarray
    means: tuple[np.ndarray, np.ndarray]  # the video's encoding by each
    decoded: tuple[np.ndarray, np.ndarray]  # the validation latent decoded by each
    decode_inputs: dict  # the extra inputs both decoded with

    def picture(self, path) -> dict:
        from converter import preview

        reconstructions = tuple(
            drive.decode(mean, **self.decode_inputs) for drive, mean in zip(self.runners, self.means)
        )
        return preview.write(path, self.video, reconstructions, self.decoded)


def decode_inputs(family, config) -> dict[str, np.ndarray]:
    """The extra inputs the family's validation decodes with (none for most families)."""
    if family.validation_decode_inputs is None:
        return {}
    return {name: np.asarray(value) for name, value in family.validation_decode_inputs(config).items()}


def compare_runners(family, config, runner, reference) -> Outcome:
    """Decodes (with the family's extra decode inputs) and encodes the validation inputs with both (channels-first
    runners); `reference` is the expected."""
    latent, video = validation_inputs(family, config)
    inputs = decode_inputs(family, config)
    outputs = {}
    for name, drive in (("got", runner), ("expected", reference)):
        mean, logvar = drive.encode(video)
        outputs[name] = {"decode": drive.decode(latent, **inputs), "encode.mean": mean, "encode.logvar": logvar}
    comparisons = [compare(name, outputs["got"][name], outputs["expected"][name]) for name in outputs["expected"]]
    pairs = {name: (outputs["got"][name], outputs["expected"][name]) for name in ("encode.mean", "decode")}
    return Outcome(comparisons, (runner, reference), video, pairs["encode.mean"], pairs["decode"], inputs)


def run(family, config, runner, source_weights, dtype) -> Outcome:
    """`runner` (a target's runner around the converted model) against the PyTorch reference on the source weights."""
    reference = TorchRunner(reference_model(family, config, source_weights, dtype))
    return compare_runners(family, config, runner, reference)
