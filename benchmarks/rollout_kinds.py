"""What RL had to learn from, per task kind: the saved rollouts of one or more run folders, read back.

For each run and task kind: the distinct prompts drawn, the trajectories sampled, how many were trained on (the rest
were dropped: their group had no reward variance), and the share of sampled trajectories that scored, over the
first and the last `--window` steps. Across the runs: how many prompts every run drew (a fixed `env.train_seed` gives
every seed the same prompt stream). A kind whose sampled success stays at zero gives RL no signal at all.

    .venv/bin/python benchmarks/rollout_kinds.py benchmarks/logs/default-job-seeds/epyc-avx512bf16/fast-s{0,1,2,3,4} \
        --window 3 --json runs/rollout-kinds.json

The kind is read from the task id (`arith-<kind>-L<level>-<hash>`: `<kind>`); an id without a level part is its own
kind.
Damaged step files are read up to their damage and reported, as everywhere rollouts are read back.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from stare_agents.jsonl import dumps
from stare_agents.rollout_log import read_rollouts, saved_steps

_LEVEL = re.compile(r"L\d+")
_HASH = re.compile(r"[0-9a-f]{6,}")


def kind_of(task_id: str) -> str:
    """`arith-count_primes-L1-a9373b91e9` -> `count_primes`: the parts between the environment's prefix and the
    level and hash; an id that is not of that shape is its own kind."""
    parts = str(task_id).split("-")
    if not any(_LEVEL.fullmatch(part) for part in parts[1:]):
        return str(task_id)
    middle = [part for part in parts[1:] if not _LEVEL.fullmatch(part) and not _HASH.fullmatch(part)]
    return "-".join(middle) or str(task_id)


def run_kinds(folder: Path, window: int) -> dict[str, Any]:
    """One run's figures per kind (see the module docstring)."""
    steps = saved_steps(folder)
    if not steps:
        raise SystemExit(f"{folder}: no saved rollouts (rollouts/step-*.jsonl.gz); is it a run folder?")
    first, last = set(steps[:window]), set(steps[-window:])
    kinds: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"prompts": set(), "sampled": 0, "trained": 0, "first": [0, 0], "last": [0, 0]}
    )
    prompts: set[str] = set()
    unread: list = []
    for saved in read_rollouts(folder, unread=unread):
        task_id = saved.trajectory.task_id
        row = kinds[kind_of(task_id)]
        row["prompts"].add(task_id)
        prompts.add(task_id)
        row["sampled"] += 1
        row["trained"] += saved.status == "trained"
        scored = int(saved.trajectory.reward > 0)
        for name, chosen in (("first", first), ("last", last)):
            if saved.step in chosen:
                row[name][0] += scored
                row[name][1] += 1
    return {
        "run": str(folder),
        "steps": len(steps),
        "unread": [str(u) for u in unread],
        "prompts": sorted(prompts),
        "kinds": {kind: {**row, "prompts": len(row["prompts"])} for kind, row in sorted(kinds.items())},
    }


def share(pair: list[int]) -> str:
    return f"{pair[0]}/{pair[1]}" if pair[1] else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with rollouts/")
    parser.add_argument("--window", type=int, default=3, help="the first and last this many steps")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    runs = [run_kinds(folder, args.window) for folder in args.runs]
    kinds = sorted({kind for run in runs for kind in run["kinds"]})
    print(
        f"sampled success, first {args.window} steps -> last {args.window} (scored/sampled); trained/sampled"
    )
    print("| kind | " + " | ".join(Path(run["run"]).name for run in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for kind in kinds:
        cells = []
        for run in runs:
            row = run["kinds"].get(kind)
            cells.append(
                "-"
                if row is None
                else f"{share(row['first'])} -> {share(row['last'])}; {row['trained']}/{row['sampled']}"
            )
        print(f"| {kind} | " + " | ".join(cells) + " |")
    common = set.intersection(*(set(run["prompts"]) for run in runs))
    union = set.union(*(set(run["prompts"]) for run in runs))
    print(f"prompts drawn per run: {[len(run['prompts']) for run in runs]}; common to all: {len(common)}; "
          f"union: {len(union)}")  # fmt: skip
    for run in runs:
        for line in run["unread"]:
            print(f"{run['run']}: not read: {line}", file=sys.stderr)
    if args.json:
        report = {
            "window": args.window,
            "common_prompts": len(common),
            "union_prompts": len(union),
            "runs": runs,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
