"""`vae-convert check-mappings`: proves every rule of every mapping file against every registered config and
target, without weights: the source side is the project's PyTorch model on the meta device (diffusers' names and
shapes), the target side the target model's abstract state. With --pairings DIR it also proves each source format's
rules against its pairings file there (several folders: the first that has it): every key of the released file
becomes exactly the diffusers key listed for it, with that key's shape, and every diffusers key is produced."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from converter import mapping, source_formats, targets
from converter.errors import ConvertError
from converter.registry import FAMILIES, config_from_dict, configs_to_check, format_model


@dataclasses.dataclass
class TargetReport:
    target: str
    configs: dict[str, dict]  # name -> {"source_keys", "target_leaves", "problems"}
    rules: list[dict]  # {"name", "where", "hits": {config: n}}
    problems: list[str]  # dead rules and section-level problems

    @property
    def ok(self) -> bool:
        return not self.problems and not any(c["problems"] for c in self.configs.values())


@dataclasses.dataclass
class FormatReport:
    name: str
    renames: bool  # False: diffusers' own keys
    proven_against: str | None  # the pairings file, None when there was nothing to prove it against
    keys: int
    rules: list[dict]  # {"name", "where", "hits"}
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclasses.dataclass
class FileReport:
    file: str
    error: str | None = None
    targets: list[TargetReport] = dataclasses.field(default_factory=list)
    formats: list[FormatReport] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and all(t.ok for t in self.targets) and all(f.ok for f in self.formats)


def mapping_files(paths: list[Path]) -> list[Path]:
    return [Path(p) for p in paths] if paths else sorted(mapping.MAPPINGS_DIR.glob("*.yaml"))


def check_files(paths: list[Path], only_target: str | None, pairings: list[Path] | None = None) -> list[FileReport]:
    reports = []
    for path in mapping_files(paths):
        report = FileReport(str(path))
        reports.append(report)
        try:
            rules = mapping.load_mapping(path)
            source_formats.ensure_models_known(rules)
            unknown = [f for f in rules.families if f not in FAMILIES]
            if unknown:
                raise ConvertError(f"{path}:1: unknown family {unknown[0]!r} (known: {', '.join(FAMILIES)})")
            # every config of every family the file maps, each with its family
            configs = [
                (name, FAMILIES[f], config_from_dict(FAMILIES[f], raw))
                for f in rules.families
                for name, raw in configs_to_check(FAMILIES[f])
            ]
            for target in [only_target] if only_target else list(targets.TARGETS):
                report.targets.append(_check_target(rules, configs, target))
            report.formats = [_check_format(rules, fmt, configs, pairings) for fmt in rules.formats.values()]
            for fmt, format_report in zip(rules.formats.values(), report.formats):
                format_report.problems += _fits_other_families(rules, fmt)
        except ConvertError as e:
            report.error = str(e)
    return reports


def _fits_other_families(rules, fmt) -> list[str]:
    """A format's signature must not fit a diffusers checkpoint of a family another mapping file maps, at any config
    check-mappings knows: detection would take that checkpoint for this format. (Families sharing a file are told
    apart by their config's class.)"""
    problems = []
    for family in FAMILIES.values():
        if family.name in rules.families:
            continue
        for name, raw in configs_to_check(family):
            if fmt.fits(targets.diffusers_shapes(family, config_from_dict(family, raw))):
                problems.append(
                    f"signature {list(fmt.signature)} ({fmt.where}) also fits a checkpoint of {family.class_name} "
                    f"({family.name}, config {name}): add a key only this format has"
                )
                break
    return problems


def _not_invertible(assignments, source: dict, leaves: dict) -> list[str]:
    """Export runs each rule backwards: its inverse must take the target leaf's shape back to the source key's."""
    problems = []
    for a in assignments:
        try:
            back = mapping.transformed_shape(mapping.inverse_ops(a.ops, source[a.source_key]), leaves[a.target_key])
        except ValueError as e:
            back = str(e)
        if back != tuple(source[a.source_key]):
            problems.append(f"rule {a.rule.name!r} ({a.rule.where}) cannot be inverted for {a.source_key!r}: {back}")
    return problems


def _check_format(rules, fmt, configs, pairings: list[Path] | None) -> FormatReport:
    """A format's signature and, against its pairings file, every rule. Diffusers' own layout has no rules: its
    signature keys must be keys of every registered config."""
    if not fmt.renames:  # a format of one model's class (`model:`) need fit that class's configs only
        problems = [
            f"signature key {key!r} ({fmt.where}) is not a key of config {name}, or of another rank"
            for name, family, config in configs
            if fmt.model is None or family is format_model(fmt.model, rules.families).family
            for key in fmt.unfit_signature(targets.diffusers_shapes(family, config))
        ]
        return FormatReport(fmt.name, False, None, 0, [], problems)
    if pairings is None or fmt.pairings is None:
        return FormatReport(
            fmt.name, True, None, 0, [], [] if pairings is None else [f"{fmt.where}: no 'pairings' file"]
        )
    found = [Path(folder) / fmt.pairings for folder in pairings if (Path(folder) / fmt.pairings).exists()]
    path = found[0] if found else Path(pairings[0]) / fmt.pairings  # the first folder's, to name it missing
    try:
        listed = json.loads(path.read_text())
        family, config = _proven_at(rules, fmt, listed)
        listed = listed["keys"]
    except (OSError, ValueError, KeyError, ConvertError) as e:
        return FormatReport(fmt.name, True, str(path), 0, [], [f"{path}: not a readable pairings file ({e})"])
    specs = targets.diffusers_specs(family, config)
    diffusers = {k: shape for k, (shape, _) in specs.items()}
    try:
        source_formats.ensure_filled_are_counts(fmt, specs)
    except ConvertError as e:
        return FormatReport(fmt.name, True, str(path), len(listed), [], [str(e)])
    source = {k: tuple(v["shape"]) for k, v in listed.items()}
    result = mapping.rename_keys(rules, fmt, source, diffusers, config.to_dict())
    problems = list(result.problems)
    for a in result.assignments:
        said = listed[a.source_key]["diffusers"]  # a list where the key is split: its parts' keys in order
        said = said[a.part] if isinstance(said, list) and a.part < len(said) else said
        if a.target_key != said:
            problems.append(f"{a.source_key!r} becomes {a.target_key!r} ({a.rule.where}); the pairings say {said!r}")
    problems += [
        f"drop rule {rule.name!r} ({rule.where}) takes model key {key!r}" for key, rule in result.dropped.items()
    ]
    # a signature key may be another model's in the file (which the pairings, the VAE's keys, do not list): then a
    # drop rule takes it; or a tensor of a config field (which the pairings do not list either)
    problems += [
        f"signature key {k!r} ({fmt.where}) is not a key of {fmt.pairings} nor dropped"
        for k in fmt.signature
        if k not in listed
        and k not in fmt.config_tensors.values()
        and not any(rule.pattern.fullmatch(k) for rule in fmt.drops)
    ]
    problems += [
        f"config_tensors' {field!r} ({fmt.where}) is not a field of {family.class_name}'s config"
        for field in fmt.config_tensors
        if field not in config.to_dict()
    ]
    problems += [
        f"rule {r.shown_name!r} ({r.where}) matches no key of {fmt.pairings}" for r in fmt.rules if not result.hits[r]
    ]
    rule_rows = [{"name": r.shown_name, "where": r.where, "hits": result.hits[r]} for r in fmt.rules + fmt.drops]
    return FormatReport(fmt.name, True, str(path), len(listed), rule_rows, problems)


def _proven_at(rules, fmt, pairings: dict) -> tuple:
    """The family and config a format's pairings are proven at: its model's; for a format of any model of the
    family (no `model`), the pairings' `original_config` over the family's defaults."""
    if fmt.model is not None:
        model = format_model(fmt.model, rules.families)
        return model.family, config_from_dict(model.family, model.config)
    if len(rules.families) != 1:
        raise ConvertError(f"{fmt.where}: a format shared by several families names its 'model'")
    family = FAMILIES[rules.families[0]]
    return family, config_from_dict(family, pairings.get("original_config", {}))


def _check_target(rules, configs, target) -> TargetReport:
    if target not in rules.targets:
        return TargetReport(target, {}, [], [f"{rules.path}: no section for target {target!r}"])
    per_config, hits = {}, {rule: {} for rule in rules.targets[target]}
    for name, family, config in configs:
        source = targets.diffusers_shapes(family, config)
        leaves = targets.TARGETS[target].leaf_shapes(family, config)
        result = mapping.match_keys(rules, target, source, leaves)
        problems = result.problems + _not_invertible(result.assignments, source, leaves)
        per_config[name] = {"source_keys": len(source), "target_leaves": len(leaves), "problems": problems}
        for rule, count in result.hits.items():
            hits[rule][name] = count
    rule_rows = [{"name": r.name, "where": r.where, "hits": h} for r, h in hits.items()]
    dead = [
        f"rule {r.name!r} ({r.where}) matches nothing for any registered config"
        for r, h in hits.items()
        if not any(h.values())
    ]
    return TargetReport(target, per_config, rule_rows, dead)


def as_json(reports: list[FileReport], seconds: float) -> dict:
    return {
        "ok": all(r.ok for r in reports),
        "seconds": round(seconds, 2),
        "mappings": [
            {
                "file": r.file,
                "ok": r.ok,
                "error": r.error,
                "targets": [dict(dataclasses.asdict(t), ok=t.ok) for t in r.targets],
                "source_formats": [dict(dataclasses.asdict(f), ok=f.ok) for f in r.formats],
            }
            for r in reports
        ],
    }


def as_text(reports: list[FileReport], seconds: float) -> str:
    lines = []
    for report in reports:
        lines.append(f"{'✓' if report.ok else '✗'} {report.file}")
        if report.error:
            lines.append(f"    {report.error}")
        for t in report.targets:
            names = list(t.configs)
            keys = ", ".join(f"{n} ({c['source_keys']} keys)" for n, c in t.configs.items())
            lines.append(f"  {'✓' if t.ok else '✗'} target {t.target}: {keys}")
            if t.rules:
                width = max(len(r["name"]) for r in t.rules)
                lines.append(f"      {'rule':<{width}}  {'line':>5}  " + "  ".join(f"{n:>14}" for n in names))
                for r in t.rules:
                    line = r["where"].rsplit(":", 1)[1]
                    counts = "  ".join(f"{r['hits'].get(n, 0):>14}" for n in names)
                    lines.append(f"      {r['name']:<{width}}  {line:>5}  {counts}")
            for name, c in t.configs.items():
                lines += [f"    ✗ [{name}] {p}" for p in c["problems"]]
            lines += [f"    ✗ {p}" for p in t.problems]
        for f in report.formats:
            lines.append(f"  {'✓' if f.ok else '✗'} source format {f.name}: {_proof(f)}")
            lines += [f"      {r['name']:<24} {r['where'].rsplit(':', 1)[1]:>5}  {r['hits']:>5}" for r in f.rules]
            lines += [f"    ✗ {p}" for p in f.problems]
    ok = all(r.ok for r in reports)
    lines.append(f"{'all mappings clean' if ok else 'mapping problems found'} ({len(reports)} file(s), {seconds:.1f}s)")
    return "\n".join(lines)


def _proof(f: FormatReport) -> str:
    if not f.renames:
        return "diffusers' keys, signature checked against every config"
    if f.proven_against is None:
        return "not proven (pass --pairings DIR)"
    return f"{f.keys} keys of {Path(f.proven_against).name}" + (" renamed as listed" if f.ok else "")


def run(
    paths: list[Path], only_target: str | None, pairings: list[Path] | None = None
) -> tuple[list[FileReport], float]:
    started = time.monotonic()
    reports = check_files(paths, only_target, pairings)
    return reports, time.monotonic() - started
