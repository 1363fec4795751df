"""The repository stands alone: a clone with nothing beside it runs its suite, CI, docs and benchmark. Every test
process refuses reads beside the repository (tests/conftest.py); these tests show the refusal bites and that no
tracked file points outside the repository."""

from __future__ import annotations

import fnmatch
import re
import subprocess

import pytest

from tests.conftest import ReadBesideTheRepository
from tests.helpers import DATA, REPO

# a relative path that climbs (`../data/`), and a path built from the repository's parent
CLIMB = re.compile(r"(?<![\w.])((?:\.\./)+[\w.-]+/)")
BUILT = re.compile(r"REPO\.parent\b|\.parent\.parent\s*/")
# the guard itself names the repository's parent and its neighbours
GUARD = {"tests/conftest.py", "tests/test_self_contained.py"}


def test_a_read_beside_the_repository_fails_the_test():
    beside = REPO.parent / "a-neighbour" / "data"  # refused before the file system is asked: it need not exist
    for read in (lambda: open(beside / "x.json"), lambda: list(beside.iterdir())):
        with pytest.raises(ReadBesideTheRepository):
            read()
    assert (DATA / "README.md").read_text()  # inside the repository: read as usual


def test_no_tracked_file_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        try:
            lines = (REPO / name).read_text().splitlines()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        start = (REPO / name).parent if name.endswith(".md") else REPO  # a link is relative to its page
        for number, line in enumerate(lines, 1):
            climbs = [p for p in CLIMB.findall(line) if not (start / p).resolve().is_relative_to(REPO)]
            if name not in GUARD and (climbs or BUILT.search(line)):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_suite_s_data_is_inside_the_repository():
    """What the tests read, each named in tests/data/README.md with where it comes from."""
    named = re.findall(r"`([^`/ ]+)`", (DATA / "README.md").read_text())
    for path in sorted(p for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"):
        assert any(fnmatch.fnmatchcase(path.name, pattern) for pattern in named), f"{path.relative_to(REPO)}"
