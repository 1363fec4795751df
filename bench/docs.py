"""Copies the benchmark's tables into the docs: every `<!-- bench: FILE [table N] -->` ... `<!-- /bench -->` block
of README.md and docs/*.md is replaced by FILE (under bench/results/), whole or its N-th table (from 1). Run after a
benchmark: `python -m bench.docs`; `--check` exits 1 if a doc is out of date (a test runs it)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
BLOCK = re.compile(
    r"(<!-- bench: (?P<file>[\w.-]+)(?: table (?P<table>\d+))? -->\n)(?P<body>.*?)(<!-- /bench -->)", re.S
)


def tables(text: str) -> list[str]:
    """The markdown tables of `text`, each with its lines."""
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append("\n".join(current))
            current = []
    return found + (["\n".join(current)] if current else [])


def included(file: str, table: str | None) -> str:
    text = (RESULTS / file).read_text()
    return (text.rstrip() if table is None else tables(text)[int(table) - 1]) + "\n"


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + included(m["file"], m["table"]) + m.group(5), text)


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a document is not up to date")
    args = parser.parse_args()
    stale = []
    for path in documents():
        text = path.read_text()
        if render(text) != text:
            stale.append(path.relative_to(REPO))
            if not args.check:
                path.write_text(render(text))
    if args.check and stale:
        sys.exit(f"out of date (run python -m bench.docs): {', '.join(map(str, stale))}")


if __name__ == "__main__":
    main()
