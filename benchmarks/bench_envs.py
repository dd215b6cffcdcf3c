"""Environment benchmarks: MathTIR steps/s through the sandbox, and grader latency on MATH-500 answers.

    .venv/bin/python benchmarks/bench_envs.py [--backend auto|docker|local] [--episodes 60] [--envs 1,4]

1. MathTIR-v0 throughput. Each scripted episode is three steps: two Python tool calls (the second reads a
   variable the first set, so the session must be stateful) and a boxed final answer that is graded. With
   `--envs 1,4` it runs one environment, then four environments in threads sharing one sandbox pool of
   four interpreters. Reports steps/s, and p50/p99 latency of tool steps and of answer steps.
2. Grader latency. Every MATH-500 reference answer is graded against itself (must be "correct") and against
   a perturbed copy (must not be), through the default long-lived grading worker. Reports accuracy and
   p50/p99 per call. Uses ../shared/data/benchmarks/math500.jsonl when present, else the built-in demo set
   (and says so).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import threading
import time
from pathlib import Path

import gymnasium as gym

import stare_agents.envs  # noqa: F401  (registers the ids)
from stare_agents.envs import MathGrader, grade_answer
from stare_agents.envs.math_envs import DEMO_MATH_ROWS

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


def bench_grader(limit: int | None) -> dict:
    if MATH500.exists():
        rows = [json.loads(line) for line in MATH500.read_text().splitlines() if line.strip()]
        source = "MATH-500"
    else:
        rows, source = DEMO_MATH_ROWS, "built-in demo set (../shared/data absent)"
        print(f"note: {MATH500} not found; grading the {len(rows)} demo answers instead")
    rows = rows[:limit] if limit else rows
    grader = MathGrader()
    started = time.perf_counter()
    grade_answer("\\boxed{1}", "1", grader=grader)  # start the worker outside the timings
    startup = time.perf_counter() - started
    same_lat, perturbed_lat = [], []
    same_correct = perturbed_rejected = 0
    reasons: dict[str, int] = {}
    for row in rows:
        reference = row["answer"]
        t0 = time.perf_counter()
        same = grade_answer(f"The answer is \\boxed{{{reference}}}.", reference, grader=grader)
        same_lat.append(time.perf_counter() - t0)
        same_correct += same.correct
        wrong = perturb(reference)
        t0 = time.perf_counter()
        other = grade_answer(f"The answer is \\boxed{{{wrong}}}.", reference, grader=grader)
        perturbed_lat.append(time.perf_counter() - t0)
        perturbed_rejected += not other.correct
        reasons[other.reason] = reasons.get(other.reason, 0) + 1
    grader.close()
    result = {
        "source": source,
        "answers": len(rows),
        "worker_startup_s": startup,
        "self_correct": same_correct,
        "perturbed_rejected": perturbed_rejected,
        "perturbed_reasons": reasons,
        "self_p50_ms": 1000 * statistics.median(same_lat),
        "self_p99_ms": 1000 * percentile(same_lat, 99),
        "perturbed_p50_ms": 1000 * statistics.median(perturbed_lat),
        "perturbed_p99_ms": 1000 * percentile(perturbed_lat, 99),
        "all_p50_ms": 1000 * statistics.median(same_lat + perturbed_lat),
        "all_p99_ms": 1000 * percentile(same_lat + perturbed_lat, 99),
        "max_ms": 1000 * max(same_lat + perturbed_lat),
        "restarts": grader.restarts,
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="auto", choices=("auto", "docker", "local"))
    parser.add_argument(
        "--episodes", type=int, default=60, help="scripted MathTIR episodes per configuration"
    )
    parser.add_argument("--envs", default="1,4", help="comma-separated environment counts (threads)")
    parser.add_argument("--grader-limit", type=int, default=None, help="grade only the first N answers")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    print(f"host: {platform.platform()}, python {platform.python_version()}")
    mathtir = bench_mathtir(args.backend, args.episodes, [int(n) for n in args.envs.split(",")])
    grader = bench_grader(args.grader_limit)
    print("\n| sandbox | envs | steps | steps/s | tool step p50 / p99 (ms) | answer step p50 / p99 (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in mathtir:
        print(
            f"| {r['sandbox']} | {r['envs']} | {r['steps']} | {r['steps_per_s']:.1f} | "
            f"{r['tool_step_p50_ms']:.1f} / {r['tool_step_p99_ms']:.1f} | "
            f"{r['answer_step_p50_ms']:.1f} / {r['answer_step_p99_ms']:.1f} |"
        )
    g = grader
    print(
        f"\ngrader on {g['source']} ({g['answers']} answers; worker start-up {g['worker_startup_s']:.2f} s):"
    )
    print(
        f"  self-graded correct: {g['self_correct']}/{g['answers']}, perturbed rejected: {g['perturbed_rejected']}/{g['answers']} {g['perturbed_reasons']}"
    )
    print(
        f"  self p50/p99: {g['self_p50_ms']:.2f} / {g['self_p99_ms']:.2f} ms; perturbed p50/p99: {g['perturbed_p50_ms']:.2f} / {g['perturbed_p99_ms']:.2f} ms; max {g['max_ms']:.1f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps({"mathtir": mathtir, "grader": grader}, indent=2))


if __name__ == "__main__":
    main()
