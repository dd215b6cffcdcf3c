"""The default job, measured: wall time, peak memory of its process tree, and the three accuracies.

    .venv/bin/python benchmarks/bench_default_job.py --out runs/bench-default [extra train arguments]

Runs `stare-agents train --recipe smollm2-arith --out OUT ...` as a child process and samples the resident
memory of its whole process tree (the trainer, Ray's processes and the rollout worker hosting vLLM; sandbox
containers run under dockerd and are not counted) every 0.5 s. Prints the run's summary.json figures, the
wall time seen from outside, and the peak. `--compare grpo-ds` and key=value overrides pass through.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/bench-default")
    parser.add_argument("--recipe", default="smollm2-arith")
    args, extra = parser.parse_known_args()
    if Path(args.out).exists():
        sys.exit(f"{args.out} exists: choose a new --out (the benchmark measures a run from scratch)")
    command = [
        sys.executable,
        "-m",
        "stare_agents.cli",
        "train",
        "--recipe",
        args.recipe,
        "--out",
        args.out,
        *extra,
    ]
    started = time.perf_counter()
    child = subprocess.Popen(command)
    process = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_rss(process))
        time.sleep(0.5)
    wall = time.perf_counter() - started
    if child.returncode != 0:
        sys.exit(f"training failed with exit status {child.returncode}")
    summary = json.loads((Path(args.out) / "summary.json").read_text())
    figures = {
        "wall_time_s_outside": round(wall, 1),
        "peak_rss_gib": round(peak / 2**30, 2),
        "accuracy": summary["accuracy"],
        "accuracy_ci": summary["accuracy_ci"],
        "eval_tasks": summary["eval_tasks"],
        "rl_gain": summary["rl_gain"],
        "entropy": summary["entropy"],
        "compare": summary.get("compare"),
        "stage_seconds": summary["stage_seconds"],
        "tool_use": summary["tool_use"],
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
