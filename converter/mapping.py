"""Mapping files and the strict planner that applies them.

A mapping file (mappings/<family>.yaml) has one section per target, each a list of rules, and may name regex pieces
once under `patterns` for rules to use as {name}. A rule is data:
  match:     a regex that must match the whole source key (it is anchored whatever it says)
  to:        the target key, a template filled from the match: {1}, {2}... or {name} for named groups
  transpose / squeeze / reshape: layout changes, applied in the order they are written in the rule

Target keys are dotted paths; a numeric part is a list index (Flax `nnx.List`), never a position in a sort.
`plan` checks everything that can be checked without data, both ways, before a byte is read or written:
each source key matched by exactly one rule, each target leaf filled exactly once, each shape right.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import re
from pathlib import Path

import numpy as np
import yaml

from converter.errors import MappingError

RULE_FIELDS = {"name", "match", "to", "transpose", "squeeze", "reshape"}
LAYOUT_OPS = ("transpose", "squeeze", "reshape")
MAPPINGS_DIR = Path(str(importlib.resources.files("converter.mappings")))


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern
    to: str
    ops: tuple[tuple[str, tuple[int, ...]], ...]
    where: str  # file:line, for messages

    def target_key(self, match: re.Match) -> str:
        return self.to.format(match.group(0), *match.groups(), **match.groupdict())


@dataclasses.dataclass(frozen=True)
class Mapping:
    family: str
    path: Path
    targets: dict[str, tuple[Rule, ...]]

    def rules(self, target: str) -> tuple[Rule, ...]:
        if target not in self.targets:
            raise MappingError(f"{self.path}: no section for target {target!r} (has: {', '.join(self.targets)})")
        return self.targets[target]


class _LineLoader(yaml.SafeLoader):
    """Records the line of every mapping so errors can name file:line."""

    def construct_mapping(self, node, deep=False):
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


def load_mapping(path: str | Path) -> Mapping:
    path = Path(path)
    try:
        doc = yaml.load(path.read_text(), Loader=_LineLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        raise MappingError(f"{path}:{mark.line + 1}: YAML syntax error: {e.problem}") from None
    except OSError as e:
        raise MappingError(f"{path}: cannot read mapping file ({e.strerror})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("targets"), dict) or "family" not in doc:
        raise MappingError(f"{path}:1: a mapping file needs 'family' and a 'targets' section")
    unknown = set(doc) - {"family", "patterns", "targets", "__line__"}
    if unknown:
        raise MappingError(f"{path}:{doc['__line__']}: unknown top-level field(s): {', '.join(sorted(unknown))}")
    patterns = _patterns(path, doc.get("patterns", {}))
    targets = {}
    for target, rules in doc["targets"].items():
        if target == "__line__":
            continue
        if not isinstance(rules, list):
            raise MappingError(f"{path}:{doc['targets']['__line__']}: target {target!r} must be a list of rules")
        targets[target] = tuple(_parse_rule(path, raw, patterns) for raw in rules)
    return Mapping(family=str(doc["family"]), path=path, targets=targets)


def _patterns(path: Path, raw) -> dict[str, str]:
    """The file's named regex pieces: `patterns: {name: regex}`, used in rules as {name}."""
    if not isinstance(raw, dict) or not all(isinstance(v, str) for k, v in raw.items() if k != "__line__"):
        raise MappingError(f"{path}: 'patterns' must map names to regex strings")
    return {k: v for k, v in raw.items() if k != "__line__"}


def _expand(where: str, regex: str, patterns: dict[str, str]) -> str:
    """Replaces each {name} of a rule's regex by the named pattern. A regex quantifier always holds digits, so
    {name} (letters and underscores) cannot be one."""

    def piece(match: re.Match) -> str:
        if match.group(1) not in patterns:
            raise MappingError(f"{where}: unknown pattern {{{match.group(1)}}} (defined: {', '.join(patterns)})")
        return f"(?:{patterns[match.group(1)]})"

    return re.sub(r"\{([A-Za-z_]+)\}", piece, regex)


def _parse_rule(path: Path, raw, patterns: dict[str, str]) -> Rule:
    if not isinstance(raw, dict):
        raise MappingError(f"{path}: a rule must be a mapping with 'match' and 'to', got {raw!r}")
    where = f"{path}:{raw.pop('__line__')}"
    unknown = set(raw) - RULE_FIELDS
    if unknown:
        raise MappingError(
            f"{where}: unknown rule field(s): {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(RULE_FIELDS))})"
        )
    if not isinstance(raw.get("match"), str) or not isinstance(raw.get("to"), str):
        raise MappingError(f"{where}: a rule needs string fields 'match' and 'to'")
    try:
        pattern = re.compile(_expand(where, raw["match"], patterns))
    except re.error as e:
        raise MappingError(f"{where}: bad regex {raw['match']!r}: {e}") from None
    ops = []
    for op in (k for k in raw if k in LAYOUT_OPS):
        value = raw[op]
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise MappingError(f"{where}: {op} takes a list of integers, got {value!r}")
        ops.append((op, tuple(value)))
    return Rule(name=raw.get("name", raw["match"]), pattern=pattern, to=raw["to"], ops=tuple(ops), where=where)


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
        else:
            raise ValueError(f"{op} cannot be inverted")
    return tuple(inverse)


@dataclasses.dataclass(frozen=True)
class Assignment:
    source_key: str
    target_key: str
    rule: Rule


@dataclasses.dataclass
class Match:
    """The outcome of applying a mapping section: what pairs up, what does not, and how often each rule hit."""

    assignments: list[Assignment]
    problems: list[str]
    hits: dict[Rule, int]


def match_keys(mapping: Mapping, target: str, source: dict[str, tuple], target_shapes: dict[str, tuple]) -> Match:
    rules = mapping.rules(target)
    problems, assignments, filled_by = [], [], {}
    hits = dict.fromkeys(rules, 0)
    for key in source:
        found = [(rule, m) for rule in rules if (m := rule.pattern.fullmatch(key))]
        for rule, _ in found:
            hits[rule] += 1
        if not found:
            problems.append(f"source key {key!r} is matched by no rule of {mapping.path.name} [{target}]")
            continue
        if len(found) > 1:
            names = "; ".join(f"{r.name} ({r.where})" for r, _ in found)
            problems.append(f"source key {key!r} is matched by {len(found)} rules: {names}")
            continue
        rule, match = found[0]
        target_key = rule.target_key(match)
        if target_key not in target_shapes:
            problems.append(
                f"source key {key!r} maps to {target_key!r} ({rule.where}), which the {target} model does not have"
            )
            continue
        if target_key in filled_by:
            problems.append(
                f"target leaf {target_key!r} is filled twice: from {filled_by[target_key]!r} and {key!r} ({rule.where})"
            )
            continue
        filled_by[target_key] = key
        try:
            got = transformed_shape(rule.ops, tuple(source[key]))
        except ValueError as e:
            problems.append(f"source key {key!r}: {e} ({rule.where})")
            continue
        if got != tuple(target_shapes[target_key]):
            problems.append(
                f"shape mismatch for {key!r} -> {target_key!r}: expected {list(target_shapes[target_key])}"
                f", got {list(got)} from source {list(source[key])} ({rule.where})"
            )
            continue
        assignments.append(Assignment(key, target_key, rule))
    problems += [
        f"target leaf {k!r} is filled by no source key (missing from the checkpoint?)"
        for k in target_shapes
        if k not in filled_by
    ]
    return Match(assignments, problems, hits)


def plan(mapping: Mapping, target: str, source: dict[str, tuple], target_shapes: dict[str, tuple]) -> list[Assignment]:
    """Pairs every source key with its target leaf, or raises MappingError listing every problem found."""
    result = match_keys(mapping, target, source, target_shapes)
    if result.problems:
        problems = result.problems
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise MappingError(f"{len(problems)} mapping problem(s): " + " | ".join(shown))
    return result.assignments


def target_path(key: str) -> tuple:
    """'encoder.down_blocks.10.conv1.kernel' -> ('encoder', 'down_blocks', 10, 'conv1', 'kernel')."""
    return tuple(int(part) if part.isdigit() else part for part in key.split("."))


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
