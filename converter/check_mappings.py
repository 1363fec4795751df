"""`vae-convert check-mappings`: proves every rule of every mapping file against every registered config and
target, without weights: the source side is the project's PyTorch model on the meta device (diffusers' names and
shapes), the target side the target model's abstract state."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from converter import mapping, targets
from converter.errors import ConvertError
from converter.registry import FAMILIES, config_from_dict, configs_to_check


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
class FileReport:
    file: str
    error: str | None = None
    targets: list[TargetReport] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and all(t.ok for t in self.targets)


def mapping_files(paths: list[Path]) -> list[Path]:
    return [Path(p) for p in paths] if paths else sorted(mapping.MAPPINGS_DIR.glob("*.yaml"))


def check_files(paths: list[Path], only_target: str | None) -> list[FileReport]:
    reports = []
    for path in mapping_files(paths):
        report = FileReport(str(path))
        reports.append(report)
        try:
            rules = mapping.load_mapping(path)
            family = FAMILIES.get(rules.family)
            if family is None:
                raise ConvertError(f"{path}:1: unknown family {rules.family!r} (known: {', '.join(FAMILIES)})")
            configs = [(name, config_from_dict(family, raw)) for name, raw in configs_to_check(family)]
            for target in [only_target] if only_target else list(targets.TARGETS):
                report.targets.append(_check_target(rules, family, configs, target))
        except ConvertError as e:
            report.error = str(e)
    return reports


def _not_invertible(assignments, source: dict, leaves: dict) -> list[str]:
    """Export runs each rule backwards: its inverse must take the target leaf's shape back to the source key's."""
    problems = []
    for a in assignments:
        try:
            back = mapping.transformed_shape(
                mapping.inverse_ops(a.rule.ops, source[a.source_key]), leaves[a.target_key]
            )
        except ValueError as e:
            back = str(e)
        if back != tuple(source[a.source_key]):
            problems.append(f"rule {a.rule.name!r} ({a.rule.where}) cannot be inverted for {a.source_key!r}: {back}")
    return problems


def _check_target(rules, family, configs, target) -> TargetReport:
    if target not in rules.targets:
        return TargetReport(target, {}, [], [f"{rules.path}: no section for target {target!r}"])
    per_config, hits = {}, {rule: {} for rule in rules.targets[target]}
    for name, config in configs:
        source = {k: tuple(v.shape) for k, v in targets.meta_torch(family, config).state_dict().items()}
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
    ok = all(r.ok for r in reports)
    lines.append(f"{'all mappings clean' if ok else 'mapping problems found'} ({len(reports)} file(s), {seconds:.1f}s)")
    return "\n".join(lines)


def run(paths: list[Path], only_target: str | None) -> tuple[list[FileReport], float]:
    started = time.monotonic()
    reports = check_files(paths, only_target)
    return reports, time.monotonic() - started
