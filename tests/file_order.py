"""The order in which the two xdist workers take the test files: the modules that share the local Ray first, then
the rest, each group longest first.

`--dist loadfile` hands each worker a whole file at a time, the next one in its queue whenever the worker runs out.
pytest-xdist orders that queue by each file's number of tests, so the files with one or two long tests (SmolLM2's
before/after evaluation, the killed evaluation, the trained sweeps) came last, and the session waited on one worker
while the other sat idle. Longest first (the classic LPT rule) leaves only short files for the end, so the two
workers finish within about the last file's time of each other. And the modules that use the shared local Ray
(tests/conftest.py: `local_ray`, stopped before a module that does not use it) come one after another, so each
worker starts it about once instead of once per run of such modules (~4 s of CPU a start).

The order is made where the tests are collected (`pytest_collection_modifyitems` in tests/conftest.py, which knows
the modules' fixtures) and kept by the scheduler (`make_scheduler`). A file's time is what it took in a measured run
(`TABLE`, tests/file_seconds.json: the sum of its tests' setup, call and teardown wall times); a file not listed
counts as `UNLISTED_S`. Refresh the table after a suite run that printed every duration:

    CI=true bash scripts/test.sh --durations=0 2>&1 | tee /tmp/suite.log
    .venv/bin/python tests/file_order.py /tmp/suite.log          # rewrites tests/file_seconds.json

The order changes nothing but when a file runs; a test that passes only after another file has run is a bug.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
UNLISTED_S = 1.0  # a file the table does not list: a new one (most files take a second or two), or one under the log's 5 ms floor
DURATION_LINE = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(\S+?)::", re.M)


def file_seconds(table: Path | None = None) -> dict[str, float]:
    """The measured seconds per test file in `table` (default `TABLE`); {} where the table is missing or unreadable:
    the order falls back to the collection's, which is still correct. Entries that are not a file's non-negative
    seconds are left out."""
    try:
        data = json.loads((table or TABLE).read_text())
    except (OSError, ValueError):
        return {}
    seconds = data.get("seconds") if isinstance(data, dict) else None
    if not isinstance(seconds, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in seconds.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < float("inf")
    }


def longest_first(
    nodeids: list[str], seconds: dict[str, float], first: frozenset[str] = frozenset()
) -> list[str]:
    """The node ids, whole files together: the files in `first` before the others, and within each group the
    longest files first; within a file (and among files of equal time) the collection's order."""
    order: dict[str, int] = {}
    for nodeid in nodeids:
        order.setdefault(nodeid.split("::", 1)[0], len(order))

    def key(nodeid: str) -> tuple[bool, float, int]:
        path = nodeid.split("::", 1)[0]
        return (path not in first, -seconds.get(path, UNLISTED_S), order[path])

    return sorted(nodeids, key=key)


def make_scheduler(config, log):
    """The loadfile scheduler that hands out the files in the collection's order (made by `longest_first`), not
    xdist's by number of tests."""
    from xdist.scheduler import LoadFileScheduling

    class CollectionOrderScheduling(LoadFileScheduling):
        def schedule(self) -> None:
            self.config.option.loadscopereorder = False
            super().schedule()

    return CollectionOrderScheduling(config, log)


def table_from_log(text: str) -> dict[str, float]:
    """Seconds per file from pytest's `--durations=0` lines."""
    seconds: dict[str, float] = defaultdict(float)
    for value, path in DURATION_LINE.findall(text):
        seconds[path] += float(value)
    return {path: round(value, 1) for path, value in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: tests/file_order.py SUITE_LOG  (a log of `scripts/test.sh --durations=0`)",
            file=sys.stderr,
        )
        return 2
    seconds = table_from_log(Path(argv[0]).read_text(errors="replace"))
    if not seconds:
        print(f"{argv[0]}: no duration lines (run the suite with --durations=0)", file=sys.stderr)
        return 1
    note = "wall seconds per test file, from a `--durations=0` run (tests/file_order.py says how to refresh)"
    TABLE.write_text(json.dumps({"note": note, "seconds": seconds}, indent=1) + "\n")
    print(f"{TABLE}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
