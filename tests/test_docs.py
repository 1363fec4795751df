"""The docs say what the code does: every mapping field the parser knows is documented and every documented field
is one the parser knows; the import graph docs/architecture.md states is the real one; the benchmark's tables in the
docs are the current results (bench/docs.py)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

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
        **{("rule", f): None for f in mapping.RULE_FIELDS},
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
