"""What the suite costs, from a run's JUnit report (`make test` writes build/test-report.xml): worker-seconds per
family and per generic module, and the whole run. `python -m tests.costs build/test-report.xml --write` puts the
tables into docs/testing.md between its `<!-- costs -->` markers; without --write they are printed.

A test is a family's when its case names one (the generic tests' ids start with the family, the full-size ones are
model names, per-family tests are the family's name) or it is in the family's own test file (tests/test_<folder>.py).
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from converter.registry import COMPONENT_MODELS, FAMILIES, get_model
from tests.helpers import REPO

DOC = REPO / "docs" / "testing.md"
MARKERS = ("<!-- costs -->", "<!-- /costs -->")


def family_of(module: str, name: str) -> str | None:
    case = name.partition("[")[2].rstrip("]")
    named = [family for family in FAMILIES if case == family or case.startswith(f"{family}-")]
    if named:
        return max(named, key=len)  # ltx2-... is ltx2's, not ltx's
    if case.partition(":")[0] in {name for name, _ in COMPONENT_MODELS}:
        return get_model(case).family.name
    folder = module.removeprefix("test_")
    owners = [name for name, family in FAMILIES.items() if family.folder == folder]
    return "+".join(owners) if owners else None


def read(report: Path) -> list[tuple[str, str, float, bool]]:
    """(module, test name, seconds, skipped) for each test case of the report."""
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").rpartition(".")[2]
        cases.append((module, case.get("name", ""), float(case.get("time", 0)), case.find("skipped") is not None))
    return cases


def tables(cases, wall: float | None) -> str:
    per_family = collections.defaultdict(lambda: collections.Counter())
    per_module = collections.Counter()
    counts = collections.Counter()
    for module, name, seconds, _ in cases:
        per_module[module] += seconds
        counts[module] += 1
        family = family_of(module, name)
        if family:
            generic = module.removeprefix("test_") not in {f.folder for f in FAMILIES.values()}
            per_family[family][module if generic else "own file"] += seconds
    generic_modules = sorted({m for costs in per_family.values() for m in costs if m != "own file"})
    lines = [
        "| family | " + " | ".join(m.removeprefix("test_") for m in generic_modules) + " | own file | total |",
        "|---" * (len(generic_modules) + 3) + "|",
    ]
    for family, costs in sorted(per_family.items(), key=lambda kv: -sum(kv[1].values())):
        cells = [f"{costs[m]:.0f}" if costs[m] else "-" for m in [*generic_modules, "own file"]]
        lines.append(f"| {family} | " + " | ".join(cells) + f" | {sum(costs.values()):.0f} |")
    lines += ["", "| module | tests | worker-seconds |", "|---|---|---|"]
    lines += [f"| {m} | {counts[m]} | {s:.0f} |" for m, s in per_module.most_common()]
    total = sum(per_module.values())
    summary = f"{len(cases)} tests, {total:.0f} worker-seconds"
    if wall:
        summary += f", {wall / 60:.1f} minutes on 2 workers"
    return "\n".join([summary + ":", "", *lines])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--write", action="store_true", help=f"replace the tables in {DOC.name}")
    args = parser.parse_args(argv)
    root = ET.parse(args.report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    text = tables(read(args.report), float(suite.get("time", 0)) if suite is not None else None)
    if not args.write:
        print(text)
        return 0
    doc = DOC.read_text()
    start, end = doc.index(MARKERS[0]) + len(MARKERS[0]), doc.index(MARKERS[1])
    DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
