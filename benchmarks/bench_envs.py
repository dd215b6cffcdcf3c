"""Environment benchmarks: MathTIR steps/s through the sandbox, and grading throughput on MATH-500.

    .venv/bin/python benchmarks/bench_envs.py [--backend auto|docker|local] [--episodes 60] [--envs 1,4]
        [--only mathtir|grader] [--concurrency 16] [--json FILE]

1. MathTIR-v0 throughput. Each scripted episode is three steps: two Python tool calls (the second reads a
   variable the first set, so the session must be stateful) and a boxed final answer that is graded. With
   `--envs 1,4` it runs one environment, then four environments in threads sharing one sandbox pool of
   four interpreters. Reports steps/s, and p50/p99 latency of tool steps and of answer steps.
2. Grading throughput, side by side: a pool of 1 worker (the old single grader) and the default pool
   (`default_workers()`, from the core count). Each grades the 500 MATH-500 answers, every reference against
   a perturbed copy (last integer + 1, or "+1" appended: a real math-verify comparison, never the literal
   fast path), with one pathological answer (`9^{9^{9^{9^{9}}}}`) in every 50, all submitted at once through
   `agrade` from `--concurrency` coroutines (many trajectories in flight). Reports grades/s, timeouts and the
   p50/p99 latency of the ordinary grades. Needs ../shared/data/benchmarks/math500.jsonl (skipped, saying
   so, when it is absent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import threading
import time
from pathlib import Path

import gymnasium as gym

import stare_agents.envs  # noqa: F401  (registers the ids)
from stare_agents.envs import MathGrader
from stare_agents.envs.grading import default_workers

MATH500 = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks" / "math500.jsonl"
PINNED = {"problem": "What is 6 times 7?", "answer": "42"}
SCRIPT = [
    "First I set up the numbers.\n```python\nx = 6\ny = 7\nprint(x * y)\n```",
    "Let me double-check with a loop.\n```python\nprint(sum(x for _ in range(y)))\n```",
    "Both give 42, so the answer is \\boxed{42}.",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def run_episodes(
    sandbox, episodes: int, tool_lat: list[float], answer_lat: list[float], steps_out: list[int] | None = None
) -> int:
    """Run scripted episodes on one environment; latencies go to the lists, the step count to `steps_out`."""
    env = gym.make("stare_agents/MathTIR-v0", sandbox=sandbox)
    steps = 0
    for episode in range(episodes):
        env.reset(seed=episode, options=PINNED)
        for action in SCRIPT:
            started = time.perf_counter()
            _, reward, terminated, truncated, info = env.step(action)
            elapsed = time.perf_counter() - started
            steps += 1
            (answer_lat if terminated else tool_lat).append(elapsed)
            if terminated or truncated:
                assert reward == 1.0 and info["tool_calls"] == 2 and info["tool_errors"] == 0, info
                break
    env.close()
    if steps_out is not None:
        steps_out.append(steps)
    return steps


def bench_mathtir(backend: str, episodes: int, env_counts: list[int]) -> list[dict]:
    from stare_agents.sandbox import make_sandbox

    results = []
    for count in env_counts:
        sandbox = make_sandbox(backend, pool_size=max(2, count))  # type: ignore[arg-type]
        kind = type(sandbox).__name__
        sandbox.start()
        run_episodes(sandbox, 2, [], [])  # warm-up: imports, first leases
        tool_lat: list[float] = []
        answer_lat: list[float] = []
        per_env = max(1, episodes // count)
        totals: list[int] = []
        started = time.perf_counter()

        threads = [
            threading.Thread(target=run_episodes, args=(sandbox, per_env, tool_lat, answer_lat, totals))
            for _ in range(count)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        sandbox.close()
        results.append(
            {
                "sandbox": kind,
                "envs": count,
                "episodes": per_env * count,
                "steps": sum(totals),
                "steps_per_s": sum(totals) / wall,
                "tool_step_p50_ms": 1000 * percentile(tool_lat, 50),
                "tool_step_p99_ms": 1000 * percentile(tool_lat, 99),
                "answer_step_p50_ms": 1000 * percentile(answer_lat, 50),
                "answer_step_p99_ms": 1000 * percentile(answer_lat, 99),
            }
        )
        print(json.dumps(results[-1]), flush=True)
    return results


def perturb(answer: str) -> str:
    """A plausible wrong answer: bump the last integer in it, or append "+1" when there is none."""
    numbers = list(re.finditer(r"\d+", answer))
    if numbers:
        last = numbers[-1]
        return answer[: last.start()] + str(int(last.group()) + 1) + answer[last.end() :]
    return answer + "+1"


PATHOLOGICAL = "9^{9^{9^{9^{9}}}}"


def grading_workload(rows: list[dict]) -> list[tuple[str, str, bool]]:
    """(response, reference, pathological) for every row: a perturbed answer, and every 50th a pathological one."""
    work = []
    for index, row in enumerate(rows):
        pathological = index % 50 == 49
        answer = PATHOLOGICAL if pathological else perturb(row["answer"])
        work.append((f"The answer is \\boxed{{{answer}}}.", row["answer"], pathological))
    return work


async def grade_all(grader: MathGrader, work: list, concurrency: int) -> tuple[list, list[float]]:
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = [0.0] * len(work)

    async def one(index: int, response: str, reference: str):
        async with semaphore:
            started = time.perf_counter()
            result = await grader.agrade(response, reference)
            latencies[index] = time.perf_counter() - started
            return result

    results = await asyncio.gather(*(one(i, r, ref) for i, (r, ref, _) in enumerate(work)))
    return results, latencies


def bench_grader_throughput(concurrency: int, timeout_s: float) -> list[dict] | None:
    if not MATH500.exists():
        print(f"grading throughput: skipped, {MATH500} not found (the shared data folder is optional)")
        return None
    rows = [json.loads(line) for line in MATH500.read_text().splitlines() if line.strip()]
    work = grading_workload(rows)
    results = []
    for workers in (1, default_workers()):
        grader = MathGrader(timeout_s=timeout_s, workers=workers)
        started = time.perf_counter()
        grader.start()
        startup = time.perf_counter() - started
        started = time.perf_counter()
        graded, latencies = asyncio.run(grade_all(grader, work, concurrency))
        wall = time.perf_counter() - started
        grader.close()
        ordinary = [lat for lat, (_, _, bad) in zip(latencies, work, strict=True) if not bad]
        reasons: dict[str, int] = {}
        for result in graded:
            reasons[result.reason] = reasons.get(result.reason, 0) + 1
        results.append(
            {
                "workers": workers,
                "grades": len(work),
                "pathological": sum(bad for *_, bad in work),
                "wall_s": wall,
                "grades_per_s": len(work) / wall,
                "timeouts": grader.stats.timeouts,
                "worker_starts": grader.stats.worker_starts,
                "startup_s": startup,
                "ordinary_p50_ms": 1000 * statistics.median(ordinary),
                "ordinary_p99_ms": 1000 * percentile(ordinary, 99),
                "wrongly_accepted": sum(r.correct for r in graded),
                "reasons": reasons,
            }
        )
        print(json.dumps(results[-1]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="auto", choices=("auto", "docker", "local"))
    parser.add_argument(
        "--episodes", type=int, default=60, help="scripted MathTIR episodes per configuration"
    )
    parser.add_argument("--envs", default="1,4", help="comma-separated environment counts (threads)")
    parser.add_argument("--only", choices=("mathtir", "grader"), default=None, help="run one part only")
    parser.add_argument("--concurrency", type=int, default=16, help="grades in flight at once")
    parser.add_argument("--grader-timeout", type=float, default=5.0, help="MathGrader timeout_s")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    print(f"host: {platform.platform()}, python {platform.python_version()}, {os.cpu_count()} cores")
    mathtir = grader = None
    if args.only in (None, "mathtir"):
        mathtir = bench_mathtir(args.backend, args.episodes, [int(n) for n in args.envs.split(",")])
        print(
            "\n| sandbox | envs | steps | steps/s | tool step p50 / p99 (ms) | answer step p50 / p99 (ms) |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for r in mathtir:
            print(
                f"| {r['sandbox']} | {r['envs']} | {r['steps']} | {r['steps_per_s']:.1f} | "
                f"{r['tool_step_p50_ms']:.1f} / {r['tool_step_p99_ms']:.1f} | "
                f"{r['answer_step_p50_ms']:.1f} / {r['answer_step_p99_ms']:.1f} |"
            )
    if args.only in (None, "grader"):
        grader = bench_grader_throughput(args.concurrency, args.grader_timeout)
        if grader:
            print(
                f"\ngrading MATH-500 ({grader[0]['grades']} grades, {grader[0]['pathological']} pathological, "
                f"{args.concurrency} in flight, timeout {args.grader_timeout:g} s):"
            )
            print("| workers | grades/s | wall s | timeouts | ordinary p50 / p99 (ms) | wrongly accepted |")
            print("| --- | --- | --- | --- | --- | --- |")
            for r in grader:
                print(
                    f"| {r['workers']} | {r['grades_per_s']:.1f} | {r['wall_s']:.1f} | {r['timeouts']} | "
                    f"{r['ordinary_p50_ms']:.1f} / {r['ordinary_p99_ms']:.1f} | {r['wrongly_accepted']} |"
                )
    if args.json:
        args.json.write_text(json.dumps({"mathtir": mathtir, "grader": grader}, indent=2))


if __name__ == "__main__":
    main()
