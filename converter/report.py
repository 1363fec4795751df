"""What a job (a conversion, an export) reports: its progress hooks, its summary, and its validation, written into
the output's manifest and said to the user. Nothing here prints: `say` and `progress` come from the caller."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from converter import preview, validate
from converter.errors import ValidationError
from converter.output import MANIFEST, write_json


def silent(message: str):
    pass


def no_progress(items: Iterable, label: str) -> Iterable:
    return items


@dataclasses.dataclass
class Summary:
    out: Path
    target: str
    fmt: str
    dtype: str
    tensors: int
    parameters: int
    bytes: int
    seconds: float
    comparisons: list


def record_validation(outcome, manifest: dict, work: Path, out: Path, req) -> list:
    """Writes the comparisons (and, unless --no-preview, validation.png) into the work folder and reports them; fails
    unless all passed or the user keeps invalid outputs (`req`'s say, keep_invalid, preview)."""
    comparisons = outcome.comparisons
    manifest["validation"] = {
        "rtol": validate.RTOL,
        "ok": all(c.ok for c in comparisons),
        "checks": [c.as_dict() for c in comparisons],
    }
    if outcome.decode_inputs:
        manifest["validation"]["decode_inputs"] = {k: v.tolist() for k, v in outcome.decode_inputs.items()}
    if outcome.measured_again:
        manifest["validation"]["measured_again"] = list(outcome.measured_again)
    if req.preview:
        maxima = outcome.picture(work / preview.FILE_NAME)
        manifest["validation"]["preview"] = {"file": preview.FILE_NAME, "max_abs": maxima}
        if outcome.sound(work / preview.SOUND_FILE_NAME):
            manifest["validation"]["preview"]["sound"] = preview.SOUND_FILE_NAME
    write_json(work / MANIFEST, manifest)
    if outcome.decode_inputs:
        shown = ", ".join(f"{k}={v.tolist()}" for k, v in outcome.decode_inputs.items())
        req.say(f"  decoded with {shown}")
    if outcome.measured_again:
        req.say(
            f"  {' and '.join(outcome.measured_again)}: beyond the tolerance at first, measured again with PyTorch's "
            "own convolutions (oneDNN's round a deep model's float32 output further)"
        )
    req.say("\n".join(c.line() for c in comparisons))
    if req.preview:
        shows = "a test clip encoded and decoded, " if outcome.video is not None else ""
        req.say(f"  picture: {preview.FILE_NAME} ({shows}the validation latent decoded, by both)")
        if "sound" in manifest["validation"]["preview"]:
            req.say(f"  sound: {preview.SOUND_FILE_NAME} (the converted model's decode)")
    failed = [c for c in comparisons if not c.ok]
    if failed and not req.keep_invalid:
        raise ValidationError(f"{failure_message(failed)}; nothing written to {out} (--keep-invalid keeps it)")
    return comparisons


def failure_message(failed) -> str:
    overflowed = [c for c in failed if isinstance(c, validate.FiniteCheck)]
    if overflowed:
        return (
            f"validation failed: {', '.join(c.name for c in overflowed)} is NaN or Inf when the model runs in "
            f"{overflowed[0].dtype}: its activations overflow that dtype; convert with --dtype float32 (or "
            "bfloat16), or set force_upcast in its config.json so that it loads and runs in float32"
        )
    unfit = [c for c in failed if not c.reference_finite]
    if unfit:
        return (
            f"validation failed: the reference's {', '.join(c.name for c in unfit)} is not finite (NaN or Inf), so "
            "nothing can be compared; this checkpoint cannot be validated"
        )
    worst = max(failed, key=lambda c: c.ratio)
    return (
        f"validation failed for {', '.join(c.name for c in failed)} ({worst.name}: |Δ| {worst.ratio * worst.tol:.2e} "
        f"> tol {worst.tol:.1e}; max |Δ| {worst.max_abs:.2e})"
    )
