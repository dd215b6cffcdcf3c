"""The order the suite's test files are handed to pytest-xdist's workers: the longest first.

scripts/test.sh runs two workers, a file at a time each (`--dist loadfile --no-loadscope-reorder`), so the order
of the files is the order of the work queue. xdist's own order (most tests first) sends the files with one long
test -- SmolLM2 trained and evaluated, a two-node cluster, a killed run resumed -- last, and the suite ends with
one worker busy and the other idle. Handed out longest first (tests/file_seconds.json, the wall seconds each file took in
a measured run of the suite), the long files overlap the short ones instead.

A file missing from the figures (a new one) is placed as the median file is: its cost is unknown. Refresh the figures after the suite changes:

    STARE_TEST_FILE_SECONDS=tests/file_seconds.json CI=true bash scripts/test.sh

(the controller writes each file's wall seconds, its tests' and its module fixtures' together, when the session
ends). The order changes nothing but when a file runs: every file is still one worker's, whole.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

FILE_SECONDS_PATH = Path(__file__).with_name("file_seconds.json")
OUT_VARIABLE = "STARE_TEST_FILE_SECONDS"


def load_file_seconds(path: Path = FILE_SECONDS_PATH) -> dict[str, float]:
    """{test file, relative to the repository root: wall seconds}; empty when there is no such file. A torn or
    malformed file is an error that names it (the order would otherwise change silently)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise pytest.UsageError(
            f"{path}: not JSON ({error}); write it again (see tests/file_order.py)"
        ) from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in data.items()
    ):
        raise pytest.UsageError(
            f"{path}: expected {{test file: seconds}}; write it again (see tests/file_order.py)"
        )
    return {k: float(v) for k, v in data.items()}


def file_of(nodeid: str) -> str:
    """The test file of a node id ("tests/a/test_b.py::test_c[x]" -> "tests/a/test_b.py")."""
    return nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item], seconds: Mapping[str, float]) -> list[pytest.Item]:
    """`items` with their files in descending `seconds` (a file without a figure as the median of the figures),
    each file's tests kept together and in their own order; files of equal figures keep the collection's order."""
    known = sorted(seconds.values())
    unknown = known[len(known) // 2] if known else 0.0
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(file_of(item.nodeid), len(first_seen))

    def key(item: pytest.Item) -> tuple[float, int]:
        name = file_of(item.nodeid)
        return (-seconds.get(name, unknown), first_seen[name])

    return sorted(items, key=key)  # stable: a file's tests keep their order


def per_file(costs: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Wall seconds per test file from (name, wall seconds) pairs as the cost ratchet reports them: a test's node
    id, or `fixture <name> (<scope> <node id>)[ on <worker>]` (session fixtures, not a file's, are left out)."""
    totals: dict[str, float] = {}
    for name, wall_s in costs:
        if name.startswith("fixture "):
            where = name.rsplit("(", 1)[-1].split(")", 1)[0]  # "<scope> <node id>"
            node = where.split(" ", 1)[-1]
            if not node.startswith("tests/"):
                continue
            name = node
        totals[file_of(name)] = totals.get(file_of(name), 0.0) + wall_s
    return {name: round(totals[name], 1) for name in sorted(totals)}


def write_file_seconds(costs: Iterable[tuple[str, float]], path: str | os.PathLike) -> None:
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(per_file(costs), indent=1, sort_keys=True) + "\n")
    os.replace(partial, target)
