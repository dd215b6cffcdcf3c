"""What each cell of ArithmeticTIR-v1 costs its solver: per (kind, level), the CPU time of the environment's own
solver program (`solution_code`) inside the sandbox, and the sizes of the problem's numbers and of the answer.

    .venv/bin/python benchmarks/bench_arithmetic_cells.py [--backend docker|local] [--seeds 10] [--json FILE]

Every cell's program should need well under the tool's limit of CPU on a slow machine (the design bound is
0.3 s): the table says how far under. Each program runs in a fresh stateless session, wrapped in
`time.process_time()` readings taken inside the sandbox (the interpreter's CPU time; numpy and sympy are
imported by the sandbox before the call, as for any tool call). Wall time is the caller's view of the call,
sandbox overhead included. A program that prints anything but the environment's answer is an error here.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
from pathlib import Path

from stare_agents.envs import ArithmeticTIRV1Env
from stare_agents.envs.arithmetic import LEVELS, V1_KINDS
from stare_agents.sandbox import make_sandbox

TIMED = "import time as _time\n_cpu = _time.process_time()\n{code}\nprint(f'\\nCPU {{_time.process_time() - _cpu:.6f}}')"


def measure_cell(sandbox, kind: str, level: int, seeds: int) -> dict:
    """The solver's CPU and wall seconds (median, max) over `seeds` tasks of the cell, and the digits of the
    answer and of the problem's largest number (median, max)."""
    env = ArithmeticTIRV1Env(kinds=(kind,), levels=(level,))
    cpu, wall, answer_digits, operand_digits = [], [], [], []
    for seed in range(seeds):
        env.reset(seed=seed)
        task = env.task
        result = sandbox.run(TIMED.format(code=env.solution_code(task)), timeout_s=30)
        printed, _, timing = result.stdout.rstrip().rpartition("\nCPU ")
        if not result.ok or printed.strip() != task.answer:
            raise SystemExit(
                f"{task.id}: the solver printed {result.output()[:300]!r}, the answer is {task.answer}"
            )
        cpu.append(float(timing))
        wall.append(result.duration_s)
        answer_digits.append(len(task.answer.lstrip("-")))
        operand_digits.append(max(len(n) for n in re.findall(r"\d+", task.problem)))
    return {
        "kind": kind,
        "level": level,
        "tasks": seeds,
        "cpu_s_median": statistics.median(cpu),
        "cpu_s_max": max(cpu),
        "wall_s_median": statistics.median(wall),
        "answer_digits_median": statistics.median(answer_digits),
        "answer_digits_max": max(answer_digits),
        "largest_number_digits_max": max(operand_digits),
        "example": task.problem,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="docker", choices=["docker", "local"])
    parser.add_argument("--seeds", type=int, default=10, help="tasks per cell")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    extra = {"allow_host_execution": True} if args.backend == "local" else {}
    rows = []
    with make_sandbox(args.backend, pool_size=1, **extra) as sandbox:
        print(
            f"| kind | level | solver CPU s, median / max ({args.seeds} tasks) | wall s, median | answer digits, "
            "median / max | largest number in the problem, digits | example |"
        )
        print("|---|---|---|---|---|---|---|")
        for kind in V1_KINDS:
            for level in LEVELS:
                row = measure_cell(sandbox, kind, level, args.seeds)
                rows.append(row)
                print(
                    f"| {kind} | {level} | {row['cpu_s_median']:.4f} / {row['cpu_s_max']:.4f} | "
                    f"{row['wall_s_median']:.3f} | {row['answer_digits_median']:g} / {row['answer_digits_max']} | "
                    f"{row['largest_number_digits_max']} | {row['example'][:70]} |",
                    flush=True,
                )
    worst = max(rows, key=lambda r: r["cpu_s_max"])
    print(
        f"\nslowest cell: {worst['kind']} level {worst['level']}, {worst['cpu_s_max']:.4f} s CPU "
        f"({args.backend} sandbox, {platform.processor() or platform.machine()})"
    )
    if args.json:
        args.json.write_text(json.dumps({"backend": args.backend, "rows": rows}, indent=1, allow_nan=False))


if __name__ == "__main__":
    main()
