"""The conversion pipeline: resolve the source, plan every key (before anything is written), stream the tensors
into the output's work folder, load that back and validate it, and only then commit the output folder.

Nothing here prints: what a user should see reaches the caller through `say` (one line at a time) and `progress`
(an iterable wrapper for the tensor loop), which the CLI supplies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from converter import enable_compile_cache, mapping, source_formats, sources, validate
from converter.errors import ConvertError, InputError, MappingError, OutputError, ValidationError
from converter.models.common.config import ConfigError, shown
from converter.output import (
    MANIFEST,
    OutputFolder,
    cannot_write,
    load_output,
    new_manifest,
    specs_bytes,
    upcast,
    write_json,
)
from converter.registry import ModelEntry, command_for_config, config_from_dict, family_for_class, model_for
from converter.report import Summary, failure_message, no_progress, record_validation, silent
from converter.targets import DTYPES, Target, diffusers_shapes, diffusers_specs, is_count


@dataclasses.dataclass(kw_only=True)
class Request:
    model: ModelEntry
    target: Target
    out: Path
    source: str | None = None  # a local path or a Hub repo id[@revision]; None: the model's own repo
    revision: str | None = None
    offline: bool = False
    fmt: str | None = None
    dtype: str = "auto"
    force: bool = False
    validate: bool = True
    mapping_file: Path | None = None  # another mapping file than the family's (for mapping development)
    source_format: str | None = None  # None: recognised from the keys
    config_file: Path | None = None  # a config.json to use instead of the source's or the model's
    allow_nonfinite: bool = False
    keep_invalid: bool = False
    preview: bool = True  # validation.png beside the weights
    say: Callable[[str], None] = silent
    progress: Callable[[Iterable, str], Iterable] = no_progress

    def __post_init__(self):
        self.fmt = self.target.default_format(self.fmt)
        if self.revision and self.source and sources.hub_location(self.model, self.source, None) is None:
            raise InputError(f"--revision applies to Hub sources; {self.source} is a local path")
        if self.mapping_file is not None:
            self.mapping_file = Path(self.mapping_file).expanduser().absolute()
        if self.config_file is not None:
            self.config_file = Path(self.config_file).expanduser().absolute()


@dataclasses.dataclass
class Plan:
    weights: sources.SourceWeights
    config: object
    mapping_path: Path
    leaf_shapes: dict
    assignments: list
    ignored_config_keys: list[str]  # retired keys config.json carries (the pinned diffusers ignores them too)
    source_format: object  # mapping.SourceFormat
    dropped: dict  # drop rule name -> {"tensors", "bytes"}
    config_origin: str  # where the config came from, in words
    inferred: list[str]  # config fields the tensors gave in place of the named model's
    filled: dict = dataclasses.field(default_factory=dict)  # diffusers key the file lacks -> the count it was given

    def inferred_line(self) -> str | None:
        if not self.inferred:
            return None
        return f"config: {', '.join(self.inferred)} inferred from the tensors (the file brings no config)"

    def ignored_line(self) -> str | None:
        if not self.ignored_config_keys:
            return None
        return f"config.json: ignoring {', '.join(self.ignored_config_keys)} (the pinned diffusers no longer takes it)"

    def format_line(self) -> str | None:
        """What an original-format file went through (nothing to say for diffusers' layout)."""
        fmt = self.source_format
        if not fmt.renames:
            return None
        dropped = "".join(
            f"; dropped {d['tensors']} tensor(s) by rule {name} ({d['bytes'] / 1e6:.1f} MB)"
            for name, d in self.dropped.items()
        )
        filled = "".join(
            f"; {key} filled with {value}, as diffusers' loader gives it" for key, value in self.filled.items()
        )
        renamed = f"keys renamed to diffusers', config from {self.config_origin}"
        return f"source format: {fmt.name} ({fmt.about}): {renamed}{dropped}{filled}"


def dry_run(req: Request) -> str:
    """What a conversion would fetch, read and write; fetches and writes nothing."""
    entry, folder = req.model, OutputFolder(req.out, req.force)
    lines = []
    location = sources.hub_location(entry, req.source, req.revision)
    if location is not None:
        repo_id, revision = location
        files = sources.planned_files(repo_id, entry.subfolder, revision, req.offline)
        lines += [
            f"source: {repo_id}@{revision}, {sources.repo_folder(entry.subfolder)}",
            sources.describe_files(files),
        ]
    else:
        lines.append(f"source: {Path(req.source).expanduser().absolute()} (local)")
    replacing = req.force and folder.out.exists()
    lines.append(
        f"output: {folder.out} ({req.target.name}, {req.fmt}, dtype {req.dtype}"
        f"{', replacing the existing output' if replacing else ''})"
    )
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
        lines += [line for line in (plan.format_line(), plan.inferred_line(), plan.ignored_line()) if line]
        lines.append(
            f"plan: {len(plan.assignments)} tensors, every key mapped to a {req.target.name} leaf "
            f"({req.target.weight_files[req.fmt]})"
        )
    return "\n".join(lines)


def refuse_other_family(entry: ModelEntry, raw: dict):
    class_name = raw.get("_class_name")
    if class_name and class_name != entry.family.class_name:
        looks = family_for_class(class_name)
        hint = f" (a {looks.name} checkpoint: try `{command_for_config(looks, raw)}`)" if looks else ""
        raise InputError(f"config.json is for {class_name}, not {entry.family.class_name}{hint}")


def refuse_other_variant(entry: ModelEntry, config):
    """A checkpoint of one variant of the family (Wan 2.2's VAE) named as another (wan2.1) is a mistake: the model
    name says which VAE the user holds."""
    named = config_from_dict(entry.family, entry.config).variant
    if config.variant != named:
        fits = model_for(entry.family, config)
        raise InputError(
            f"the checkpoint is a {config.variant}, but {entry.name} names a {named}: try `{fits.command}`"
        )


def choose_dtype(requested: str, weights: sources.SourceWeights, say: Callable[[str], None]) -> np.dtype:
    if requested != "auto":
        return DTYPES[requested]
    found = weights.floating_dtypes()
    if not found:
        raise InputError("the source holds no floating-point tensor: no weights to convert")
    if len(found) != 1:
        names = ", ".join(sorted(d.name for d in found))
        raise InputError(f"--dtype auto: the source mixes floating dtypes ({names}); pick one with --dtype")
    dtype = found.pop()
    if dtype.name not in DTYPES:
        raise InputError(f"--dtype auto: source dtype {dtype.name} is not a supported output dtype; pick one")
    say(f"dtype: auto -> {dtype.name} (the source's dtype)")
    return dtype


def ensure_storable(key: str, source: np.ndarray, converted: np.ndarray, allow_nonfinite: bool):
    """Refuses NaN/Inf in the weights, a dtype that cannot hold them (overflow to inf), and a count that is no whole
    number or beyond its leaf's integer dtype."""
    if is_count(converted.dtype):
        if (np.asarray(source) < 0).any():
            raise InputError(f"tensor {key!r} is a count, but holds a negative value")
        values = np.asarray(source).astype(np.float64)
        if not np.array_equal(values, np.round(values)):
            raise InputError(f"tensor {key!r} is a count, but holds values that are not whole numbers")
        if not np.array_equal(converted, source):
            raise InputError(
                f"tensor {key!r} is a count, but holds values beyond what {converted.dtype.name} holds "
                f"(up to {np.iinfo(converted.dtype).max})"
            )
        return
    if np.isfinite(converted).all():
        return
    source_finite = np.isfinite(source)
    if not source_finite.all():
        if allow_nonfinite:
            return
        raise InputError(
            f"tensor {key!r} holds {int((~source_finite).sum())} NaN/Inf value(s); refusing to convert "
            f"(pass --allow-nonfinite to keep them)"
        )
    peak = float(np.abs(source.astype(np.float32)).max())
    raise InputError(
        f"tensor {key!r} has values up to {peak:.4g}, beyond what {converted.dtype.name} holds; choose another --dtype"
    )


def load_family_mapping(req: Request) -> tuple[Path, mapping.Mapping]:
    """The family's mapping file, or --mapping's, which must be written for the same family."""
    family = req.model.family
    path = req.mapping_file or mapping.MAPPINGS_DIR / family.mapping_file
    rules = mapping.load_mapping(path)
    source_formats.ensure_models_known(rules)
    if family.name not in rules.families:
        raise MappingError(
            f"{path} is the mapping of the {' and '.join(rules.families)} family, not of {family.name} "
            f"({req.model.name})"
        )
    return path, rules


@dataclasses.dataclass(frozen=True)
class ConfigChoice:
    """Where a conversion's config comes from, decided once."""

    raw: dict  # the config.json fields
    origin: str  # where they came from, in words
    from_name: bool  # the model name's, for want of the file's own: its tensors may show another architecture


def choose_config(req: Request, source: sources.Source, fmt, carried: dict | None, given: dict | None) -> ConfigChoice:
    """--config's keys (`given`) over the model's; else the config an original file carries (`carried`, translated
    by the family); else the source's config.json; else (a lone file, or an original release, which has no diffusers
    config: a config.json beside it belongs to something else) the model's, which also gives the scaling factor and
    latent statistics."""
    if given is not None:
        return ConfigChoice({**req.model.config, **given}, f"{req.config_file} (over {req.model.name}'s config)", False)
    if carried is not None:
        return ConfigChoice(carried, "the file's metadata", False)
    if source.config is None or not _keeps_folder_config(fmt):
        return ConfigChoice(dict(req.model.config), f"{req.model.name}'s config", True)
    return ConfigChoice(source.config, str(source.config_file), False)


def _keeps_folder_config(fmt) -> bool:
    """Whether a config.json beside files of this format is their diffusers config: diffusers' layout's, and a
    renaming format's that says so (`config: folder`); an original release's belongs to something else."""
    return not fmt.renames or fmt.config_from == "folder"


def carried_config(family, fmt, weights: sources.SourceWeights, shown: str) -> dict | None:
    """The diffusers config of an original file whose format keeps its config in the file (`config: metadata`), as
    the family translates it; None where the format keeps none or the file lacks it."""
    if fmt.config_from != "metadata" or family.config_from_metadata is None:
        return None
    try:
        return family.config_from_metadata(weights.metadata)
    except ConfigError as e:
        raise InputError(f"{shown}: {e}") from None


def make_plan(req: Request, source: sources.Source) -> Plan:
    """Everything checkable before writing: the source's format, the config's family and variant, the weights against
    the config, every key's rule."""
    family = req.model.family
    mapping_path, rules = load_family_mapping(req)
    if req.config_file is None and source.config is not None:
        refuse_other_family(req.model, source.config)  # a folder's config.json names its class before the keys can
    weights = source.open_weights()
    shown = ", ".join(p.name for p in source.weight_files)
    given = sources.read_config(req.config_file) if req.config_file is not None else None
    by_config = (given or source.config or {}).get("_class_name") == family.class_name
    fmt = source_formats.detect(weights, req.model, rules, req.source_format, source.weight_files, by_config)
    choice = choose_config(req, source, fmt, carried_config(family, fmt, weights, shown), given)
    refuse_other_family(req.model, choice.raw)
    raw, inferred = inferred_config(family, choice, fmt, weights)
    raw, taken = config_from_tensors(fmt, weights, raw, given if given is not None else {} if choice.from_name else raw)
    inferred += taken
    origin = choice.origin + (f", its {', '.join(inferred)} inferred from the tensors" if inferred else "")
    if choice.from_name:
        origin += " (--config FILE for another)"
    config = config_from_dict(family, raw, origin)
    refuse_other_variant(req.model, config)
    source_formats.refuse_other_variant(fmt, rules.families, family, config, req.model)
    dropped, filled = {}, {}
    if fmt.renames:
        renamed = source_formats.rename(rules, fmt, weights, diffusers_specs(family, config), config, shown, origin)
        weights, dropped, filled = renamed.weights, renamed.dropped, renamed.filled
    leaf_shapes = req.target.leaf_shapes(family, config)
    source_shapes = {k: shape for k, (shape, _) in weights.specs.items()}
    try:
        assignments = mapping.plan(rules, req.target.name, source_shapes, leaf_shapes)
    except MappingError:
        # weights that do not fit their config are bad input, said as such; only rules that fail on a checkpoint
        # that fits are a mapping problem (the diffusers model's shapes need PyTorch: asked for only here)
        if not fmt.renames:
            sources.ensure_weights_fit_config(family, diffusers_shapes(family, config), weights)
        raise
    sources.ensure_weights_or_counts(weights, (a.source_key for a in assignments))
    ignored = family.config_class.ignored_fields(raw)
    return Plan(
        weights, config, mapping_path, leaf_shapes, assignments, ignored, fmt, dropped, origin, inferred, filled
    )


def inferred_config(family, choice: ConfigChoice, fmt, weights) -> tuple[dict, list[str]]:
    """Where the config is the named model's for want of the file's own (a lone file, an original release), the
    family's reading of the tensors in its place: a VAE of other widths than the name's converts as what it is. The
    fields that changed are returned to be reported. A format whose rules compute indices from the config (the LDM
    decoder's levels counted from the top) renames with the config the tensors give, until it gives the same."""
    if not choice.from_name or family.config_from_shapes is None:
        return choice.raw, []
    named = config_from_dict(family, choice.raw, choice.origin).to_dict()
    source = {k: shape for k, (shape, _) in weights.specs.items()}
    fields, implied = named, choice.raw
    for _ in range(3):  # a fixed point in one round, or two where the depth differs from the name's
        implied = _read_from_shapes(family, mapping.renamed_shapes(fmt, source, fields), choice)
        try:
            again = family.config_class.from_dict(implied).to_dict()
        except ConfigError:
            break  # said with the config's origin when the plan builds it
        if again == fields:
            break
        fields = again
    return implied, sorted(k for k, v in implied.items() if named.get(k) != v)


MAX_CONFIG_TENSOR = 4096  # values: a config field a tensor holds is a list of per-channel statistics


def config_from_tensors(fmt, weights, raw: dict, stated: dict) -> tuple[dict, list[str]]:
    """The config fields a format's files hold as tensors (`config_tensors`: ComfyUI's MiniMax-H3 latents_mean and
    latents_std). Where they say what the config says, at the tensor's precision (a float16 file rounds them), the
    config's values stand; where they say otherwise, the file's values replace the named model's, and are returned
    to be reported; a config that states the field (--config, the file's config; null states nothing) and disagrees
    is bad input."""
    out, taken = dict(raw), []
    for field, key in fmt.config_tensors.items():
        if key not in weights.specs:
            raise InputError(f"the file has no {key} tensor, which files of {fmt.name} keep {field} in")
        shape, _ = weights.specs[key]
        if len(shape) != 1 or not 0 < shape[0] <= MAX_CONFIG_TENSOR:
            raise InputError(f"{key}: a tensor of shape {list(shape)}, not the list of values {field} is")
        held = np.asarray(weights[key])
        if not np.isfinite(held.astype(np.float32)).all():
            raise InputError(f"{key}: holds NaN or Inf, which no {field} is")
        said = raw.get(field)
        try:
            rounded = np.asarray(said, np.float64).astype(held.dtype)
            agrees = rounded.shape == held.shape and np.array_equal(rounded, held)
        except (TypeError, ValueError):  # not a list of numbers: the config's own check says so
            agrees = False
        if agrees:
            continue
        if stated.get(field) is not None:
            raise InputError(
                f"the file's {key} says {field} is {shown(held.astype(np.float64).tolist())}, the config says "
                f"{shown(said)}: the config and the weights are of two models"
            )
        out[field] = held.astype(np.float64).tolist()
        taken.append(field)
    return out, taken


def _read_from_shapes(family, shapes: dict, choice: ConfigChoice) -> dict:
    """The family's config read from a file's shapes: untrusted, so shapes that say no config (a 0-d tensor where a
    kernel belongs, a level count past any bound, a zero channel count) are bad input, whatever the reading trips on."""
    try:
        return family.config_from_shapes(shapes, choice.raw)
    except (IndexError, KeyError, StopIteration, ArithmeticError, TypeError, ValueError) as e:
        raise InputError(
            f"its tensors say no {family.class_name} config ({type(e).__name__} reading their shapes); give one with "
            "--config FILE"
        ) from None


def convert(req: Request) -> Summary:
    return convert_components([req], req.out, req.force, req.say)[0]


def convert_components(requests: list[Request], out: Path, force: bool, say: Callable[[str], None]) -> list[Summary]:
    """Converts one request into `out`, or several (a pipeline's components, `--component all`) each into
    `out/<component>/`, as one transaction: every one converted and validated, or nothing at `out`."""
    started = time.monotonic()
    folder = OutputFolder(out, force, say=say)
    for req in requests:
        if sources.hub_location(req.model, req.source, req.revision) is None:
            folder.check_not_source([Path(req.source).expanduser()])
    folder.check()
    resolved = [(req, sources.resolve(req.model, req.source, req.revision, req.offline)) for req in requests]
    for _, source in resolved:
        folder.check_not_source(source.protected)
    whole = len(requests) == 1  # a single component is the output itself
    with folder as work:
        written = []
        for req, source in resolved:
            place = work if whole else work / req.model.component
            final = folder.out if whole else folder.out / req.model.component
            place.mkdir(exist_ok=True)
            if not whole:
                say(f"{req.model.component}:")
            provenance = source.start_hashing()
            try:
                written.append(_write_output(req, source, folder, place, final, provenance, started))
            except ConvertError:
                provenance()  # a Hub file that is not the Hub's explains any failure reading it
                raise
            started = time.monotonic()
        folder.commit()
    failed = [
        f"{failure_message(bad)}; kept at {s.out} because of --keep-invalid"
        for s in written
        if (bad := [c for c in s.comparisons if not c.ok])
    ]
    if failed:  # only reached with --keep-invalid: the output is kept, marked invalid, and the run still fails
        raise ValidationError("; ".join(failed))
    return written


def _write_output(req, source, folder: OutputFolder, work: Path, out: Path, provenance, started: float) -> Summary:
    """Converts `req` into `work` (which becomes `out`), validated."""
    family = req.model.family
    plan = make_plan(req, source)
    for line in (plan.format_line(), plan.inferred_line(), plan.ignored_line()):
        if line:
            req.say(line)
    dtype = choose_dtype(req.dtype, plan.weights, req.say)
    if req.validate:
        validate.ensure_inputs_fit(family, plan.config)
    manifest = new_manifest(
        family=family.name,
        model=req.model.name,
        **({"component": req.model.component} if req.model.component != "vae" else {}),
        target=req.target.name,
        format=req.fmt,
        dtype=dtype.name,
        mapping={
            "file": str(req.mapping_file) if req.mapping_file else plan.mapping_path.name,
            "sha256": hashlib.sha256(plan.mapping_path.read_bytes()).hexdigest(),
        },
    )
    fixed = req.target.fixed_dtype_leaves(family, plan.config)
    specs = {a.target_key: (plan.leaf_shapes[a.target_key], fixed.get(a.target_key, dtype)) for a in plan.assignments}
    folder.needed = (folder.needed or 0) + specs_bytes(specs)
    recorded = {k: None for k in family.recorded_tensors}
    try:
        nbytes = _write_weights(work, req, plan.assignments, plan.weights, specs, manifest, recorded)
    except OSError as e:
        raise cannot_write(folder.out.parent, e, folder.needed) from None
    if family.recorded_tensors:
        manifest["tensors"] = recorded
    manifest["source"] = dict(provenance(), format=plan.source_format.name)
    if plan.inferred:
        manifest["source"]["config_inferred"] = plan.inferred
    if plan.dropped:
        manifest["source"]["dropped"] = plan.dropped
    if plan.filled:
        manifest["source"]["filled"] = plan.filled
    if plan.ignored_config_keys:
        manifest["config_ignored"] = plan.ignored_config_keys
    write_json(work / "config.json", plan.config.to_dict())
    write_json(work / MANIFEST, manifest)
    comparisons = _validate(req, plan, dtype, work, manifest, out)
    parameters = sum(int(np.prod(shape)) for shape, _ in specs.values())
    return Summary(
        out,
        req.target.name,
        req.fmt,
        dtype.name,
        len(specs),
        parameters,
        nbytes,
        time.monotonic() - started,
        comparisons,
    )


def _validate(req, plan, dtype, work, manifest, out) -> list:
    if not req.validate:
        return []
    family = req.model.family
    runs = "decode and encode" if "encoder" in family.parts else "decode"
    req.say(f"validating: {runs} against the PyTorch reference on the source weights ...")
    enable_compile_cache()  # with $VAE_CONVERT_COMPILE_CACHE set, conversions of one architecture compile once
    outcome = validate.run(family, plan.config, req.target.runner(load_output(work)), plan.weights, dtype)
    if dtype != np.float32:  # and as it will run: in its own dtype, or float32 where its config upcasts it
        runs_in = "float32" if upcast(plan.config, dtype) else dtype.name
        native = req.target.runner(load_output(work), native=True)
        outcome.comparisons += validate.finite_in_own_dtype(family, plan.config, native, runs_in)
    return record_validation(outcome, manifest, work, out, req)


MAX_RECORDED_VALUES = 4096  # a recorded tensor's values in the manifest (released statistics hold 128)


def recorded_tensor(array: np.ndarray):
    """A tensor the manifest records: its values where they are few (latent or BatchNorm statistics as released),
    else its shape and the digest of its float32 bytes, the values being in the weights: a manifest stays small
    enough to read back whatever the config's sizes."""
    values = np.asarray(array, np.float32)
    if values.size <= MAX_RECORDED_VALUES:
        return values.astype(np.float64).ravel().tolist()
    return {"shape": list(values.shape), "sha256": hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()}


def _write_weights(work, req, assignments, weights, specs, manifest, recorded: dict) -> int:
    """Writes the mapped weights, and the values of the source tensors `recorded` names into it."""
    metadata = {"vae_convert": manifest}  # what is known before writing; the full manifest is a file
    writer = req.target.open_writer(req.fmt, work, specs, metadata)
    nbytes = 0
    for a in req.progress(assignments, "converting"):
        source = weights[a.source_key]
        array = mapping.apply_ops(a.ops, source).astype(specs[a.target_key][1], copy=False)
        ensure_storable(a.source_key, source, array, req.allow_nonfinite)
        writer.write(a.target_key, array)
        if a.source_key in recorded:
            recorded[a.source_key] = recorded_tensor(source)
        nbytes += array.nbytes
        del source, array
        weights.release(a.source_key)
    writer.close()
    return nbytes
