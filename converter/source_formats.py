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
from converter.registry import COMPONENT_MODELS, FAMILIES, config_from_dict, distinct_configs, format_model


@dataclasses.dataclass(frozen=True)
class KnownFormat:
    families: tuple  # the FamilySpecs whose checkpoints it may hold: its model's, else every family of its file
    mapping: mapping.Mapping
    fmt: mapping.SourceFormat

    def holder(self, shapes: dict, named, named_by_config: bool):
        """The family a checkpoint of this format ({key: shape}) holds. Of the families sharing a mapping file (one
        architecture, classes of its variants), the `named` one where a config names its class (keys cannot tell
        LTX-2's small widths from LTX-Video's), else the one a model of which has its keys (of a tie, the named)."""
        if len(self.families) == 1:
            return self.families[0]
        if named_by_config and named in self.families:
            return named
        return closest_model(self.families, shapes, named).family

    def knows(self, key: str) -> bool:
        """Whether a rule of this format matches the key (for diffusers' layout: a rule of a target section)."""
        if key in self.fmt.config_tensors.values():
            return True
        if not self.fmt.renames:
            return any(r.pattern.fullmatch(key) for r in sum(self.mapping.targets.values(), ()))
        name, rules = self.fmt.candidates(key)
        return any(r.pattern.fullmatch(name) for r in rules)

    def renames(self, key: str) -> bool:
        """Whether a rule that keeps the key as a model weight matches it (a drop rule does not: LTX-2's audio VAE
        format drops whatever is not under its prefix, so it knows every key of any file)."""
        if not self.fmt.renames:
            return self.knows(key)
        name, rules = self.fmt.candidates(key)
        return any(r.pattern.fullmatch(name) for r in rules if r not in self.fmt.drops)


def ensure_models_known(rules: mapping.Mapping):
    """A format's `model` names a registered model (checked where the families are known, not when the YAML is
    read)."""
    for fmt in rules.formats.values():
        if fmt.model is not None and format_model(fmt.model, rules.families) is None:
            raise MappingError(f"{fmt.where}: 'model' of source format {fmt.name!r} is {fmt.model!r}, not a model name")


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
            ensure_models_known(rules)
        except MappingError:
            continue
        sharing = tuple(f for f in FAMILIES.values() if f.mapping_file == other.mapping_file)
        out += [
            KnownFormat((format_model(fmt.model, rules.families).family,) if fmt.model else sharing, rules, fmt)
            for fmt in rules.formats.values()
        ]
    return out


def detect(
    weights, entry, own: mapping.Mapping, forced: str | None, files: list[Path], named_by_config: bool = False
) -> mapping.SourceFormat:
    """The format of `weights`, checked against the model the user named (whose class a config beside the weights,
    or --config, names: `named_by_config`) and the file's container."""
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
    # checkpoint and an SD3 one): the one whose rules know every key; formats of different families stay for the
    # user to name
    holders = {id(k): k.holder(shapes, family, named_by_config) for k in fitting}
    # a whole release holds several components of a pipeline (LTX-2's single files: the VAE, the audio VAE, the
    # vocoder): the component named picks its format
    same_component = [k for k in fitting if holders[id(k)].component == family.component]
    if len(fitting) > 1 and len(same_component) == 1:
        fitting = same_component
    knowing = [k for k in fitting if all(map(k.knows, shapes))]
    if len(fitting) > 1 and len({h.name for h in holders.values()}) == 1 and len(knowing) == 1:
        fitting = knowing
    if len(fitting) > 1:
        names = ", ".join(f"{k.fmt.name} ({holders[id(k)].name})" for k in fitting)
        raise InputError(f"{shown}: the keys fit several formats ({names}); name one with --source-format")
    found = fitting[0]
    holder = holders[id(found)]
    if holder is not family and named_by_config:  # no command would convert it: the next one would name this one
        raise InputError(
            f"{shown}: its keys are a checkpoint of {holder.class_name} ({found.fmt.name}), but its config names "
            f"{family.class_name}: the config and the weights are of two models"
        )
    if holder is not family:
        model = format_model(found.fmt.model, found.mapping.families) if found.fmt.model else None
        hint = (model or closest_model((holder,), shapes)).command
        raise InputError(
            f"{shown} is a checkpoint of {holder.class_name} ({found.fmt.name}: {found.fmt.about}), not of "
            f"{family.class_name}: try `{hint}`"
        )
    return _checked_container(found.fmt, weights, shown)


def closest_model(families, shapes: dict, preferred=None):
    """The model name (of `families`) whose diffusers keys a file in diffusers' layout fits best: the most keys
    shared, the fewest of its own the file lacks (of a tie, the `preferred` family's, else the first): the command to
    suggest where the file carries no config to say which VAE it holds (Wan 2.2's, not 2.1's; LTX-2's, not
    LTX-Video's)."""
    from converter.targets import diffusers_shapes

    def fit(family, config) -> tuple[int, bool]:
        keys = diffusers_shapes(family, config_from_dict(family, config)).keys()
        return len(shapes.keys() & keys) - len(keys - shapes.keys()), family is preferred

    scores = {
        (name, family.component): fit(family, config)
        for family in families
        for name, config in distinct_configs(family)
    }
    return COMPONENT_MODELS[max(scores, key=scores.get)]


def _no_fit(known: list[KnownFormat], shapes: dict) -> str:
    keys = list(shapes)
    shares = {id(k): sum(map(k.knows, keys)) for k in known}
    kept = {id(k): sum(map(k.renames, keys)) for k in known}
    closest = max(known, key=lambda k: (kept[id(k)], shares[id(k)]))
    strangers = [k for k in keys if not closest.knows(k)]
    absent = closest.fmt.unfit_signature(shapes)
    told = []
    if strangers:
        told.append(f"keys it does not know: {_first(strangers)}")
    if absent:
        told.append(f"its signature key(s) missing or of another rank: {_first(absent)}")
    return (
        f"not a checkpoint format this tool knows; closest: {closest.fmt.name} of {closest.families[0].name} "
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


def refuse_other_variant(fmt: mapping.SourceFormat, families: tuple[str, ...], family, config, entry):
    """An original Wan 2.2 file named as wan2.1 (or the reverse, or as a class sharing the mapping file): the format's
    model says which VAE the file holds."""
    if fmt.model is None:
        return
    model = format_model(fmt.model, families)
    held = config_from_dict(model.family, model.config).variant
    if model.family is not family or held != config.variant:
        raise InputError(
            f"the checkpoint is a {held} ({fmt.name}), but {entry.name} names a {config.variant}: try `{model.command}`"
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
                mapping.transformed_shape(a.ops, weights.specs[a.source_key][0]),
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
        return mapping.apply_ops(a.ops, self.source[a.source_key])

    def release(self, key: str):
        if key not in self._filled:
            self.source.release(self._by_name[key].source_key)

    def floating_dtypes(self) -> set[np.dtype]:
        return {dtype for _, dtype in self.specs.values() if dtype.kind == "f" or dtype.name == "bfloat16"}


@dataclasses.dataclass
class Renamed:
    weights: RenamedWeights
    dropped: dict[str, dict]  # drop rule name -> {"tensors", "bytes"}
    filled: dict[str, int]  # diffusers key the file lacks -> the value it was given (the format's `filled`)


def ensure_filled_are_counts(fmt: mapping.SourceFormat, diffusers: dict):
    """A format fills only counts (integer buffers, which PyTorch's loader gives a value of its own): a weight it
    could invent would convert and validate against the same invention."""
    from converter.targets import is_count

    wrong = [k for k in fmt.filled if k in diffusers and not is_count(diffusers[k][1])]
    if wrong:
        raise MappingError(f"{fmt.where}: 'filled' names {', '.join(wrong)}, which are weights, not counts")


def rename(own: mapping.Mapping, fmt: mapping.SourceFormat, weights, diffusers: dict, config, shown: str, told: str):
    """The file's keys through the format's rules for `config`, strict both ways: a fault of the rules (an overlap, a
    drop rule that would swallow a model key) is a MappingError; a file that does not fit them (or the config, which
    `told` says where it came from) is bad input. `diffusers` holds the shape and dtype of each of diffusers' keys; a
    count the format fills where its files lack it gets the format's value."""
    ensure_filled_are_counts(fmt, diffusers)
    source = {k: shape for k, (shape, _) in weights.specs.items()}
    fields = config.to_dict()
    result = mapping.rename_keys(own, fmt, source, {k: shape for k, (shape, _) in diffusers.items()}, fields)
    if result.conflicts:
        raise MappingError(mapping.summary(result.conflicts))
    # the rules are proven on the released files' keys (check-mappings): a file two of whose keys become one
    # diffusers key holds two spellings of it (two prefixes, old and new attention names), which is bad input
    unfit = result.twice + result.unfit
    if unfit:
        shown_problems = " | ".join(unfit[:2]) + (f" | ... and {len(unfit) - 2} more" if len(unfit) > 2 else "")
        raise InputError(f"{shown} does not fit {fmt.name} with {told}: {len(unfit)} problem(s): {shown_problems}")
    dropped = {}
    for key, rule in result.dropped.items():
        shape, dtype = weights.specs[key]
        entry = dropped.setdefault(rule.name, {"tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += int(np.prod(shape)) * np.dtype(dtype).itemsize
    filled = mapping.filled_counts(fmt, source, diffusers, fields)
    return Renamed(
        RenamedWeights(weights, result.assignments, {k: (*diffusers[k], v) for k, v in filled.items()}),
        dropped,
        filled,
    )
