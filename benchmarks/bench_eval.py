"""Evaluation throughput: problems per minute on a MATH-500 slice under the `tir` and `cot` protocols, and
where the time goes (generation, sandbox, grading).

    flock /tmp/stare-heavy.lock .venv/bin/python benchmarks/bench_eval.py --model smollm2-135m --limit 20

Each protocol runs `stare_agents.eval.evaluate` in this process (one vLLM engine, one sandbox) on the first
`--limit` MATH-500 problems, one sample each. The engine's start-up is timed apart; the rest of the run is
the evaluation's wall time. Generation, sandbox calls and grading are timed by wrapping
`VLLMEngine.generate`, `Session.run` and `MathGrader.grade/compare` for the run: each figure is the time
during which at least one such call was in progress (the union of their intervals), as a share of the
evaluation's wall time. Episodes run concurrently, so the shares overlap and need not add up to 100%.
Needs the benchmark data (`--data-dir` or $STARE_DATA_DIR, default ../shared/data/benchmarks).
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


class IntervalClock:
    """Records (start, end) of calls from any thread; `busy(since, until)` is the union of them."""

    def __init__(self) -> None:
        self.intervals: list[tuple[float, float]] = []
        self.calls = 0
        self._lock = threading.Lock()

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self.intervals.append((start, end))
            self.calls += 1

    def busy(self) -> float:
        total, current_start, current_end = 0.0, None, None
        for start, end in sorted(self.intervals):
            if current_end is None or start > current_end:
                if current_end is not None:
                    total += current_end - current_start
                current_start, current_end = start, end
            else:
                current_end = max(current_end, end)
        if current_end is not None:
            total += current_end - current_start
        return total

    def reset(self) -> None:
        with self._lock:
            self.intervals, self.calls = [], 0


def time_sync(owner: type, name: str, clock: IntervalClock) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            clock.add(start, time.perf_counter())

    setattr(owner, name, timed)


def time_async(owner: type, name: str, clock: IntervalClock) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            clock.add(start, time.perf_counter())

    setattr(owner, name, timed)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from stare_agents.envs.grading import MathGrader
    from stare_agents.eval import EvalConfig, evaluate, load_benchmark
    from stare_agents.eval.harness import RolloutRunner
    from stare_agents.models import prepare_model
    from stare_agents.rollout.hf_engine import HFEngine
    from stare_agents.rollout.vllm_engine import VLLMEngine
    from stare_agents.sandbox.session import Session

    clocks = {name: IntervalClock() for name in ("generation", "sandbox", "grading")}
    time_async(VLLMEngine, "generate", clocks["generation"])
    time_async(HFEngine, "generate", clocks["generation"])
    time_sync(Session, "run", clocks["sandbox"])
    time_sync(MathGrader, "grade", clocks["grading"])
    time_sync(MathGrader, "compare", clocks["grading"])

    model_dir = prepare_model(args.model)
    bench = load_benchmark("math500", data_dir=args.data_dir, limit=args.limit)
    rows = []
    for protocol in args.protocols:
        config = EvalConfig(
            protocol=protocol,
            samples=args.k,
            temperature=args.temperature,
            top_p=args.top_p,
            max_tokens_per_turn=args.max_tokens_per_turn,
            max_total_tokens=args.max_tokens,
            engine=args.engine,
            dtype=args.dtype,
            sandbox=args.sandbox,
            chunk_size=args.limit * args.k,
            bootstrap=1000,
        )
        started = time.perf_counter()
        runner = RolloutRunner(str(model_dir), config.resolve_protocol(), config)
        startup_s = time.perf_counter() - started
        for clock in clocks.values():
            clock.reset()
        out = Path(tempfile.mkdtemp(prefix=f"bench_eval_{protocol}_"))
        try:
            started = time.perf_counter()
            results = evaluate(model_dir, [bench], config, out=out, runner=runner, progress=False)
            wall_s = time.perf_counter() - started
            runtime = runner.describe()
        finally:
            runner.close()
        entry = results["benchmarks"]["math500"]
        behavior = entry["behavior"]
        rows.append(
            {
                "protocol": protocol,
                "problems": len(bench),
                "samples": entry["metrics"]["samples"],
                "engine_startup_s": round(startup_s, 1),
                "wall_s": round(wall_s, 1),
                "problems_per_min": round(60 * len(bench) / wall_s, 2),
                **{f"{name}_busy_s": round(clock.busy(), 3) for name, clock in clocks.items()},
                **{f"{name}_busy_share": round(clock.busy() / wall_s, 4) for name, clock in clocks.items()},
                **{f"{name}_calls": clock.calls for name, clock in clocks.items()},
                "accuracy": entry["metrics"]["avg"]["value"],
                "failed": entry["metrics"]["failed"],
                "mean_response_tokens": behavior["response_tokens_mean"],
                "tool_calls_per_response": behavior["tool_calls_per_response"],
                "turns_mean": behavior["turns_mean"],
                "sandbox_backend": runtime["sandbox_backend"],
                "out": str(out),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--limit", type=int, default=20, help="MATH-500 problems (the first N)")
    parser.add_argument("--k", type=int, default=1, help="samples per problem")
    parser.add_argument("--protocols", nargs="+", default=["tir", "cot"])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens-per-turn", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=1536, help="response budget per episode")
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--sandbox", default="docker")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    rows = run(args)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.model} on MATH-500[:{args.limit}], k={args.k}")
    columns = ["protocol", "problems_per_min", "wall_s", "engine_startup_s", "generation_busy_s",
               "sandbox_busy_s", "grading_busy_s", "accuracy", "mean_response_tokens", "tool_calls_per_response"]  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
