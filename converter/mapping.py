"""Mapping files and the strict planner that applies them.

A mapping file (mappings/<family>.yaml) has one section per target, each a list of rules, and may name regex pieces
once under `patterns` for rules to use as {name}. A rule is data:
  match:     a regex that must match the whole source key (it is anchored whatever it says)
  to:        the target key, a template filled from the match: {1}, {2}... or {name} for named groups
  lookup:    {group: table}: the named group's text is replaced by its entry in a table of `lookups` (the file's,
             or the format's own)
  index:     {group: expression}: the named group's number replaced by an integer expression of it and of the
             config's fields (`len(block_out_channels) - 1 - i`: the LDM decoder's levels counted from the top, at
             any depth); a rule with one renames only with a config (`config` below)
  transpose / squeeze / reshape / reorder: layout changes, applied in the order they are written in the rule
  split:     {axis, parts, groups}: one source tensor becomes a tensor per named part, `{part}` in `to` (a fused
             q/k/v projection, its heads' blocks interleaved: `groups` of them, an expression of the config)
  weight_norm: {dim}: a weight with its weight norm folded in becomes torch's two, `{part}` g (its norm over every
             axis but `dim`) and v (the weight itself), which make the same weight again
A list of rules may name a set of rules the file declares once under `rule_sets` (`- use: ldm-shared`), which
check-mappings reports by set; YAML anchors and aliases are refused, so that what a format holds is what it says.

Target keys are dotted paths; a numeric part is a list index (Flax `nnx.List`), never a position in a sort.
`plan` checks everything that can be checked without data, both ways, before a byte is read or written:
each source key matched by exactly one rule, each target leaf filled exactly once, each shape right.

`source_formats` holds, per checkpoint layout a user may bring (diffusers' own, the original releases), how to
recognise it (`signature`: keys only it has, a key written `{key: rank}` where another class has it at another
rank), how it is packed (`container`), `rules` renaming its keys to diffusers' keys (none: the keys are diffusers'
already), `drop` rules for tensors that are no model weights, `filled`: counts a format's files may lack, filled
with the value diffusers' loader gives them, and `config_tensors`: tensors that hold what diffusers keeps as config
fields. The target rules then apply to the renamed keys, so one set of target
rules serves every format.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.resources
import re
import string
from pathlib import Path

import numpy as np
import yaml

from converter.errors import MappingError
from converter.models.common.config import shown

# The fields each part of a mapping file may have (docs/mapping-format.md documents each; a test keeps the two equal)
TOP_FIELDS = {"family", "patterns", "lookups", "rule_sets", "targets", "source_formats"}
RULE_FIELDS = {
    "name", "match", "to", "lookup", "index", "transpose", "squeeze", "reshape", "reorder", "split", "weight_norm",
}  # fmt: skip
DROP_FIELDS = {"name", "match"}
USE_FIELDS = {"use"}  # a list entry standing for a rule set
FORMAT_FIELDS = {
    "about",
    "model",
    "pairings",
    "signature",
    "container",
    "prefix",
    "config",
    "lookups",
    "rules",
    "drop",
    "filled",
    "config_tensors",
}
INT64 = (-(2**63), 2**63 - 1)  # the range of a count diffusers keeps (a filled value must fit it)
CONFIG_SOURCES = ("metadata", "folder")  # where a format's files keep their config (`config:`), besides none
CONTAINER_FIELDS = {"wrapper", "optional"}
LAYOUT_OPS = ("transpose", "squeeze", "reshape", "reorder")
REORDER_FIELDS = {"axis", "order"}
SPLIT_FIELDS = {"axis", "parts", "groups"}
WEIGHT_NORM_PARTS = ("g", "v")  # torch's weight_g and weight_v
MAPPINGS_DIR = Path(str(importlib.resources.files("converter.mappings")))


_INDEX_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
MAX_EXPRESSION = 120  # characters: an index expression is a short formula


@dataclasses.dataclass(frozen=True)
class IndexExpression:
    """An integer formula of a rule's group and the config's fields: integers, names, `len(field)` of a list field,
    + - * and parentheses. Parsed and checked when the mapping is read; computed for each key."""

    text: str
    tree: ast.expr

    @classmethod
    def parse(cls, where: str, text) -> IndexExpression:
        if not isinstance(text, str) or len(text) > MAX_EXPRESSION:
            raise MappingError(f"{where}: an index expression is a formula of at most {MAX_EXPRESSION} characters")
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError:
            raise MappingError(f"{where}: index expression {shown(text)} is not a formula") from None
        for node in ast.walk(tree):
            allowed = (
                isinstance(node, (ast.BinOp, ast.Name, ast.Load, ast.USub, *_INDEX_OPS))
                or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub))
                or (isinstance(node, ast.Constant) and type(node.value) is int)
                or (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "len"
                    and len(node.args) == 1
                    and isinstance(node.args[0], ast.Name)
                    and not node.keywords
                )
            )
            if not allowed or (isinstance(node, ast.BinOp) and type(node.op) not in _INDEX_OPS):
                raise MappingError(
                    f"{where}: index expression {shown(text)} may hold integers, names, len(name), + - * and "
                    "parentheses only"
                )
        return cls(text, tree)

    def value(self, index: str, group: str, config: dict | None) -> int:
        if not index.isascii() or not index.isdigit():
            raise LookupError(f"{group} {index!r} is not a number for index expression {self.text!r}")
        if config is None:
            raise LookupError(f"index expression {self.text!r} needs the config")
        value = self._eval(self.tree, {**config, group: int(index)})
        if value < 0:
            raise LookupError(f"index expression {self.text!r} gives {value} for {group} {index}")
        return value

    def of_config(self, config: dict | None) -> int:
        """The expression's value where it names config fields only (a split's `groups`), at least 1."""
        if config is None:
            raise LookupError(f"expression {self.text!r} needs the config")
        value = self._eval(self.tree, config)
        if value < 1:
            raise LookupError(f"expression {self.text!r} gives {value}, not a count")
        return value

    def _eval(self, node, names: dict) -> int:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp):
            return -self._eval(node.operand, names)
        if isinstance(node, ast.BinOp):
            return _INDEX_OPS[type(node.op)](self._eval(node.left, names), self._eval(node.right, names))
        name = node.args[0].id if isinstance(node, ast.Call) else node.id
        value = names.get(name)
        if isinstance(node, ast.Call):
            if not isinstance(value, (list, tuple)):
                raise LookupError(f"index expression {self.text!r}: the config's {name} is not a list")
            return len(value)
        if type(value) is not int:
            raise LookupError(f"index expression {self.text!r}: the config has no whole number {name}")
        return value


@dataclasses.dataclass(frozen=True)
class Split:
    """One source tensor split along `axis` into a tensor per named part: the axis holds `groups` groups (heads), each
    one block per part in the order of `parts`; a part's tensor is its block of every group, in group order."""

    axis: int
    parts: tuple[str, ...]
    groups: IndexExpression | None  # None: one group (the parts are contiguous thirds, halves...)


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity (lookup tables are dicts)
class Rule:
    name: str
    pattern: re.Pattern
    to: str
    ops: tuple[tuple[str, tuple[int, ...]], ...]
    where: str  # file:line, for messages
    lookups: tuple[tuple[str, str, dict[str, str]], ...] = ()  # (group, table name, table)
    indices: tuple[tuple[str, IndexExpression], ...] = ()  # (group, expression of it and the config)
    rule_set: str | None = None  # the `rule_sets` entry it came from
    split: Split | None = None  # one source tensor becomes one per part
    weight_norm: int | None = None  # the dim of torch's weight norm a folded weight is taken apart by (g, v)

    @property
    def shown_name(self) -> str:
        """Its name in reports: `set/name` for a rule of a rule set."""
        return f"{self.rule_set}/{self.name}" if self.rule_set else self.name

    def targets(self, match: re.Match, config: dict | None = None) -> list[tuple[str, tuple]]:
        """(key, ops) for each tensor the matched one becomes: the filled `to` and the rule's layout changes; for a
        split, per part, `{part}` filled and the part taken last; for a folded weight norm, its g (the norm) and v."""
        if self.weight_norm is not None:
            g, v = WEIGHT_NORM_PARTS
            return [
                (self.target_key(match, config, part=g), self.ops + (("norm", (self.weight_norm,)),)),
                (self.target_key(match, config, part=v), self.ops),
            ]
        if self.split is None:
            return [(self.target_key(match, config), self.ops)]
        groups = 1 if self.split.groups is None else self.split.groups.of_config(config)
        count = len(self.split.parts)
        return [
            (self.target_key(match, config, part=name), self.ops + (("take", (self.split.axis, count, groups, i)),))
            for i, name in enumerate(self.split.parts)
        ]

    def target_key(self, match: re.Match, config: dict | None = None, **extra) -> str:
        """The filled `to` template, index expressions computed with `config` (the config.json fields); raises
        LookupError when a looked-up index is not in its table or an expression cannot be computed."""
        named = match.groupdict()
        for group, table_name, table in self.lookups:
            if named[group] not in table:
                raise LookupError(f"{group} {named[group]} is not in lookup {table_name!r} ({', '.join(table)})")
            named[group] = table[named[group]]
        for group, expression in self.indices:
            named[group] = str(expression.value(named[group], group, config))
        return self.to.format(match.group(0), *match.groups(), **named, **extra)


@dataclasses.dataclass(frozen=True)
class SourceFormat:
    """A checkpoint layout users bring: how to recognise it, how it is packed, how its keys become diffusers'."""

    name: str
    about: str
    model: str | None  # the registry model whose VAE the format's files hold (None: any model of the family)
    pairings: str | None  # the file (in a pairings folder) listing every key with its diffusers key
    signature: tuple[str, ...]  # keys every file of this format has, and no other format's files
    signature_ranks: dict  # signature key -> the rank its tensor has in this format, where the signature says one
    wrapper: str | None  # the key of the dict the tensors are kept under (`state_dict`), None: at the top level
    rules: tuple[Rule, ...]  # source key -> diffusers key; empty: the keys are diffusers' already
    drops: tuple[Rule, ...]  # tensors that are no model weights
    where: str
    # where the files keep their config: "metadata" (the safetensors header's, which the family's spec translates);
    # None: the model's config applies
    config_from: str | None = None
    wrapper_optional: bool = False  # the files keep their tensors under `wrapper` or at the top level (safetensors)
    # diffusers keys of counts the files may lack -> the value diffusers' loader gives them (BatchNorm's count of
    # batches: PyTorch loads a file without it as 0)
    filled: dict = dataclasses.field(default_factory=dict)
    # the files keep the model's keys under this prefix, beside other models' keys: the rules read the keys under it
    # (without it), the drop rules the others
    prefix: str = ""
    # config field -> the key of the tensor that holds it (ComfyUI's MiniMax-H3 files keep latents_mean and
    # latents_std as buffers, where diffusers keeps them in config.json): read by the conversion, no model key
    config_tensors: dict = dataclasses.field(default_factory=dict)

    def candidates(self, key: str) -> tuple[str, tuple[Rule, ...]]:
        """The name the rules see a key by, and the rules (or drop rules) that may take it."""
        if not self.prefix:
            return key, self.rules + self.drops
        if key.startswith(self.prefix):
            return key[len(self.prefix) :], self.rules
        return key, self.drops

    def packs(self, wrapper: str | None) -> bool:
        """Whether files of this format keep their tensors as one does under `wrapper` (None: at the top level)."""
        return wrapper == self.wrapper or (self.wrapper_optional and wrapper is None)

    @property
    def renames(self) -> bool:
        return bool(self.rules)

    def fits(self, shapes: dict) -> bool:
        """Whether a checkpoint ({key: shape}) has every signature key, each of the rank the signature gives."""
        return not self.unfit_signature(shapes)

    def unfit_signature(self, shapes: dict) -> list[str]:
        """The signature keys the checkpoint lacks or holds at another rank."""
        ranks = self.signature_ranks
        return [k for k in self.signature if k not in shapes or len(shapes[k]) != ranks.get(k, len(shapes[k]))]


@dataclasses.dataclass(frozen=True)
class Mapping:
    families: tuple[str, ...]  # the registry families whose checkpoints it maps (classes of one architecture)
    path: Path
    targets: dict[str, tuple[Rule, ...]]
    formats: dict[str, SourceFormat] = dataclasses.field(default_factory=dict)

    def rules(self, target: str) -> tuple[Rule, ...]:
        if target not in self.targets:
            raise MappingError(f"{self.path}: no section for target {target!r} (has: {', '.join(self.targets)})")
        return self.targets[target]


# libyaml's parser where PyYAML was built with it (its wheels are): a conversion reads every mapping file, which
# PyYAML's own parser takes 0.12 s of a conversion's run to parse, libyaml's under 0.01 s
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LineLoader(_SafeLoader):
    """Records the line of every mapping so errors can name file:line, and refuses YAML's merge keys (and, with
    _refuse_aliases, its aliases): what the file shares, it shares by name (`rule_sets`, file-wide `lookups`), so each
    format reads as it is."""

    def construct_mapping(self, node, deep=False):
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping

    def flatten_mapping(self, node):
        for key, _ in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                raise MappingError(
                    f"{self.name}:{key.start_mark.line + 1}: a YAML merge key (<<); share lookups at the file's top "
                    "level instead"
                )
        super().flatten_mapping(node)


def _refuse_aliases(text: str, path: Path) -> None:
    for event in yaml.parse(text, Loader=_SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise MappingError(
                f"{path}:{event.start_mark.line + 1}: a YAML alias; share rules by name (rule_sets and `- use: NAME`) "
                "or lookups at the file's top level"
            )


def load_mapping(path: str | Path) -> Mapping:
    path = Path(path)
    try:
        text = path.read_text()
        _refuse_aliases(text, path)
        loader = _LineLoader(text)
        loader.name = str(path)
        try:
            doc = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        raise MappingError(f"{path}:{mark.line + 1}: YAML syntax error: {e.problem}") from None
    except OSError as e:
        raise MappingError(f"{path}: cannot read mapping file ({e.strerror})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("targets"), dict) or "family" not in doc:
        raise MappingError(f"{path}:1: a mapping file needs 'family' and a 'targets' section")
    unknown = set(doc) - TOP_FIELDS - {"__line__"}
    if unknown:
        raise MappingError(f"{path}:{doc['__line__']}: unknown top-level field(s): {', '.join(sorted(unknown))}")
    patterns = _patterns(path, doc.get("patterns", {}))
    shared = _Shared(path, patterns, _tables(f"{path}:{doc['__line__']}", doc.get("lookups", {})), doc)
    targets = {}
    for target, rules in doc["targets"].items():
        if target == "__line__":
            continue
        if not isinstance(rules, list):
            raise MappingError(f"{path}:{doc['targets']['__line__']}: target {target!r} must be a list of rules")
        targets[target] = shared.rules(rules, f"target {target!r}")
    raw_formats = doc.get("source_formats", {"__line__": doc["__line__"]})
    if not isinstance(raw_formats, dict):
        raise MappingError(f"{path}:{doc['__line__']}: 'source_formats' must map format names to their sections")
    formats = {name: _parse_format(shared, name, raw) for name, raw in raw_formats.items() if name != "__line__"}
    families = doc["family"] if isinstance(doc["family"], list) else [doc["family"]]
    if not families or not all(isinstance(f, str) for f in families):
        raise MappingError(f"{path}:{doc['__line__']}: 'family' must name a family, or list several")
    return Mapping(families=tuple(families), path=path, targets=targets, formats=formats)


class _Shared:
    """What a file declares once for its rules: patterns, file-wide lookup tables, rule sets (parsed on first use,
    each once, so check-mappings counts a set's hits across the formats that use it)."""

    def __init__(self, path: Path, patterns: dict, tables: dict, doc: dict):
        self.path, self.patterns, self.tables = path, patterns, tables
        raw_sets = doc.get("rule_sets", {})
        if not isinstance(raw_sets, dict) or not all(
            isinstance(v, list) for k, v in raw_sets.items() if k != "__line__"
        ):
            raise MappingError(f"{path}:{doc['__line__']}: 'rule_sets' maps set names to lists of rules")
        self.raw_sets = {k: v for k, v in raw_sets.items() if k != "__line__"}
        self.parsed_sets: dict[tuple, tuple[Rule, ...]] = {}

    def rules(self, raw, what: str, tables: dict | None = None, fields=RULE_FIELDS) -> tuple[Rule, ...]:
        """A list of rules, where an entry `{use: NAME}` stands for the rule set of that name."""
        if not isinstance(raw, list):
            raise MappingError(f"{self.path}: {what} must be a list of rules")
        out = []
        for entry in raw:
            if isinstance(entry, dict) and set(entry) - {"__line__"} == USE_FIELDS:
                out += self._set(entry, tables, fields)
            else:
                out.append(_parse_rule(self.path, entry, self.patterns, tables, fields))
        return tuple(out)

    def _set(self, entry: dict, tables, fields) -> tuple[Rule, ...]:
        name, where = entry["use"], f"{self.path}:{entry['__line__']}"
        if not isinstance(name, str) or name not in self.raw_sets:
            raise MappingError(
                f"{where}: 'use' names {shown(name)}, not a rule set (declared: {', '.join(self.raw_sets) or 'none'})"
            )
        key = (name, id(tables), fields is DROP_FIELDS)
        if key not in self.parsed_sets:
            rules = []
            for raw in self.raw_sets[name]:
                if isinstance(raw, dict) and "use" in raw:
                    raise MappingError(f"{where}: rule set {name!r} uses another set; sets hold rules only")
                rule = _parse_rule(self.path, raw, self.patterns, tables, fields)
                rules.append(dataclasses.replace(rule, rule_set=name))
            self.parsed_sets[key] = tuple(rules)
        return self.parsed_sets[key]


def _tables(where: str, lookups) -> dict[str, dict[str, str]]:
    """Lookup tables, `{table: {index: replacement}}`."""
    if not isinstance(lookups, dict) or not all(isinstance(t, dict) for k, t in lookups.items() if k != "__line__"):
        raise MappingError(f"{where}: 'lookups' must map table names to tables (index: replacement)")
    return {
        table: {str(k): str(v) for k, v in entries.items() if k != "__line__"}
        for table, entries in lookups.items()
        if table != "__line__"
    }


def _parse_format(shared: _Shared, name: str, raw) -> SourceFormat:
    path = shared.path
    if not isinstance(raw, dict):
        raise MappingError(f"{path}: source format {name!r} must be a mapping")
    where = f"{path}:{raw['__line__']}"
    unknown = set(raw) - FORMAT_FIELDS - {"__line__"}
    if unknown:
        raise MappingError(
            f"{where}: unknown field(s) of source format {name!r}: {', '.join(sorted(unknown))} "
            f"(allowed: {', '.join(sorted(FORMAT_FIELDS))})"
        )
    signature, signature_ranks = _signature(where, name, raw.get("signature"))
    container = raw.get("container", {"__line__": raw["__line__"]})
    if not isinstance(container, dict) or set(container) - CONTAINER_FIELDS - {"__line__"}:
        raise MappingError(
            f"{where}: 'container' takes only 'wrapper' (the key the tensors are kept under) and 'optional' (true: or "
            "at the top level)"
        )
    if not isinstance(container.get("optional", False), bool):
        raise MappingError(f"{where}: the container's 'optional' is true or false, got {shown(container['optional'])}")
    own = _tables(where, raw.get("lookups", {}))
    clash = sorted(own.keys() & shared.tables.keys())
    if clash:
        raise MappingError(f"{where}: lookup table(s) {', '.join(clash)} already declared at the file's top level")
    tables = {**shared.tables, **own} if own else shared.tables
    rules = shared.rules(raw.get("rules", []), f"the rules of source format {name!r}", tables)
    drops = shared.rules(raw.get("drop", []), f"the drop rules of source format {name!r}", fields=DROP_FIELDS)
    model, pairings = raw.get("model"), raw.get("pairings")
    if model is not None and not isinstance(model, str):
        raise MappingError(f"{where}: 'model' of source format {name!r} is {shown(model)}, not a model name")
    if pairings is not None and (not isinstance(pairings, str) or Path(pairings).name != pairings):
        raise MappingError(f"{where}: 'pairings' of source format {name!r} must be a file name, got {shown(pairings)}")
    filled = raw.get("filled", {})
    if not isinstance(filled, dict) or not all(
        type(v) is int and INT64[0] <= v <= INT64[1] for k, v in filled.items() if k != "__line__"
    ):
        raise MappingError(
            f"{where}: 'filled' of source format {name!r} maps diffusers keys of counts to whole numbers within int64"
        )
    config = raw.get("config")
    if config is not None and config not in CONFIG_SOURCES:
        raise MappingError(f"{where}: 'config' of source format {name!r} must be one of {list(CONFIG_SOURCES)}")
    prefix = raw.get("prefix", "")
    if not isinstance(prefix, str):
        raise MappingError(f"{where}: 'prefix' of source format {name!r} is a string, got {shown(prefix)}")
    config_tensors = raw.get("config_tensors", {})
    if not isinstance(config_tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in config_tensors.items() if k != "__line__"
    ):
        raise MappingError(f"{where}: 'config_tensors' of source format {name!r} maps config fields to tensor keys")
    return SourceFormat(
        name=name,
        about=str(raw.get("about", name)),
        model=model,
        pairings=pairings,
        signature=signature,
        signature_ranks=signature_ranks,
        wrapper=container.get("wrapper"),
        wrapper_optional=container.get("optional", False),
        rules=rules,
        drops=drops,
        where=where,
        config_from=config,
        filled={str(k): v for k, v in filled.items() if k != "__line__"},
        prefix=prefix,
        config_tensors={k: v for k, v in config_tensors.items() if k != "__line__"},
    )


def _signature(where: str, name: str, raw) -> tuple[tuple[str, ...], dict[str, int]]:
    """A signature's keys, and the ranks of those written `{key: rank}`."""
    entries = [
        {k: v for k, v in e.items() if k != "__line__"} if isinstance(e, dict) else e
        for e in (raw if isinstance(raw, list) else [])
    ]
    ranked = {k: v for e in entries if isinstance(e, dict) and len(e) == 1 for k, v in e.items()}
    well_formed = all(isinstance(e, str) or (isinstance(e, dict) and len(e) == 1) for e in entries) and all(
        isinstance(k, str) and _is_int(v) and 0 < v <= 8 for k, v in ranked.items()
    )
    if not entries or not well_formed:
        raise MappingError(
            f"{where}: source format {name!r} needs a 'signature': a list of keys only it has (a key or {{key: rank}})"
        )
    return tuple(e if isinstance(e, str) else next(iter(e)) for e in entries), ranked


def _patterns(path: Path, raw) -> dict[str, str]:
    """The file's named regex pieces: `patterns: {name: regex}`, used in rules as {name}."""
    if not isinstance(raw, dict) or not all(isinstance(v, str) for k, v in raw.items() if k != "__line__"):
        raise MappingError(f"{path}: 'patterns' must map names to regex strings")
    return {k: v for k, v in raw.items() if k != "__line__"}


def _expand(where: str, regex: str, patterns: dict[str, str]) -> str:
    """Replaces each {name} of a rule's regex by the named pattern. A regex quantifier starts with a digit or a
    comma, so {name} (a letter or underscore first, then digits too) cannot be one."""

    def piece(match: re.Match) -> str:
        if match.group(1) not in patterns:
            raise MappingError(f"{where}: unknown pattern {{{match.group(1)}}} (defined: {', '.join(patterns)})")
        return f"(?:{patterns[match.group(1)]})"

    return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", piece, regex)


def _parse_rule(path: Path, raw, patterns: dict[str, str], tables=None, fields=RULE_FIELDS) -> Rule:
    """A rule (or, with fields=DROP_FIELDS, a drop rule: a name and a match). YAML aliases share one dict between
    formats, so `raw` is read, never changed."""
    if not isinstance(raw, dict):
        raise MappingError(f"{path}: a rule must be a mapping with 'match' and 'to', got {shown(raw)}")
    where = f"{path}:{raw['__line__']}"
    raw = {k: v for k, v in raw.items() if k != "__line__"}
    unknown = set(raw) - fields
    if unknown:
        raise MappingError(
            f"{where}: unknown rule field(s): {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(fields))})"
        )
    if fields is DROP_FIELDS:
        raw["to"] = ""
    if not isinstance(raw.get("match"), str) or not isinstance(raw.get("to"), str):
        raise MappingError(
            f"{where}: a rule needs string fields {'match' if fields is DROP_FIELDS else 'match and to'}"
        )
    try:
        pattern = re.compile(_expand(where, raw["match"], patterns))
    except re.error as e:
        raise MappingError(f"{where}: bad regex {raw['match']!r}: {e}") from None
    split = _split(where, raw.get("split"), tables)
    weight_norm = _weight_norm(where, raw.get("weight_norm"), tables, split)
    _check_template(where, raw["to"], pattern, split is not None or weight_norm is not None)
    lookups = _lookups(where, raw.get("lookup", {}), pattern, tables)
    indices = _indices(where, raw.get("index", {}), pattern, None if tables is None else {g for g, _, _ in lookups})
    ops = []
    for op in (k for k in raw if k in LAYOUT_OPS):
        value = _reorder(where, raw[op]) if op == "reorder" else raw[op]
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            raise MappingError(f"{where}: {op} takes a list of integers, got {shown(value)}")
        ops.append((op, tuple(value)))
    name = raw.get("name", raw["match"])
    if not isinstance(name, str):
        raise MappingError(f"{where}: a rule's 'name' must be a string, got {shown(name)}")
    return Rule(
        name=name, pattern=pattern, to=raw["to"], ops=tuple(ops), where=where, lookups=lookups, indices=indices,
        split=split, weight_norm=weight_norm,
    )  # fmt: skip


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reorder(where: str, raw) -> list[int]:
    """`reorder: {axis, order}` as the op's integers: [axis, *order]."""
    if not isinstance(raw, dict) or set(raw) - {"__line__"} != REORDER_FIELDS:
        raise MappingError(f"{where}: reorder takes {{axis: A, order: [...]}}: axis A as len(order) equal blocks")
    order = raw["order"]
    if not _is_int(raw["axis"]) or not isinstance(order, list) or sorted(order) != list(range(len(order))):
        raise MappingError(f"{where}: reorder's order must be a permutation of 0..n-1, got {shown(order)}")
    return [raw["axis"], *order]


def _split(where: str, raw, tables) -> Split | None:
    if raw is None:
        return None
    if tables is None:
        raise MappingError(f"{where}: 'split' belongs to source-format rules (a fused tensor of a release)")
    if not isinstance(raw, dict) or not {"axis", "parts"} <= set(raw) - {"__line__"} <= SPLIT_FIELDS:
        raise MappingError(f"{where}: split takes {{axis: A, parts: [names], groups: expression (optional)}}")
    parts = raw["parts"]
    if (
        not _is_int(raw["axis"])
        or not isinstance(parts, list)
        or len(parts) < 2
        or len(set(parts)) != len(parts)
        or not all(isinstance(p, str) and re.fullmatch(r"[A-Za-z0-9_]+", p) for p in parts)
    ):
        raise MappingError(f"{where}: split's parts are two or more distinct names, got {shown(parts)}")
    groups = IndexExpression.parse(where, raw["groups"]) if "groups" in raw else None
    return Split(raw["axis"], tuple(parts), groups)


def _weight_norm(where: str, raw, tables, split: Split | None) -> int | None:
    if raw is None:
        return None
    if tables is None or split is not None:
        raise MappingError(f"{where}: 'weight_norm' belongs to source-format rules, and a rule splits one way only")
    if not isinstance(raw, dict) or set(raw) - {"__line__"} != {"dim"} or not _is_int(raw["dim"]):
        raise MappingError(f"{where}: weight_norm takes {{dim: D}}, the dim torch's weight_norm keeps (its default 0)")
    return raw["dim"]


def _check_template(where: str, template: str, pattern: re.Pattern, parts: bool = False):
    """A `to` template names the match's groups, `{1}` or `{name}`, and nothing else (a split's or a folded weight
    norm's, `{part}` too, which it must): it is filled by str.format, which would also run a format spec
    (`{1:>99999999}`) or reach attributes (`{1.__class__}`)."""
    try:
        parsed = [(field, spec, conversion) for _, field, spec, conversion in string.Formatter().parse(template)]
    except ValueError as e:
        raise MappingError(f"{where}: bad 'to' template {shown(template)}: {e}") from None
    fields = [(field, spec, conversion) for field, spec, conversion in parsed if field is not None]
    if parts and "part" not in [field for field, _, _ in fields]:
        raise MappingError(f"{where}: a split's 'to' names {{part}}, the part each tensor is")
    for field, _, _ in fields:
        if parts and field == "part":
            continue
        if not (field.isdigit() and int(field) <= pattern.groups or field in pattern.groupindex):
            raise MappingError(
                f"{where}: 'to' names {{{field}}}: a template takes the match's groups only, {{0}} to "
                f"{{{pattern.groups}}} or a named group"
            )
    if any(spec or conversion for _, spec, conversion in fields):
        raise MappingError(
            f"{where}: 'to' template {shown(template)} has a format spec or conversion; write groups bare"
        )


def _lookups(where: str, raw, pattern: re.Pattern, tables) -> tuple:
    if not raw:
        return ()
    if tables is None:
        raise MappingError(f"{where}: 'lookup' belongs to source-format rules, which the file's tables serve")
    if not isinstance(raw, dict):
        raise MappingError(f"{where}: 'lookup' maps a named group of the match to a table name")
    out = []
    for group, table in ((g, t) for g, t in raw.items() if g != "__line__"):
        if group not in pattern.groupindex:
            raise MappingError(
                f"{where}: lookup names group {group!r}, which the match does not define as (?P<{group}>...)"
            )
        if table not in tables:
            raise MappingError(f"{where}: unknown lookup table {table!r} (declared: {', '.join(tables) or 'none'})")
        out.append((group, table, tables[table]))
    return tuple(out)


def _indices(where: str, raw, pattern: re.Pattern, looked_up: set[str] | None) -> tuple:
    if not raw:
        return ()
    if not isinstance(raw, dict):
        raise MappingError(f"{where}: 'index' maps a named group of the match to an index expression")
    if looked_up is None:
        raise MappingError(f"{where}: 'index' belongs to source-format rules, which rename with the config")
    out = []
    for group, text in ((g, x) for g, x in raw.items() if g != "__line__"):
        if group not in pattern.groupindex or group in looked_up:
            raise MappingError(
                f"{where}: index names group {group!r}, which the match does not define as (?P<{group}>...) or a "
                "lookup already replaces"
            )
        out.append((group, IndexExpression.parse(where, text)))
    return tuple(out)


def transformed_shape(ops, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape `apply_ops` gives, computed without data; raises ValueError when an op cannot apply."""
    for op, arg in ops:
        if op == "transpose":
            if sorted(arg) != list(range(len(shape))):
                raise ValueError(f"transpose {list(arg)} does not fit a {len(shape)}-d tensor")
            shape = tuple(shape[i] for i in arg)
        elif op == "squeeze":
            if any(not -len(shape) <= a < len(shape) or shape[a] != 1 for a in arg):
                raise ValueError(f"squeeze {list(arg)} needs size-1 axes, shape is {list(shape)}")
            drop = {a % len(shape) for a in arg}
            shape = tuple(d for i, d in enumerate(shape) if i not in drop)
        elif op == "reorder":
            axis, blocks = arg[0], len(arg) - 1
            if not -len(shape) <= axis < len(shape) or shape[axis] % blocks:
                raise ValueError(f"reorder of {blocks} blocks along axis {axis} does not fit shape {list(shape)}")
        elif op == "take":
            axis, count, groups, _ = arg
            if not -len(shape) <= axis < len(shape) or shape[axis] % (count * groups):
                raise ValueError(
                    f"split into {count} parts of {groups} group(s) along axis {axis} does not fit shape {list(shape)}"
                )
            shape = tuple(d // count if i == axis % len(shape) else d for i, d in enumerate(shape))
        elif op == "norm":
            if not -len(shape) <= arg[0] < len(shape):
                raise ValueError(f"a weight norm over dim {arg[0]} does not fit shape {list(shape)}")
            shape = tuple(d if i == arg[0] % len(shape) else 1 for i, d in enumerate(shape))
        else:
            shape = _reshaped(shape, arg)
    return shape


def _reshaped(shape, arg):
    size = int(np.prod(shape))
    known = int(np.prod([d for d in arg if d != -1]))
    if arg.count(-1) > 1 or (arg.count(-1) == 0 and known != size) or (known == 0 or size % known):
        raise ValueError(f"reshape {list(arg)} does not fit shape {list(shape)}")
    return tuple(size // known if d == -1 else d for d in arg)


def apply_ops(ops, array: np.ndarray) -> np.ndarray:
    for op, arg in ops:
        if op == "transpose":
            array = array.transpose(arg)
        elif op == "squeeze":
            array = array.squeeze(arg)
        elif op == "reorder":
            blocks = np.split(array, len(arg) - 1, axis=arg[0])
            array = np.concatenate([blocks[i] for i in arg[1:]], axis=arg[0])
        elif op == "take":
            axis, count, groups, part = arg
            axis %= array.ndim
            grouped = array.reshape(*array.shape[:axis], groups, count, -1, *array.shape[axis + 1 :])
            array = grouped[(slice(None),) * (axis + 1) + (part,)]
            array = array.reshape(*array.shape[:axis], -1, *array.shape[axis + 2 :])
        elif op == "norm":  # torch's norm_except_dim, in float32 at least (bfloat16 and float16 files)
            others = tuple(i for i in range(array.ndim) if i != arg[0] % array.ndim)
            wide = array.astype(np.float64 if array.dtype == np.float64 else np.float32)
            array = np.sqrt(np.sum(wide * wide, axis=others, keepdims=True)).astype(array.dtype)
        else:
            array = array.reshape(arg)
    return array


def inverse_ops(ops, source_shape: tuple[int, ...]) -> tuple:
    """The ops that take `apply_ops(ops, x)` back to x, for x of `source_shape` (export runs the rules backwards): a
    transpose inverts to the inverse permutation, a squeeze or reshape to a reshape to the shape before it, in
    reverse order. Raises ValueError for an op with no inverse or ops that do not fit the shape."""
    shapes = [tuple(source_shape)]
    for op in ops:
        shapes.append(transformed_shape([op], shapes[-1]))
    inverse = []
    for (op, arg), before in zip(reversed(ops), reversed(shapes[:-1])):
        if op == "transpose":
            inverse.append(("transpose", tuple(int(i) for i in np.argsort(arg))))
        elif op in ("squeeze", "reshape"):
            inverse.append(("reshape", before))
        elif op == "reorder":
            inverse.append(("reorder", (arg[0], *(int(i) for i in np.argsort(arg[1:])))))
        else:
            raise ValueError(f"{op} cannot be inverted")
    return tuple(inverse)


@dataclasses.dataclass(frozen=True)
class Assignment:
    source_key: str
    target_key: str
    rule: Rule
    ops: tuple  # the layout changes from the source tensor to the target's: the rule's, and a split's part
    part: int = 0  # which of a split rule's parts


@dataclasses.dataclass
class Match:
    """The outcome of applying rules to a key set: what pairs up, what does not, and how often each rule hit.
    `conflicts` are faults of the rules themselves (a key two rules take); `twice`, leaves two keys fill (two
    spellings of one key in a file, or rules that rename two keys alike); `unfit` are keys and leaves that find no
    partner, shape mismatches and unknown indices: for a source format, a file that is not of that format."""

    assignments: list[Assignment]
    conflicts: list[str]
    twice: list[str]
    unfit: list[str]
    hits: dict[Rule, int]
    dropped: dict[str, Rule] = dataclasses.field(default_factory=dict)  # source key -> the drop rule that took it

    @property
    def problems(self) -> list[str]:
        return self.conflicts + self.twice + self.unfit


def match_keys(mapping: Mapping, target: str, source: dict[str, tuple], target_shapes: dict[str, tuple]) -> Match:
    """A target section's rules applied to diffusers-named source keys, against the target model's leaves."""
    return match_rules(mapping.rules(target), (), source, target_shapes, f"{mapping.path.name} [{target}]", target)


def rename_keys(
    mapping: Mapping, fmt: SourceFormat, source: dict[str, tuple], diffusers: dict[str, tuple], config: dict
) -> Match:
    """A source format's rules applied to a file's keys, against diffusers' keys and shapes for `config` (its
    config.json fields, which index expressions read); a count the format fills is not asked of a file that lacks
    it."""
    filled = filled_counts(fmt, source, diffusers, config)
    expected = {k: shape for k, shape in diffusers.items() if k not in filled}
    section = f"{mapping.path.name} [{fmt.name}]"
    source = {k: shape for k, shape in source.items() if k not in fmt.config_tensors.values()}
    return match_rules(fmt.rules, fmt.drops, source, expected, section, "diffusers", config, fmt.candidates)


def filled_counts(fmt: SourceFormat, source: dict[str, tuple], diffusers: dict, config: dict) -> dict[str, int]:
    """The format's `filled` counts that diffusers' model has and the file's keys do not give, with their values."""
    supplied = renamed_shapes(fmt, source, config) if fmt.filled else {}
    return {k: v for k, v in fmt.filled.items() if k in diffusers and k not in supplied}


def renamed_shapes(fmt: SourceFormat, source: dict[str, tuple], config: dict) -> dict[str, tuple]:
    """The diffusers keys and shapes a format's rules make of a file's keys with `config`, unchecked: what config
    inference reads before the file's own config is known (`config` is then the named model's). A key no rule, or
    several, take is left out (planning names it)."""
    if not fmt.renames:
        return dict(source)
    out = {}
    for key, shape in source.items():
        name, rules = fmt.candidates(key)
        found = [(rule, m) for rule in rules if rule not in fmt.drops and (m := rule.pattern.fullmatch(name))]
        if len(found) == 1:
            rule, match = found[0]
            try:
                out.update((k, transformed_shape(ops, tuple(shape))) for k, ops in rule.targets(match, config))
            except (LookupError, ValueError):
                continue
    return out


def match_rules(
    rules,
    drops,
    source: dict[str, tuple],
    target_shapes: dict[str, tuple],
    section: str,
    receiver: str,
    config=None,
    candidates=None,
):
    """Pairs `source` keys with `target_shapes` keys by the rules; `candidates(key)` gives the name a key is matched by
    and the rules that may take it (a format's prefix), by default the key and every rule."""
    conflicts, twice, unfit, assignments, filled_by, dropped = [], [], [], [], {}, {}
    hits = dict.fromkeys((*rules, *drops), 0)
    candidates = candidates or (lambda key: (key, (*rules, *drops)))
    for key in source:
        name, possible = candidates(key)
        found = [(rule, m) for rule in possible if (m := rule.pattern.fullmatch(name))]
        for rule, _ in found:
            hits[rule] += 1
        if not found:
            unfit.append(f"source key {key!r} is matched by no rule of {section}")
            continue
        if len(found) > 1:
            names = "; ".join(f"{'drop rule ' if r in drops else ''}{r.shown_name} ({r.where})" for r, _ in found)
            what = "a drop rule would swallow" if any(r in drops for r, _ in found) else "ambiguous"
            conflicts.append(f"source key {key!r} is matched by {len(found)} rules ({what}): {names}")
            continue
        rule, match = found[0]
        if rule in drops:
            dropped[key] = rule
            continue
        try:
            produced = rule.targets(match, config)
        except LookupError as e:
            unfit.append(f"source key {key!r}: {e.args[0]} ({rule.where})")
            continue
        for part, (target_key, ops) in enumerate(produced):
            if target_key not in target_shapes:
                unfit.append(
                    f"source key {key!r} maps to {target_key!r} ({rule.where}), which the {receiver} model does not "
                    "have"
                )
                continue
            if target_key in filled_by:
                twice.append(
                    f"{'diffusers key' if receiver == 'diffusers' else 'target leaf'} {target_key!r} is filled twice: "
                    f"from {filled_by[target_key]!r} and {key!r} ({rule.where})"
                )
                continue
            filled_by[target_key] = key
            try:
                got = transformed_shape(ops, tuple(source[key]))
            except ValueError as e:
                unfit.append(f"source key {key!r}: {e} ({rule.where})")
                continue
            if got != tuple(target_shapes[target_key]):
                unfit.append(
                    f"shape mismatch for {key!r} -> {target_key!r}: expected {list(target_shapes[target_key])}"
                    f", got {list(got)} from source {list(source[key])} ({rule.where})"
                )
                continue
            assignments.append(Assignment(key, target_key, rule, ops, part))
    unfit += [
        f"{receiver} {'key' if receiver == 'diffusers' else 'leaf'} {k!r} is filled by no source key (missing from the "
        f"checkpoint?)"
        for k in target_shapes
        if k not in filled_by
    ]
    return Match(assignments, conflicts, twice, unfit, hits, dropped)


def summary(problems: list[str]) -> str:
    listed = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
    return f"{len(problems)} mapping problem(s): " + " | ".join(listed)


def plan(mapping: Mapping, target: str, source: dict[str, tuple], target_shapes: dict[str, tuple]) -> list[Assignment]:
    """Pairs every source key with its target leaf, or raises MappingError listing every problem found."""
    result = match_keys(mapping, target, source, target_shapes)
    if result.problems:
        raise MappingError(summary(result.problems))
    return result.assignments


def target_path(key: str) -> tuple:
    """'encoder.down_blocks.10.conv1.kernel' -> ('encoder', 'down_blocks', 10, 'conv1', 'kernel')."""
    return tuple(int(part) if part.isascii() and part.isdigit() else part for part in key.split("."))


def nested(flat: dict) -> dict:
    """{'a.0.b': x} -> {'a': {0: {'b': x}}}: the pure-dict layout of an NNX state, built by path, never by position."""
    tree = {}
    for key, value in flat.items():
        *parents, leaf = target_path(key)
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
