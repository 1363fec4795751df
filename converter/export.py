"""The way back to PyTorch: `export` turns an output (converted to either target, or written from memory by `save`)
into a diffusers checkpoint by running the family's mapping rules for its target backwards, and `save` writes a Flax
model held in memory (after a fine-tune, say) in the layout the converter writes.

Nothing here maps keys by hand: the forward plan pairs every diffusers key of the config with its Flax leaf (strict
both ways, as a conversion is), and `mapping.inverse_ops` undoes each rule's layout change. The result is what
`--to torchax` writes: diffusers' names and layouts, which `from_pretrained` reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from converter import compat, mapping, validate
from converter.errors import InputError, ValidationError
from converter.output import (
    MANIFEST,
    OutputFolder,
    cannot_write,
    load_output,
    new_manifest,
    read_output,
    specs_bytes,
    write_json,
)
from converter.registry import FAMILIES
from converter.report import Summary, failure_message, no_progress, record_validation, silent
from converter.runners import TorchRunner
from converter.targets import DTYPES, TARGETS, diffusers_specs

FLAX, TORCHAX = TARGETS["flax"], TARGETS["torchax"]  # `save` writes the one, `export` the other


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
    source, manifest, family, config, target = info.path, info.manifest, info.family, info.config, info.target
    folder = OutputFolder(req.out, req.force, say=req.say)
    folder.check_not_source([source])
    folder.check()
    dtype = info.dtype if req.dtype == "auto" else DTYPES[req.dtype]

    leaves = {_dotted(k): v for k, v in target.read_weights(info).items()}
    _ensure_leaves_fit(source, leaves, target, family, config, info.dtype)
    mapping_path = mapping.MAPPINGS_DIR / family.mapping_file
    rules = mapping.load_mapping(mapping_path)
    diffusers = diffusers_specs(family, config)
    shapes = {key: shape for key, (shape, _) in diffusers.items()}
    assignments = mapping.plan(rules, target.name, shapes, {k: tuple(v.shape) for k, v in leaves.items()})

    with folder as work:
        record = new_manifest(
            family=family.name,
            model=manifest.get("model"),
            target=TORCHAX.name,
            format="safetensors",
            dtype=dtype.name,
            mapping={"file": mapping_path.name, "sha256": hashlib.sha256(mapping_path.read_bytes()).hexdigest()},
            source={"origin": str(source), "exported_from": target.name, "output": _provenance(manifest)},
        )
        # counts keep diffusers' integer dtype and its float32 modules float32, every other weight takes the export's
        fixed = TORCHAX.fixed_dtype_leaves(family, config)
        specs = {key: (shape, TORCHAX.leaf_dtype(key, fixed, dtype)) for key, shape in shapes.items()}
        folder.needed = specs_bytes(specs)
        writer = TORCHAX.open_writer("safetensors", work, specs, {"format": "pt", "vae_convert": record})
        by_key = {a.source_key: a for a in assignments}
        try:
            for key in req.progress(list(shapes), "exporting"):
                a = by_key[key]
                leaf = np.asarray(leaves.pop(a.target_key))
                layout = mapping.apply_ops(mapping.inverse_ops(a.ops, specs[key][0]), leaf)
                writer.write(key, layout.astype(specs[key][1]))
            writer.close()
        except OSError as e:
            raise cannot_write(work.parent, e, folder.needed) from None
        write_json(work / "config.json", config.to_dict())
        write_json(work / MANIFEST, record)
        comparisons = _validate(req, info, dtype, work, record, folder.out)
        folder.commit()
    failed = [c for c in comparisons if not c.ok]
    if failed:
        raise ValidationError(f"{failure_message(failed)}; kept at {folder.out} because of --keep-invalid")
    parameters = sum(int(np.prod(shape)) for shape, _ in specs.values())
    return Summary(
        folder.out, "diffusers", "safetensors", dtype.name, len(specs), parameters, specs_bytes(specs),
        time.monotonic() - started, comparisons,
    )  # fmt: skip


def _dotted(path) -> str:
    return path if isinstance(path, str) else ".".join(map(str, path))


def _ensure_leaves_fit(source: Path, leaves: dict, target, family, config, dtype):
    """The weights on disk (or in memory) against the model their config describes: every leaf there, none extra,
    each its shape, each of `dtype` (a count of its own integer dtype, a float32 module float32)."""
    expected, fixed = target.leaf_shapes(family, config), target.fixed_dtype_leaves(family, config)
    missing, extra = sorted(set(expected) - set(leaves)), sorted(set(leaves) - set(expected))
    if missing or extra:
        raise InputError(
            f"{source}: the weights do not match their config: {len(missing)} leaf(s) missing "
            f"{missing[:3]}, {len(extra)} unexpected {extra[:3]}"
        )
    for key, leaf in leaves.items():
        if tuple(leaf.shape) != tuple(expected[key]):
            raise InputError(
                f"{source}: leaf {key!r} has shape {list(leaf.shape)}, the config implies {list(expected[key])}"
            )
        wanted = target.leaf_dtype(key, fixed, dtype)
        if np.dtype(leaf.dtype) != wanted:
            raise InputError(f"{source}: leaf {key!r} is {leaf.dtype}, the output's dtype for it is {wanted.name}")


def _provenance(manifest: dict) -> dict:
    return {k: manifest[k] for k in ("model", "target", "dtype", "source", "version") if k in manifest}


def _validate(req, info, dtype, work, record, out) -> list:
    """The exported weights in the project's PyTorch model (plain PyTorch) against the output they came from, its
    weights rounded to the export's dtype as a conversion rounds its reference's."""
    if not req.validate:
        return []
    req.say(f"validating: decode and encode of the exported weights against the {info.target.name} model ...")
    reference = info.target.runner(info.target.rounded(load_output(info.path), dtype, info.family))
    outcome = validate.compare_runners(info.family, info.config, TorchRunner(load_output(work)), reference)
    return record_validation(outcome, record, work, out, req)


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
    fixed = FLAX.fixed_dtype_leaves(family, vae.config)
    # a model whose every module stays float32 has no other dtype
    dtypes = {np.dtype(v.dtype) for k, v in leaves.items() if k not in fixed} or {np.dtype(np.float32)}
    if len(dtypes) != 1 or next(iter(dtypes)).name not in DTYPES:
        raise InputError(
            f"save: the parameters must share one of {', '.join(DTYPES)}; found {sorted(map(str, dtypes))}"
        )
    dtype = dtypes.pop()
    _ensure_leaves_fit(Path("<memory>"), leaves, FLAX, family, vae.config, dtype)
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
