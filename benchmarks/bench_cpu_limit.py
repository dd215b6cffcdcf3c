"""Does a busy machine fail an honest program? A program that needs exactly 1 s of CPU time, run while two Python
busy loops share the machine's cores with it, under a 2 s wall-clock limit (what every call had before issue 45,
here `timeout_s=2, wall_timeout_s=2`) and under a 2 s CPU limit (`timeout_s=2`, its default 8 s wall cap),
the two interleaved trial by trial so that load hits both alike.

    nice -n 19 .venv/bin/python benchmarks/bench_cpu_limit.py [--trials 10] [--backends docker local]

The busy loops run at the niceness of the code (the local runner's is this process's; Docker's containers are
the engine's children, niceness 0, which needs root to match). Writes benchmarks/logs/cpu-limit/<backend>.json
(strict JSON: every trial's status, wall and CPU seconds, the load average before and after) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from stare_agents.sandbox import DockerSandbox, LocalSandbox

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sandbox"))
from sandbox_support import ONE_CPU_SECOND, busy_neighbours, code_niceness

LIMITS = {"wall": {"timeout_s": 2.0, "wall_timeout_s": 2.0}, "cpu": {"timeout_s": 2.0}}
OUT = Path(__file__).resolve().parent / "logs" / "cpu-limit"


def measure(backend: str, trials: int) -> dict:
    box = (
        DockerSandbox(pool_size=1, preimport=())
        if backend == "docker"
        else LocalSandbox(pool_size=1, preimport=(), allow_host_execution=True)
    )
    runs: dict[str, list[dict]] = {name: [] for name in LIMITS}
    load_before = os.getloadavg()
    with box, busy_neighbours(code_niceness(box)) as loops:
        for _ in range(trials):
            for name, limits in LIMITS.items():
                with box.session() as session:
                    r = session.run(ONE_CPU_SECOND, **limits)
                runs[name].append(
                    {"status": r.status, "duration_s": round(r.duration_s, 3), "cpu_s": r.cpu_s}
                )
        neighbours = [os.getpriority(os.PRIO_PROCESS, loop.pid) for loop in loops]
    return {
        "backend": backend,
        "program": "1.0 s of CPU time (time.process_time busy loop)",
        "neighbours": f"2 Python busy loops at niceness {neighbours}; code at niceness {code_niceness(box)}",
        "cpus": os.cpu_count(),
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "limits": LIMITS,
        "passed": {name: sum(run["status"] == "ok" for run in runs[name]) for name in LIMITS},
        "trials": trials,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--backends", nargs="+", default=["docker", "local"], choices=["docker", "local"])
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for backend in args.backends:
        started = time.perf_counter()
        result = measure(backend, args.trials)
        (OUT / f"{backend}.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
        for name in LIMITS:
            walls = sorted(run["duration_s"] for run in result["runs"][name])
            print(
                f"{backend:6s} {name:4s} limit: {result['passed'][name]}/{args.trials} passed, wall "
                f"{walls[0]:.2f}-{walls[-1]:.2f} s (median {walls[len(walls) // 2]:.2f}); load "
                f"{result['load_average_before'][0]:.1f} -> {result['load_average_after'][0]:.1f}; "
                f"{time.perf_counter() - started:.0f} s"
            )


if __name__ == "__main__":
    main()
