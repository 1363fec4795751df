"""The docs say what the code does: every mapping field the parser knows is documented and every documented field
is one the parser knows; the import graph docs/architecture.md states is the real one; the benchmark's tables in the
docs are the current results (bench/docs.py)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from converter import mapping
from tests.helpers import REPO

DOCS = REPO / "docs"


def _table_rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| `")
    ]


def test_every_mapping_field_is_documented_and_every_documented_field_is_known():
    documented = {(part, field.strip("`")) for field, part, _ in _table_rows((DOCS / "mapping-format.md").read_text())}
    known = {
        **{("file", f): None for f in mapping.TOP_FIELDS},
        **{("rule", f): None for f in mapping.RULE_FIELDS | mapping.USE_FIELDS},
        **{("drop", f): None for f in mapping.DROP_FIELDS},
        **{("format", f): None for f in mapping.FORMAT_FIELDS},
        **{("container", f): None for f in mapping.CONTAINER_FIELDS},
    }
    assert documented == set(known), (sorted(documented - set(known)), sorted(set(known) - documented))


def converter_imports() -> dict[str, set[str]]:
    """{module: the converter modules (and `models`) it imports when it is imported}: module-level imports only."""
    modules = {p.stem for p in (REPO / "converter").glob("*.py")} | {"models"}
    graph = {}
    for path in sorted((REPO / "converter").glob("*.py")):
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module == "converter":
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("converter."):
                found.add(node.module.split(".")[1])
        graph[path.stem] = (found & modules) - {path.stem}
    return graph


def test_the_documented_import_graph_is_the_real_one():
    text = (DOCS / "architecture.md").read_text()
    block = text.split("<!-- imports -->")[1]
    documented = {}
    for line in block.strip().splitlines():
        module, _, imports = line.strip("`- ").partition(":")
        documented[module.strip("` ")] = set(re.findall(r"[\w]+", imports))
    assert documented == converter_imports()


def test_the_docs_hold_the_current_benchmark_tables():
    result = subprocess.run([sys.executable, "-m", "bench.docs", "--check"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# A pointer to a section: `(README, Performance)`, `docs/usage.md, The Hub`, `(README, "When things go wrong")`
SECTION_POINTER = re.compile(r"\b(README|[\w/-]+\.md)[,;] \"?([A-Z][^\",;)`]*)")
# A path in the repository, unless it is a pattern (`tests/test_<family>.py`, `latest.{md,json}`)
PATH_POINTER = re.compile(r"(?<![\w/.<-])((?:converter|models|mappings|tests|bench|docs|\.ci)/[\w./-]*)([<{*]?)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _headings(path) -> list[str]:
    return [h.strip() for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _pointer_sources() -> list[str]:
    """The tracked files that may point elsewhere: code, docs, mappings, build files (not data nor results)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    kinds = {".py", ".md", ".yaml", ".cfg", ".toml"}
    return [
        name
        for name in tracked
        if (name.endswith(tuple(kinds)) or name in ("Makefile", ".ci/run")) and not name.startswith("bench/results/")
    ]


def test_every_pointer_to_a_file_or_section_resolves():
    """Comments and docs point at files, sections and anchors that exist: a guide that moves takes its pointers
    along."""
    broken = []
    for name in _pointer_sources():
        path = REPO / name
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{name}:{number}"
            for target, section in SECTION_POINTER.findall(line):
                target = REPO / ("README.md" if target == "README" else target)
                if not target.exists():
                    broken.append(f"{where}: no file {target.relative_to(REPO)}")
                elif not any(h.lower().startswith(section.strip().lower()) for h in _headings(target)):
                    broken.append(f"{where}: no section {section.strip()!r} in {target.relative_to(REPO)}")
            paths = [p.rstrip(".") for p, pattern in PATH_POINTER.findall(line) if not pattern]
            broken += [f"{where}: no path {p}" for p in paths if not (REPO / p).exists()]
            if not name.endswith(".md"):
                continue
            for link in LINK.findall(line):
                if re.match(r"\w+:", link):
                    continue
                file, _, anchor = link.partition("#")
                target = (path.parent / file).resolve() if file else path
                if not target.exists():
                    broken.append(f"{where}: no file {link}")
                elif anchor and anchor not in {_slug(h) for h in _headings(target)}:
                    broken.append(f"{where}: no anchor {link}")
    assert not broken, "\n".join(broken)


# Prose that counts what the registry counts goes stale with the next family: "both families", "all four models",
# "2 files, 8 distinct configs". Write "every family" and let the registry count.
COUNTED = re.compile(
    r"\b(?:both|two|three|four|five|six|seven|eight|nine|ten|\d+)\s+(?:video\s+|image\s+)?families\b"
    r"|\ball\s+(?:two|three|four|five|six|seven|eight|nine|ten|\d+)\s+(?:video\s+|image\s+)?(?:models|VAEs)\b"
    r"|\b\d+\s+(?:mapping\s+)?files?,\s+\d+\s+(?:distinct\s+)?configs\b",
    re.IGNORECASE,
)


def test_no_prose_counts_the_families():
    """README, the guides, setup.cfg and every docstring and comment of the code say "every family", never a count."""
    files = [REPO / "README.md", REPO / "setup.cfg", *(DOCS.glob("*.md")), *(REPO / "bench").glob("*.md")]
    files += [p for folder in ("converter", "models", "bench", "tests") for p in (REPO / folder).rglob("*.py")]
    found = [
        f"{path.relative_to(REPO)}:{n}: {match.group(0)}"
        for path in files
        if path != Path(__file__)  # the examples above
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for match in COUNTED.finditer(line)
    ]
    assert not found, found
