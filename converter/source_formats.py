"""Which layout a checkpoint is in (diffusers' own, or an original release's: mappings/<family>.yaml `source_formats`),
and its tensors under diffusers' names, which is what the target rules and the validation read.

A format is recognised from the keys (its `signature`; of two that fit, one whose signature holds the other's is the
more specific) and, where formats share their keys, from how the file packs them (its `container`) or, among one
family's formats, from which one's rules know every key, or named with --source-format; a file of another family's
format, or of another VAE variant, is told apart from a damaged one, and named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from converter import mapping
from converter.errors import InputError, MappingError, UsageError
from converter.registry import FAMILIES, MODELS, config_from_dict, distinct_configs


@dataclasses.dataclass(frozen=True)
class KnownFormat:
    family: object  # FamilySpec
    mapping: mapping.Mapping
    fmt: mapping.SourceFormat

    def knows(self, key: str) -> bool:
        """Whether a rule of this format matches the key (for diffusers' layout: a rule of a target section)."""
        rules = self.fmt.rules + self.fmt.drops if self.fmt.renames else sum(self.mapping.targets.values(), ())
        return any(r.pattern.fullmatch(key) for r in rules)


def known_formats(family, own: mapping.Mapping) -> list[KnownFormat]:
    """Every mapping file's formats, each file once; the converting family's from `own` (the family's mapping file or
    --mapping's). Another family's mapping file that
    does not load is left out: it is that family's problem (check-mappings names it), not this conversion's."""
    out, seen = [], set()
    for other in FAMILIES.values():
        if other.mapping_file in seen:
            continue
        seen.add(other.mapping_file)
        shared = other.mapping_file == family.mapping_file
        try:
            rules = own if shared else mapping.load_mapping(mapping.MAPPINGS_DIR / other.mapping_file)
        except MappingError:
            continue
        out += [KnownFormat(_holder(fmt, family if shared else other), rules, fmt) for fmt in rules.formats.values()]
    return out


def _holder(fmt: mapping.SourceFormat, family):
    """The family whose checkpoints a format holds: its model's where it names one (families sharing a mapping file
    keep each other's formats), else the mapping file's."""
    return MODELS[fmt.model].family if fmt.model else family


def detect(weights, entry, own: mapping.Mapping, forced: str | None, files: list[Path]) -> mapping.SourceFormat:
    """The format of `weights`, checked against the model the user named and the file's container."""
    family, shown = entry.family, ", ".join(p.name for p in files)
    if forced is not None:
        if forced not in own.formats:
            raise UsageError(
                f"--source-format {forced}: {entry.name} ({family.name}) reads {', '.join(own.formats)}"
                f"; other families' formats need their model name"
            )
        return _checked_container(own.formats[forced], weights, shown)
    known = known_formats(family, own)
    shapes = {k: shape for k, (shape, _) in weights.specs.items()}
    fitting = [k for k in known if k.fmt.fits(shapes)]
    if not fitting:
        raise InputError(f"{shown}: {_no_fit(known, shapes)}")
    packed_alike = [k for k in fitting if k.fmt.packs(weights.wrapper)]
    if len(fitting) > 1 and len(packed_alike) == 1:  # a release of diffusers' own keys, told apart by its container
        fitting = packed_alike
    # a format whose signature holds another's whole is the more specific: Flux.2's files have every key Flux.1's
    # (or diffusers' AutoencoderKL's) signature names, and BatchNorm statistics besides
    specific = [k for k in fitting if not any(set(k.fmt.signature) < set(o.fmt.signature) for o in fitting)]
    if len(fitting) > 1 and specific:
        fitting = specific
    # formats of one family that share their signature keys (diffusers' layout and its old attention names, an SD
    # checkpoint and an SD3 one): the one whose rules know every key; formats of two families stay for the user to name
    knowing = [k for k in fitting if all(map(k.knows, shapes))]
    if len(fitting) > 1 and len({k.family.name for k in fitting}) == 1 and len(knowing) == 1:
        fitting = knowing
    if len(fitting) > 1:
        names = ", ".join(f"{k.fmt.name} ({k.family.name})" for k in fitting)
        raise InputError(f"{shown}: the keys fit several formats ({names}); name one with --source-format")
    found = fitting[0]
    if found.family is not family:
        hint = f"vae-convert {found.fmt.model or closest_model(found.family, shapes)}"
        raise InputError(
            f"{shown} is a checkpoint of {found.family.class_name} ({found.fmt.name}: {found.fmt.about}), not of "
            f"{family.class_name}: try `{hint}`"
        )
    return _checked_container(found.fmt, weights, shown)


def closest_model(family, shapes: dict) -> str:
    """The family's model name whose diffusers keys a file in diffusers' layout shares most (the first of a tie):
    the command to suggest where the file carries no config to say which VAE it holds (Wan 2.2's, not 2.1's)."""
    from converter.targets import diffusers_shapes

    shared = {
        name: len(shapes.keys() & diffusers_shapes(family, config_from_dict(family, config)).keys())
        for name, config in distinct_configs(family)
    }
    return max(shared, key=shared.get)


def _no_fit(known: list[KnownFormat], shapes: dict) -> str:
    keys = list(shapes)
    shares = {id(k): sum(map(k.knows, keys)) for k in known}
    closest = max(known, key=lambda k: shares[id(k)])
    strangers = [k for k in keys if not closest.knows(k)]
    absent = closest.fmt.unfit_signature(shapes)
    told = []
    if strangers:
        told.append(f"keys it does not know: {_first(strangers)}")
    if absent:
        told.append(f"its signature key(s) missing or of another rank: {_first(absent)}")
    return (
        f"not a checkpoint format this tool knows; closest: {closest.fmt.name} of {closest.family.name} "
        f"({shares[id(closest)]} of {len(keys)} keys), {'; '.join(told)}"
    )


def _first(keys: list[str], n: int = 3) -> str:
    return ", ".join(repr(k) for k in keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def _checked_container(fmt: mapping.SourceFormat, weights, shown: str) -> mapping.SourceFormat:
    if not fmt.packs(weights.wrapper):
        declared = f"keeps its tensors under {fmt.wrapper!r}" if fmt.wrapper else "keeps its tensors at the top level"
        found = f"under {weights.wrapper!r}" if weights.wrapper else "at the top level, with no wrapper"
        raise InputError(f"{shown}: {fmt.name} {declared} ({fmt.where}), but this file has them {found}")
    return fmt


def refuse_other_variant(fmt: mapping.SourceFormat, family, config, entry):
    """An original Wan 2.2 file named as wan2.1 (or the reverse, or as a class sharing the mapping file): the format's
    model says which VAE the file holds."""
    if fmt.model is None:
        return
    holder = MODELS[fmt.model].family
    held = config_from_dict(holder, MODELS[fmt.model].config).variant
    if holder is not family or held != config.variant:
        raise InputError(
            f"the checkpoint is a {held} ({fmt.name}), but {entry.name} names a {config.variant}: "
            f"try `vae-convert {fmt.model}`"
        )


class RenamedWeights:
    """A source's tensors under diffusers' names, each read (and layout-changed) from the file on demand, and the
    counts the file lacks (`filled`: diffusers key -> (shape, dtype, value))."""

    def __init__(self, weights, assignments: list[mapping.Assignment], filled: dict):
        self.source = weights
        self._by_name = {a.target_key: a for a in assignments}
        self._filled = filled
        self.specs = {
            a.target_key: (
                mapping.transformed_shape(a.rule.ops, weights.specs[a.source_key][0]),
                weights.specs[a.source_key][1],
            )
            for a in assignments
        }
        self.specs.update({key: (shape, dtype) for key, (shape, dtype, _) in filled.items()})

    def __getitem__(self, key: str) -> np.ndarray:
        if key in self._filled:
            shape, dtype, value = self._filled[key]
            return np.full(shape, value, dtype)
        a = self._by_name[key]
        return mapping.apply_ops(a.rule.ops, self.source[a.source_key])

    def release(self, key: str):
        if key not in self._filled:
            self.source.release(self._by_name[key].source_key)

    def floating_dtypes(self) -> set[np.dtype]:
        return {dtype for _, dtype in self.specs.values() if dtype.kind == "f" or dtype.name == "bfloat16"}


@dataclasses.dataclass
class Renamed:
    weights: RenamedWeights
    dropped: dict[str, dict]  # drop rule name -> {"tensors", "bytes"}
    filled: dict[str, int]  # diffusers key the file lacks -> the value it was given (the format's `absent`)


def rename(own: mapping.Mapping, fmt: mapping.SourceFormat, weights, diffusers: dict[str, tuple], shown: str, config):
    """The file's keys through the format's rules, strict both ways: a fault of the rules (an overlap, a drop rule
    that would swallow a model key) is a MappingError; a file that does not fit them (or `config`, which says where
    the config came from) is bad input. `diffusers` holds the shape and dtype of each of diffusers' keys; a count the
    format lets its files lack gets the format's value."""
    source = {k: shape for k, (shape, _) in weights.specs.items()}
    result = mapping.rename_keys(own, fmt, source, {k: shape for k, (shape, _) in diffusers.items()})
    if result.conflicts:
        raise MappingError(mapping.summary(result.problems))
    if result.unfit:
        shown_problems = " | ".join(result.unfit[:2]) + (
            f" | ... and {len(result.unfit) - 2} more" if len(result.unfit) > 2 else ""
        )
        raise InputError(
            f"{shown} does not fit {fmt.name} with {config}: {len(result.unfit)} problem(s): {shown_problems}"
        )
    dropped = {}
    for key, rule in result.dropped.items():
        shape, dtype = weights.specs[key]
        entry = dropped.setdefault(rule.name, {"tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += int(np.prod(shape)) * np.dtype(dtype).itemsize
    lacking = mapping.lacking_counts(fmt, source, diffusers)
    filled = {k: (*diffusers[k], value) for k, value in lacking.items()}
    return Renamed(RenamedWeights(weights, result.assignments, filled), dropped, lacking)
