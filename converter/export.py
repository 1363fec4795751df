"""The way back to PyTorch: `export` turns a Flax output (converted, or written from memory by `save`) into a
diffusers checkpoint by running the family's mapping rules backwards, and `save` writes a Flax model held in memory
(after a fine-tune, say) in the layout the converter writes.

Nothing here maps keys by hand: the forward plan pairs every diffusers key of the config with its Flax leaf (strict
both ways, as a conversion is), and `mapping.inverse_ops` undoes each rule's layout change. The result is what
`--to torchax` writes: diffusers' names and layouts, which `from_pretrained` reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from converter import compat, mapping, untrusted, validate
from converter.errors import InputError, OutputError, UsageError, ValidationError
from converter.output import MANIFEST, OutputFolder, cannot_write, new_manifest, specs_bytes, write_json
from converter.registry import FAMILIES
from converter.report import Summary, failure_message, no_progress, record_validation, silent
from converter.runners import TorchRunner
from converter.safetensors_io import SafetensorsFile
from converter.sources import ensure_weights_fit_config
from converter.targets import DTYPES, TARGETS, diffusers_specs, load_output, read_output

FLAX, TORCHAX = TARGETS["flax"], TARGETS["torchax"]


@dataclasses.dataclass(kw_only=True)
class ExportRequest:
    source: Path  # a vae-convert output
    out: Path
    dtype: str = "auto"  # auto: the source's
    force: bool = False
    validate: bool = True
    preview: bool = True  # validation.png beside the weights
    keep_invalid: bool = False
    say: Callable[[str], None] = silent
    progress: Callable = no_progress


def export(req: ExportRequest) -> Summary:
    started = time.monotonic()
    info = read_output(req.source)
    source, manifest, family, config = info.path, info.manifest, info.family, info.config
    folder = OutputFolder(req.out, req.force, say=req.say)
    folder.check_not_source([source])
    folder.check()
    if info.target is TORCHAX:
        return _copy_diffusers_output(req, info, folder, started)
    source_dtype = info.dtype
    dtype = source_dtype if req.dtype == "auto" else DTYPES[req.dtype]

    leaves = {_dotted(k): v for k, v in FLAX.read_weights(source, info.fmt).items()}
    _ensure_leaves_fit(source, leaves, family, config, source_dtype)
    mapping_path = mapping.MAPPINGS_DIR / family.mapping_file
    rules = mapping.load_mapping(mapping_path)
    diffusers = diffusers_specs(family, config)
    shapes = {key: shape for key, (shape, _) in diffusers.items()}
    assignments = mapping.plan(rules, FLAX.name, shapes, {k: tuple(v.shape) for k, v in leaves.items()})

    with folder as work:
        record = new_manifest(
            family=family.name,
            model=manifest.get("model"),
            target=TORCHAX.name,
            format="safetensors",
            dtype=dtype.name,
            mapping={"file": mapping_path.name, "sha256": hashlib.sha256(mapping_path.read_bytes()).hexdigest()},
            source={"origin": str(source), "exported_from": "flax", "flax_output": _provenance(manifest)},
        )
        # counts keep diffusers' integer dtype, every weight takes the export's
        specs = {key: (shape, _kept(kept, dtype)) for key, (shape, kept) in diffusers.items()}
        folder.needed = specs_bytes(specs)
        writer = TORCHAX.open_writer("safetensors", work, specs, {"format": "pt", "vae_convert": record})
        by_key = {a.source_key: a for a in assignments}
        try:
            for key in req.progress(list(shapes), "exporting"):
                a = by_key[key]
                leaf = np.asarray(leaves.pop(a.target_key))
                layout = mapping.apply_ops(mapping.inverse_ops(a.rule.ops, specs[key][0]), leaf)
                writer.write(key, layout.astype(specs[key][1]))
            writer.close()
        except OSError as e:
            raise cannot_write(work.parent, e, folder.needed) from None
        write_json(work / "config.json", config.to_dict())
        write_json(work / MANIFEST, record)
        comparisons = _validate(req, family, config, source, work, record, folder.out)
        folder.commit()
    failed = [c for c in comparisons if not c.ok]
    if failed:
        raise ValidationError(f"{failure_message(failed)}; kept at {folder.out} because of --keep-invalid")
    parameters = sum(int(np.prod(shape)) for shape, _ in specs.values())
    return Summary(
        folder.out, "diffusers", "safetensors", dtype.name, len(specs), parameters, specs_bytes(specs),
        time.monotonic() - started, comparisons,
    )  # fmt: skip


def _kept(diffusers_dtype: np.dtype, dtype: np.dtype) -> np.dtype:
    """The dtype a diffusers key is written in for an output of `dtype`: a count keeps its own."""
    return diffusers_dtype if diffusers_dtype.kind in "iu" else dtype


def _dotted(path) -> str:
    return path if isinstance(path, str) else ".".join(map(str, path))


def _ensure_leaves_fit(source: Path, leaves: dict, family, config, dtype):
    """The state on disk against the model its config describes: every leaf there, none extra, each its shape, each
    of `dtype` (a count of its own integer dtype)."""
    expected, counts = FLAX.leaf_shapes(family, config), FLAX.integer_leaves(family, config)
    missing, extra = sorted(set(expected) - set(leaves)), sorted(set(leaves) - set(expected))
    if missing or extra:
        raise InputError(
            f"{source}: the Flax state does not match its config: {len(missing)} leaf(s) missing "
            f"{missing[:3]}, {len(extra)} unexpected {extra[:3]}"
        )
    for key, leaf in leaves.items():
        if tuple(leaf.shape) != tuple(expected[key]):
            raise InputError(
                f"{source}: leaf {key!r} has shape {list(leaf.shape)}, the config implies {list(expected[key])}"
            )
        if np.dtype(leaf.dtype) != counts.get(key, dtype):
            raise InputError(f"{source}: leaf {key!r} is {leaf.dtype}, the output's dtype for it is {dtype.name}")


def _provenance(manifest: dict) -> dict:
    return {k: manifest[k] for k in ("model", "dtype", "source", "version") if k in manifest}


def _validate(req, family, config, source, work, record, out) -> list:
    """The exported weights in the project's PyTorch model (plain PyTorch) against the Flax model they came from."""
    if not req.validate:
        return []
    req.say("validating: decode and encode of the exported weights against the Flax model ...")
    reference = FLAX.runner(load_output(source))
    outcome = validate.compare_runners(family, config, TorchRunner(load_output(work)), reference)
    return record_validation(outcome, record, work, out, req)


def _copy_diffusers_output(req, info, folder: OutputFolder, started: float) -> Summary:
    """A torchax output is diffusers' format already: its weights are copied as they are, its config and manifest
    written as read, and the copy checked whole (a readable safetensors file holding every weight of the config, of
    the manifest's dtype, nothing more) before it is committed."""
    source, manifest = info.path, info.manifest
    if req.dtype not in ("auto", info.dtype.name):
        raise UsageError(
            f"{source} is a torchax output ({info.dtype.name}), already in diffusers' format; to change its "
            f"dtype, convert it: vae-convert {manifest.get('model')} --source {source} --to torchax --dtype {req.dtype}"
        )
    req.say(f"{source} is a torchax output, already in diffusers' format: copying it")
    name = TORCHAX.weight_files["safetensors"]
    with folder as work:
        _copy_regular_file(source / name, work / name)
        weights = SafetensorsFile(work / name, shown=source / name)
        expected = diffusers_specs(info.family, info.config)
        ensure_weights_fit_config(
            info.family, {k: shape for k, (shape, _) in expected.items()}, weights, f"{source / name}: "
        )
        wrong = next((k for k, (_, dtype) in weights.specs.items() if dtype != _kept(expected[k][1], info.dtype)), None)
        if wrong is not None:
            raise InputError(
                f"{source / name}: {wrong} is {weights.specs[wrong][1]}, the output's dtype for it is "
                f"{_kept(expected[wrong][1], info.dtype)}"
            )
        write_json(work / "config.json", info.config.to_dict())
        write_json(work / MANIFEST, manifest)
        folder.commit()
    parameters = sum(math.prod(shape) for shape, _ in weights.specs.values())
    return Summary(
        folder.out, "diffusers", "safetensors", info.dtype.name, len(weights.specs), parameters,
        specs_bytes(weights.specs), time.monotonic() - started, [],
    )  # fmt: skip


def _copy_regular_file(source: Path, target: Path):
    """Copies a regular file (a FIFO or device refused) through the descriptor that was checked."""
    fd = untrusted.open_regular(source)
    try:
        with os.fdopen(fd, "rb") as reader, open(target, "xb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 24)
    except OSError as e:
        raise OutputError(f"cannot copy {source.name} to {target.parent}: {e.strerror or e}") from None


def save(vae, path: str | Path, fmt: str = "orbax", force: bool = False) -> Path:
    """Writes the Flax model `vae` (a family's `AutoencoderKL*`, e.g. after training) to `path` in the converter's
    output layout, Orbax (default) or flax safetensors: `converter.load` reads it back and `vae-convert export`
    turns it into a diffusers checkpoint. Its manifest says it was saved from memory, with family and config."""
    from flax import nnx

    family = next((f for f in FAMILIES.values() if type(vae) is f.flax_model()), None)
    if family is None:
        raise InputError(f"save: {type(vae).__name__} is not one of the project's Flax models")
    fmt = FLAX.default_format(fmt)
    _, state = nnx.split(vae)
    leaves = {_dotted(p): compat.variable_value(v) for p, v in nnx.to_flat_state(state)}
    counts = FLAX.integer_leaves(family, vae.config)
    dtypes = {np.dtype(v.dtype) for k, v in leaves.items() if k not in counts}
    if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES.values():
        raise InputError(
            f"save: the parameters must share one of {', '.join(DTYPES)}; found {sorted(map(str, dtypes))}"
        )
    dtype = dtypes.pop()
    _ensure_leaves_fit(Path("<memory>"), leaves, family, vae.config, dtype)
    folder = OutputFolder(Path(path), force)
    folder.check()
    record = new_manifest(
        family=family.name,
        model=None,
        target=FLAX.name,
        format=fmt,
        dtype=dtype.name,
        source={"origin": f"{type(vae).__name__} in memory", "saved_from": "memory"},
    )
    with folder as work:
        specs = {key: (tuple(v.shape), np.dtype(v.dtype)) for key, v in leaves.items()}
        folder.needed = specs_bytes(specs)
        try:
            writer = FLAX.open_writer(fmt, work, specs, {"vae_convert": record})
            for key, leaf in leaves.items():
                writer.write(key, np.asarray(leaf))
            writer.close()
        except OSError as e:
            raise cannot_write(work.parent, e, folder.needed) from None
        write_json(work / "config.json", vae.config.to_dict())
        write_json(work / MANIFEST, record)
        folder.commit()
    return folder.out
