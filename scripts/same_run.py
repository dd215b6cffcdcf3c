"""Are two training runs the same run? Compares their metrics.jsonl record by record, every figure but the
timings, and exits 1 naming the first differences. The redesign's check: a same-seed tiny run before and after
a change must print "same run".

    .venv/bin/python scripts/same_run.py runs/before runs/after
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# figures that measure time, which no two runs share
TIMING_PREFIXES = ("time/",)
TIMING_SUFFIXES = ("_s", "per_s", "seconds", "per_turn")


def figures(record: dict) -> dict:
    return {
        key: value
        for key, value in record.items()
        if not key.startswith(TIMING_PREFIXES) and not key.endswith(TIMING_SUFFIXES)
    }


def differences(before: Path, after: Path) -> list[str]:
    a = [json.loads(line) for line in (before / "metrics.jsonl").read_text().split("\n") if line.strip()]
    b = [json.loads(line) for line in (after / "metrics.jsonl").read_text().split("\n") if line.strip()]
    out = [f"{len(a)} records against {len(b)}"] if len(a) != len(b) else []
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # the shorter run is compared as far as it goes
        x, y = figures(x), figures(y)
        for key in sorted(set(x) | set(y)):
            u, v = x.get(key, "<absent>"), y.get(key, "<absent>")
            both_nan = isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v)
            if u != v and not both_nan:
                out.append(f"record {i} ({x.get('kind')}, step {x.get('step')}): {key}: {u!r} -> {v!r}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    found = differences(Path(argv[0]), Path(argv[1]))
    if found:
        print(f"{len(found)} difference(s):", *found[:20], sep="\n  ")
        return 1
    print("same run")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
