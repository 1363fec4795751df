"""The conversion pipeline: resolve the source, plan every key (before anything is written), stream the tensors
into a temporary sibling of --out, load that back and validate it, and only then move it into place."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from converter import __version__, mapping, sources, targets, validate
from converter.errors import InputError, OutputError, ValidationError
from converter.output import MANIFEST, TOOL, OutputFolder, write_json
from converter.registry import FAMILIES, ModelEntry, family_for_class

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float16": np.dtype(np.float16)}


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
    mapping_file: Path | None = None  # another mapping file than the family's (for mapping development)
    allow_nonfinite: bool = False
    keep_invalid: bool = False
    push_to_hub: str | None = None  # ORG/NAME: write access is checked before any conversion work


def dry_run(req: Request) -> str:
    """What a conversion would fetch, read and write; fetches and writes nothing."""
    from converter import hub

    entry, folder = req.model, OutputFolder(req.out, req.force)
    lines = []
    location = sources.hub_location(entry, req.source, req.revision)
    if location is not None:
        repo_id, revision = location
        files = hub.planned_files(repo_id, entry.subfolder, revision, req.offline)
        lines += [f"source: {repo_id}@{revision}, subfolder {entry.subfolder}/", hub.describe_plan(files)]
    else:
        lines.append(f"source: {Path(req.source).expanduser().absolute()} (local)")
    fmt = req.fmt or targets.FORMATS[req.target][0]
    replacing = req.force and folder.out.exists()
    lines.append(f"output: {folder.out} ({req.target}, {fmt}, dtype {req.dtype}"
                 f"{', replacing the existing output' if replacing else ''})")
    refusal, plan = folder.refusal(), None
    if location is None or all(f["cached"] for f in files):
        source = sources.resolve(entry, req.source, req.revision, offline=True)
        try:
            folder.check_not_source(source.protected)
        except OutputError as e:
            refusal = str(e)
        plan = make_plan(req, source)
    if refusal:
        lines.append(f"  ✗ {refusal}: a conversion would stop here")
    if plan is not None:
        lines.append(f"plan: {len(plan.assignments)} tensors, every key mapped to a {req.target} leaf "
                     f"({targets.WEIGHT_FILES[(req.target, fmt)]})")
    if req.push_to_hub:
        lines.append(f"then publish to https://huggingface.co/{req.push_to_hub}")
    return "\n".join(lines)


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


def check_weights_fit_config(family, config, weights: sources.SourceWeights):
    """The checkpoint against the PyTorch model its config describes (diffusers' names and shapes). A mismatch here
    is bad input (wrong config, wrong family, damaged checkpoint), told apart from mapping bugs found later."""
    expected = {k: tuple(v.shape) for k, v in targets.meta_torch(family, config).state_dict().items()}
    unexpected = [k for k in weights.specs if k not in expected]
    missing = [k for k in expected if k not in weights.specs]
    wrong = [k for k in expected if k in weights.specs and tuple(weights.specs[k][0]) != expected[k]]
    other = _looks_like(family, list(weights.specs)) if unexpected else None
    if other is not None:
        raise InputError(f"this checkpoint looks like a {other.name} VAE ({other.class_name}), not "
                         f"{family.class_name}: try `vae-convert {other.name}`")
    problems = []
    if unexpected:
        problems.append(f"{len(unexpected)} key(s) {family.class_name} does not have: {_first(unexpected)}")
    if missing:
        problems.append(f"{len(missing)} key(s) missing from the checkpoint: {_first(missing)}")
    if wrong:
        k = wrong[0]
        problems.append(f"config.json and the weights disagree on {len(wrong)} shape(s), e.g. {k!r} is "
                        f"{list(weights.specs[k][0])} in the checkpoint, the config implies {list(expected[k])}")
    if problems:
        raise InputError("; ".join(problems))


def _first(keys: list[str], n: int = 3) -> str:
    return ", ".join(repr(k) for k in keys[:n]) + (", ..." if len(keys) > n else "")


def _looks_like(family, keys: list[str]):
    """Another family whose mapping rules claim (nearly) every key, or None."""
    for other in FAMILIES.values():
        if other is family:
            continue
        rules = mapping.load_mapping(other.mapping_path).rules("torchax")
        claimed = sum(any(r.pattern.fullmatch(k) for r in rules) for k in keys)
        if claimed >= 0.9 * len(keys):
            return other
    return None


def check_values(key: str, source: np.ndarray, converted: np.ndarray, allow_nonfinite: bool):
    """Refuses NaN/Inf in the weights, and a dtype that cannot hold them (overflow to inf)."""
    if np.isfinite(converted).all():
        return
    source_finite = np.isfinite(source)
    if not source_finite.all():
        if allow_nonfinite:
            return
        raise InputError(f"tensor {key!r} holds {int((~source_finite).sum())} NaN/Inf value(s); refusing to convert "
                         f"(pass --allow-nonfinite to keep them)")
    peak = float(np.abs(source.astype(np.float32)).max())
    raise InputError(f"tensor {key!r} has values up to {peak:.4g}, beyond what {converted.dtype.name} holds; choose "
                     f"another --dtype")


@dataclasses.dataclass
class Plan:
    weights: sources.SourceWeights
    config: object
    mapping_path: Path
    target_shapes: dict
    assignments: list


def make_plan(req: Request, source: sources.Source) -> Plan:
    """Everything checkable before writing: the config's family, the weights against the config, every key's rule."""
    family = req.model.family
    weights = sources.SourceWeights.open(source.weight_files)
    check_config_family(req.model, source.config)
    config = family.config_from_dict(source.config)
    check_weights_fit_config(family, config, weights)
    mapping_path = req.mapping_file or family.mapping_path
    target_shapes = targets.target_shapes(family, config, req.target)
    source_shapes = {k: shape for k, (shape, _) in weights.specs.items()}
    assignments = mapping.plan(mapping.load_mapping(mapping_path), req.target, source_shapes, target_shapes)
    return Plan(weights, config, mapping_path, target_shapes, assignments)


def convert(req: Request) -> Summary:
    started = time.monotonic()
    family = req.model.family
    fmt = req.fmt or targets.FORMATS[req.target][0]
    if fmt not in targets.FORMATS[req.target]:
        raise InputError(f"--format {fmt} is not available for --to {req.target} "
                         f"(choose from {', '.join(targets.FORMATS[req.target])})")
    folder = OutputFolder(req.out, req.force, say=_say)
    if sources.hub_location(req.model, req.source, req.revision) is None:
        folder.check_not_source([Path(req.source).expanduser()])
    folder.check()
    out = folder.out
    if req.push_to_hub:
        from converter.hub import check_write_access

        check_write_access(req.push_to_hub)

    source = sources.resolve(req.model, req.source, req.revision, req.offline)
    folder.check_not_source(source.protected)
    plan = make_plan(req, source)
    dtype = choose_dtype(req.dtype, plan.weights)

    with folder as work:
        provenance = source.start_hashing()
        manifest = {
            "tool": TOOL, "version": __version__, "family": family.name, "model": req.model.name,
            "target": req.target, "format": fmt, "dtype": dtype.name,
            "mapping": {"file": str(req.mapping_file.absolute()) if req.mapping_file else plan.mapping_path.name,
                        "sha256": hashlib.sha256(plan.mapping_path.read_bytes()).hexdigest()},
        }
        specs = {a.target_key: (plan.target_shapes[a.target_key], dtype) for a in plan.assignments}
        nbytes = _write_weights(work, req, fmt, plan.assignments, plan.weights, specs, manifest)
        manifest["source"] = provenance()
        write_json(work / "config.json", plan.config.to_dict())
        write_json(work / MANIFEST, manifest)
        checks = _validate(req, family, plan.config, plan.weights, dtype, work, manifest, out)
        folder.commit()
    failed = [c for c in checks if not c.ok]
    if failed:  # only reached with --keep-invalid: the output is kept, marked invalid, and the run still fails
        raise ValidationError(f"{_failure(failed)}; kept at {out} because of --keep-invalid")
    parameters = sum(int(np.prod(shape)) for shape, _ in specs.values())
    return Summary(out, req.target, fmt, dtype.name, len(specs), parameters, nbytes, time.monotonic() - started,
                   checks)


def _validate(req, family, config, weights, dtype, work, manifest, out) -> list:
    if not req.validate:
        return []
    _say("validating: decode and encode against the PyTorch reference on the source weights ...")
    from converter.api import load

    checks = validate.run(family, config, req.target, load(work), weights, dtype)
    manifest["validation"] = {"rtol": validate.RTOL, "ok": all(c.ok for c in checks),
                              "checks": [c.as_dict() for c in checks]}
    write_json(work / MANIFEST, manifest)
    _say("\n".join(c.line() for c in checks))
    failed = [c for c in checks if not c.ok]
    if failed and not req.keep_invalid:
        raise ValidationError(f"{_failure(failed)}; nothing written to {out} (--keep-invalid keeps it)")
    return checks


def _failure(failed) -> str:
    worst = max(failed, key=lambda c: c.max_abs / c.tol)
    return (f"validation failed for {', '.join(c.name for c in failed)} ({worst.name}: max |Δ| {worst.max_abs:.2e} "
            f"> tol {worst.tol:.1e})")


def _write_weights(work, req, fmt, assignments, weights, specs, manifest) -> int:
    import click

    metadata = {"vae_convert": json.dumps(manifest)}  # what is known before writing; the full manifest is a file
    try:
        writer = targets.open_writer(req.target, fmt, work, specs, metadata)
        nbytes = 0
        with click.progressbar(assignments, label="converting", file=None, show_pos=True) as bar:
            for a in bar:
                source = weights[a.source_key]
                array = mapping.apply_ops(a.rule.ops, source).astype(specs[a.target_key][1], copy=False)
                check_values(a.source_key, source, array, req.allow_nonfinite)
                writer.write(a.target_key, array)
                nbytes += array.nbytes
                del source, array
                weights.release(a.source_key)
        writer.close()
    except OSError as e:
        raise OutputError(f"cannot write to {work.parent}: {e.strerror or e}") from None
    return nbytes
