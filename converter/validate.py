"""Validation: the written output, loaded back through the load API, must reproduce the reference.

The reference is the project's PyTorch implementation run in plain PyTorch on the *source* weights. Both sides
compute in float32 on weights rounded to the output dtype, so the check isolates the conversion (names, layouts,
the target implementation) from rounding, and the tolerance stays tight for bfloat16 outputs too. Each value is held
to a tolerance of its own (`compare`), so that one huge or infinite value cannot hide a wrong channel beside it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from converter.errors import InputError
from converter.runners import TorchRunner, exact_runner

RTOL = 1e-4  # each value's tolerance: RTOL * max(1, |its reference|, the median |reference| of its channel)


@dataclasses.dataclass
class Comparison:
    name: str
    shape: tuple
    expected_shape: tuple
    max_abs: float  # the largest difference
    mean_abs: float
    tol: float  # the tolerance where the difference is largest against it
    ratio: float  # that difference over that tolerance: at most 1 where it passes
    reference_finite: bool = True  # False: the reference holds NaN or Inf, so nothing can be compared

    @property
    def ok(self) -> bool:
        return self.shape == self.expected_shape and self.reference_finite and self.ratio <= 1.0

    def line(self) -> str:
        mark = "✓" if self.ok else "✗"
        shape = "x".join(map(str, self.shape))
        if self.shape != self.expected_shape:
            return f"  {mark} {self.name:<14} shape {shape}, expected {'x'.join(map(str, self.expected_shape))}"
        if not self.reference_finite:
            return f"  {mark} {self.name:<14} {shape:<18} the reference itself is not finite: nothing to compare"
        return (
            f"  {mark} {self.name:<14} {shape:<18} max |Δ| {self.max_abs:.2e}  mean |Δ| {self.mean_abs:.2e}"
            f"  tol {self.tol:.1e}"
        )

    @classmethod
    def from_dict(cls, record: dict) -> Comparison:
        """A comparison as `as_dict` recorded it (a value that was not finite is recorded as null)."""
        shape = tuple(record["shape"])
        number = {k: math.inf if record.get(k) is None else record[k] for k in ("max_abs", "mean_abs", "tol")}
        ratio = record.get("ratio", number["max_abs"] / number["tol"] if number["tol"] else math.inf)
        return cls(
            record["output"], shape, shape, **number, ratio=math.inf if ratio is None else ratio,
            reference_finite=record.get("reference_finite", True),
        )  # fmt: skip

    def as_dict(self) -> dict:
        def number(x: float):  # standard JSON has no Infinity or NaN
            return x if math.isfinite(x) else None

        return {
            "output": self.name,
            "shape": list(self.shape),
            "max_abs": number(self.max_abs),
            "mean_abs": number(self.mean_abs),
            "tol": number(self.tol),
            "ratio": number(self.ratio),
            "reference_finite": self.reference_finite,
            "ok": self.ok,
        }


@dataclasses.dataclass
class FiniteCheck:
    """The converted model run as it will run, in its own dtype (float16 or bfloat16): its outputs must be finite;
    a model whose activations overflow the dtype decodes to NaN."""

    name: str
    shape: tuple
    dtype: str
    nonfinite: int  # values that are NaN or Inf

    @property
    def ok(self) -> bool:
        return self.nonfinite == 0

    def line(self) -> str:
        shape = "x".join(map(str, self.shape))
        if self.ok:
            return f"  ✓ {self.name:<14} {shape:<18} finite, run in {self.dtype}"
        size = int(np.prod(self.shape))
        return f"  ✗ {self.name:<14} {shape:<18} {self.nonfinite} of {size} values NaN or Inf, run in {self.dtype}"

    def as_dict(self) -> dict:
        return {
            "output": self.name, "shape": list(self.shape), "kind": "finite", "dtype": self.dtype,
            "nonfinite": self.nonfinite, "max_abs": None, "mean_abs": None, "tol": None, "ok": self.ok,
        }  # fmt: skip


def check_from_dict(record: dict):
    """A validation check as the manifest records it."""
    if record.get("kind") == "finite":
        return FiniteCheck(
            record["output"], tuple(record["shape"]), record.get("dtype", "?"), record.get("nonfinite", 1)
        )
    return Comparison.from_dict(record)


def finite_in_own_dtype(family, config, runner, dtype: str) -> list[FiniteCheck]:
    """`runner` (the converted model as loaded, fed inputs in its own dtype) on the validation inputs: a check that
    each output is finite."""
    latent, video = validation_inputs(family, config)
    outputs = {"decode": runner.decode(latent, **decode_inputs(family, config))}
    if "encoder" in family.parts:
        outputs.update(zip((f"encode.{n}" for n in family.encode_outputs), runner.encode(video)))
    checks = []
    for name, out in outputs.items():
        values = np.asarray(out).astype(np.float32)
        checks.append(FiniteCheck(f"{name} ({dtype})", values.shape, dtype, int((~np.isfinite(values)).sum())))
    return checks


def compare(name: str, got: np.ndarray, expected: np.ndarray) -> Comparison:
    """`got` against `expected`, value by value: each within RTOL of the larger of 1, its reference's magnitude and
    its channel's median magnitude (axis 1), so that no single value, however large, loosens another's tolerance. A
    reference that is not finite compares nothing: the comparison fails, saying so."""
    if got.shape != expected.shape:
        return Comparison(name, got.shape, expected.shape, math.inf, math.inf, RTOL, math.inf)
    expected64, got64 = expected.astype(np.float64), got.astype(np.float64)
    if not np.isfinite(expected64).all():
        return Comparison(name, got.shape, expected.shape, math.inf, math.inf, RTOL, math.inf, False)
    magnitude = np.abs(expected64)
    channel_axes = tuple(a for a in range(expected.ndim) if a != 1)
    median = np.median(magnitude, axis=channel_axes, keepdims=True) if expected.ndim > 1 else np.median(magnitude)
    tol = RTOL * np.maximum(np.maximum(magnitude, median), 1.0)
    with np.errstate(invalid="ignore"):  # an Inf or NaN converted value: its difference is not finite, and fails
        diff = np.abs(got64 - expected64)
    ratio = np.where(np.isfinite(diff), diff / tol, np.inf)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    finite = diff[np.isfinite(diff)]
    return Comparison(
        name, got.shape, expected.shape,
        float(diff.max()) if finite.size == diff.size else math.inf,
        float(diff.mean()) if finite.size == diff.size else math.inf,
        float(tol[worst]), float(ratio[worst]),
    )  # fmt: skip


MAX_VALIDATION_VALUES = 2**26  # a validation input's values: 256 MB in float32, 16 times a released model's largest


def ensure_inputs_fit(family, config):
    """Refuses, before anything is written, a config whose validation inputs would be larger than any released
    model's by far (their sizes follow its compression, which a config's fields multiply)."""
    for what, shape in validation_shapes(family, config).items():
        if math.prod(shape) > MAX_VALIDATION_VALUES:
            raise InputError(
                f"validating this config would need a {what} of shape {list(shape)}: its compression is beyond any "
                "released model's (--no-validate converts without validating)"
            )


def validation_shapes(family, config) -> dict[str, tuple]:
    """The shapes of the validation's inputs: the latent it decodes, and the sample it encodes where the model has an
    encoder."""
    shapes = {"latent": tuple(family.validation_latent_shape(config))}
    if "encoder" in family.parts:
        shapes["sample"] = tuple(family.validation_sample_shape(config))
    return shapes


def validation_inputs(family, config) -> tuple[np.ndarray, np.ndarray | None]:
    """A deterministic latent and video (channels-first) of the family's validation shapes (no video for a model
    without an encoder). The video encodes to a latent the decode steps are already compiled for, so decoding it
    again for the picture compiles nothing."""
    shapes = validation_shapes(family, config)
    latent = np.random.default_rng(0).standard_normal(shapes["latent"]).astype(np.float32)
    return latent, validation_clip(shapes["sample"]) if "sample" in shapes else None


def validation_clip(shape: tuple) -> np.ndarray:
    """A (B, C, T, H, W) clip in [-1, 1] where reconstruction errors show: a diagonal colour gradient, a disc moving
    right, a square moving down, and a patch of one-pixel stripes whose phase shifts each frame; for a (B, C, H, W)
    shape, the clip's first frame as an image; for a (B, C, samples) shape, a waveform (`validation_waveform`)."""
    if len(shape) == 3:
        return validation_waveform(shape)
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


def validation_waveform(shape: tuple) -> np.ndarray:
    """A (B, C, samples) waveform in [-0.8, 0.8] where reconstruction errors show: a sweep from low to high
    frequencies (0.002 to 0.2 cycles a sample), a click a third of the way in, each channel a quarter-cycle after
    the one before."""
    batch, channels, samples = shape
    t = np.arange(samples) / max(samples - 1, 1)
    low, high = 0.002, 0.2  # cycles a sample
    cycles = samples * (low * t + (high - low) * t**2 / 2)  # the sweep's phase, in cycles
    sweep = 0.6 * np.sin(2 * np.pi * (cycles[None, :] + np.arange(channels)[:, None] / 4))
    click = 0.2 * np.exp(-np.abs(np.arange(samples) - samples // 3) / 4.0)
    return np.broadcast_to(sweep + click, (batch, channels, samples)).astype(np.float32)


def reference_model(family, config, source_weights, dtype):
    """The PyTorch model on the source weights rounded to `dtype` (counts, and the modules kept in float32, as they
    are). Built on the meta device and given the weights themselves, mapped where the source is, not copies: a
    reference of 10 GB then holds none of its own (MiniMax-H3's validates in 24 GB beside the converted model)."""
    from converter.targets import is_count, kept_in_float32, meta_torch, to_torch

    model = meta_torch(family, config)
    dtypes = {key: tensor.dtype for key, tensor in model.state_dict().items()}

    def tensor(key):
        array = np.asarray(source_weights[key])
        if not (is_count(array.dtype) or kept_in_float32(family, key)):
            array = array.astype(dtype, copy=False)
        return to_torch(array).to(dtypes[key])  # a copy only where the dtype changes

    model.load_state_dict({key: tensor(key) for key in source_weights.specs}, strict=True, assign=True)
    return model


@dataclasses.dataclass
class Outcome:
    """A validation: its comparisons, and what the picture of it needs. Each pair is (converted, reference)."""

    comparisons: list[Comparison]
    runners: tuple
    video: np.ndarray | None  # None for a model without an encoder
    means: tuple[np.ndarray, np.ndarray] | None  # the video's encoding by each (the first of what encode gives)
    decoded: tuple[np.ndarray, np.ndarray]  # the validation latent decoded by each
    decode_inputs: dict  # the extra inputs both decoded with
    sample_rate: int | None = None  # a waveform's, for the decode's sound
    measured_again: tuple[str, ...] = ()  # the parts a PyTorch side computed again nearer exactly (compare_runners)

    def picture(self, path) -> dict:
        from converter import preview

        reconstructions = (
            tuple(drive.decode(mean, **self.decode_inputs) for drive, mean in zip(self.runners, self.means))
            if self.means is not None
            else None
        )
        return preview.write(path, self.video, reconstructions, self.decoded)

    def sound(self, path) -> bool:
        """Writes the converted model's decode as a WAV file where it is a waveform; says whether it did."""
        from converter import preview

        if self.sample_rate is None:
            return False
        preview.write_wav(path, self.decoded[0][0], self.sample_rate)
        return True


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
    encodings = [f"encode.{name}" for name in family.encode_outputs] if video is not None else []

    def outputs_of(drive, parts=("decode", "encode")) -> dict:
        result = {"decode": drive.decode(latent, **inputs)} if "decode" in parts else {}
        return {**result, **dict(zip(encodings, drive.encode(video)))} if encodings and "encode" in parts else result

    outputs = {"got": outputs_of(runner), "expected": outputs_of(reference)}
    comparisons = {name: compare(name, outputs["got"][name], outputs["expected"][name]) for name in outputs["expected"]}
    # a difference beyond the tolerance that may be a PyTorch side's rounding (TorchRunner.exact) is measured again,
    # that side computing its part nearer exactly: it fails only then (an output's shape or a value that is not
    # finite fails whatever the rounding)
    again = sorted({name.split(".")[0] for name, c in comparisons.items() if math.isfinite(c.ratio) and not c.ok})
    exact = {side: exact_runner(drive) for side, drive in (("got", runner), ("expected", reference))}
    if again and any(exact.values()):
        for side, drive in exact.items():
            if drive is not None:
                outputs[side].update(outputs_of(drive, again))
        comparisons = {name: compare(name, outputs["got"][name], outputs["expected"][name]) for name in comparisons}
    else:
        again = []
    pairs = {name: (outputs["got"][name], outputs["expected"][name]) for name in (*encodings[:1], "decode")}
    means = pairs[encodings[0]] if encodings else None
    rate = family.sample_rate(config) if family.sample_rate else None
    checks = list(comparisons.values())
    return Outcome(checks, (runner, reference), video, means, pairs["decode"], inputs, rate, tuple(again))


def run(family, config, runner, source_weights, dtype) -> Outcome:
    """`runner` (a target's runner around the converted model) against the PyTorch reference on the source weights."""
    reference = TorchRunner(reference_model(family, config, source_weights, dtype))
    return compare_runners(family, config, runner, reference)
