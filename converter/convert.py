"""The conversion pipeline: resolve the source, plan every key (before anything is written), stream the tensors
into a temporary sibling of --out, load that back and validate it, and only then move it into place."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from converter import __version__, mapping, sources, targets, validate
from converter.errors import InputError, OutputError, ValidationError
from converter.registry import FAMILIES, ModelEntry, family_for_class

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float16": np.dtype(np.float16)}
MANIFEST = "vae_convert.json"


@dataclasses.dataclass
class Request:
    model: ModelEntry
    source: str | None
    revision: str | None
    offline: bool
    target: str
    fmt: str | None
    dtype: str
    out: Path
    force: bool
    validate: bool


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
    checks: list


def _say(message: str):
    import click

    click.echo(message, err=True)


def check_config_family(entry: ModelEntry, raw: dict):
    class_name = raw.get("_class_name")
    if class_name and class_name != entry.family.class_name:
        looks = family_for_class(class_name)
        hint = f" (a {looks.name} checkpoint: try `vae-convert {looks.name}`)" if looks else ""
        raise InputError(f"config.json is for {class_name}, not {entry.family.class_name}{hint}")


def choose_dtype(requested: str, weights: sources.SourceWeights) -> np.dtype:
    if requested != "auto":
        return DTYPES[requested]
    found = weights.floating_dtypes()
    if len(found) != 1:
        names = ", ".join(sorted(d.name for d in found))
        raise InputError(f"--dtype auto: the source mixes floating dtypes ({names}); pick one with --dtype")
    dtype = found.pop()
    if dtype not in DTYPES.values():
        raise InputError(f"--dtype auto: source dtype {dtype.name} is not a supported output dtype; pick one")
    _say(f"dtype: auto -> {dtype.name} (the source's dtype)")
    return dtype


def convert(req: Request) -> Summary:
    started = time.monotonic()
    family = req.model.family
    fmt = req.fmt or targets.FORMATS[req.target][0]
    if fmt not in targets.FORMATS[req.target]:
        raise InputError(f"--format {fmt} is not available for --to {req.target} "
                         f"(choose from {', '.join(targets.FORMATS[req.target])})")
    out = req.out.resolve()
    if out.exists() and not req.force:
        raise OutputError(f"{out} exists; pass --force to replace it (the old output stays until the new one is done)")

    source = sources.resolve(req.model, req.source, req.revision, req.offline)
    weights = sources.SourceWeights.open(source.weight_files)
    check_config_family(req.model, source.config)
    config = family.config_from_dict(source.config)
    dtype = choose_dtype(req.dtype, weights)
    rules = mapping.load_mapping(family.mapping_path)
    target_shapes = targets.target_shapes(family, config, req.target)
    source_shapes = {k: shape for k, (shape, _) in weights.specs.items()}
    assignments = mapping.plan(rules, req.target, source_shapes, target_shapes)

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(work, 0o777 & ~umask)  # mkdtemp makes it private; the output should get normal permissions
    try:
        manifest = {
            "tool": "vae-convert", "version": __version__, "family": family.name, "model": req.model.name,
            "target": req.target, "format": fmt, "dtype": dtype.name, "source": source.provenance(),
            "mapping": {"file": family.mapping_file, "sha256": hashlib.sha256(family.mapping_path.read_bytes())
                        .hexdigest()},
        }
        specs = {a.target_key: (target_shapes[a.target_key], dtype) for a in assignments}
        nbytes = _write_weights(work, req.target, fmt, assignments, weights, specs, manifest)
        _write_json(work / "config.json", config.to_dict())
        _write_json(work / MANIFEST, manifest)
        checks = []
        if req.validate:
            _say("validating: decode and encode against the PyTorch reference on the source weights ...")
            from converter.api import load

            checks = validate.run(family, config, req.target, load(work), weights, dtype)
            manifest["validation"] = {"rtol": validate.RTOL, "checks": [c.as_dict() for c in checks]}
            _write_json(work / MANIFEST, manifest)
            _say("\n".join(c.line() for c in checks))
            failed = [c for c in checks if not c.ok]
            if failed:
                worst = max(failed, key=lambda c: c.max_abs / c.tol)
                raise ValidationError(f"validation failed for {', '.join(c.name for c in failed)} "
                                      f"({worst.name}: max |Δ| {worst.max_abs:.2e} > tol {worst.tol:.1e}); "
                                      f"nothing written to {out}")
        _move_into_place(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    parameters = sum(int(np.prod(shape)) for shape, _ in specs.values())
    return Summary(out, req.target, fmt, dtype.name, len(specs), parameters, nbytes, time.monotonic() - started,
                   checks)


def _write_weights(work, target, fmt, assignments, weights, specs, manifest) -> int:
    import click

    metadata = {"vae_convert": json.dumps(manifest)}
    try:
        writer = targets.open_writer(target, fmt, work, specs, metadata)
        nbytes = 0
        with click.progressbar(assignments, label="converting", file=None, show_pos=True) as bar:
            for a in bar:
                array = mapping.apply_ops(a.rule.ops, weights[a.source_key]).astype(specs[a.target_key][1])
                writer.write(a.target_key, array)
                nbytes += array.nbytes
        writer.close()
    except OSError as e:
        raise OutputError(f"cannot write to {work.parent}: {e.strerror or e}") from None
    return nbytes


def _write_json(path: Path, content: dict):
    path.write_text(json.dumps(content, indent=2) + "\n")


def _move_into_place(work: Path, out: Path):
    """Renames the finished output into place; an old output is only removed once the new one is there."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rename(out, old / "previous")
    os.rename(work, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        raise InputError(f"{path}: not a vae-convert output ({MANIFEST} is missing or unreadable)") from None
    if manifest.get("family") not in FAMILIES:
        raise InputError(f"{path}: unknown family {manifest.get('family')!r} in {MANIFEST}")
    return manifest
