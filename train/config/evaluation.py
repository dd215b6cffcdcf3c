"""The evaluation section of the training configuration (`eval`): held-out tasks during the run, and the
benchmarks (`eval.benchmarks`, each a `BenchmarkEval`) evaluated with the eval harness, checked where the config
loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare_agents.sandbox import DEFAULT_BACKEND, backend_class
from stare_agents.train.config.typed import build


@dataclass
class BenchmarkEval:
    """One held-out benchmark evaluated during training (every eval.every RL steps and at the end) with the
    eval harness (`stare_agents.eval`), as `stare-agents eval` would evaluate it."""

    benchmark: str  # a harness name (aime24, math500, ...: <eval.data_dir>/<name>.jsonl), a file or a HF id
    protocol: str = "tir"  # the harness's protocol: tir, cot, cot-long, simpletir, arith
    k: int = 1  # samples per problem: avg@k and pass@k
    limit: int | None = None  # only the first `limit` problems
    # None: the protocol's own setting
    temperature: float | None = None
    top_p: float | None = None
    max_turns: int | None = None
    max_tokens_per_turn: int | None = None
    max_total_tokens: int | None = None

    def eval_config(self, run: Any) -> Any:
        """The eval harness's settings (`stare_agents.eval.EvalConfig`) for this benchmark during run `run` (a TrainConfig): its own
        protocol, k, limit and overrides, and the run's engine, rendering, sandbox, seed and intervals."""
        from stare_agents.eval import EvalConfig

        return EvalConfig(
            protocol=self.protocol,
            samples=self.k,
            temperature=self.temperature,
            top_p=self.top_p,
            max_turns=self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            max_total_tokens=self.max_total_tokens,
            limit=self.limit,
            data_dir=run.eval.data_dir,
            engine=run.rollout.engine,
            dtype=run.model.rollout_dtype,
            rendering=run.rollout.rendering,
            # the workers' sandbox runs the tools; with one that runs none only single-turn protocols run
            # (see RunEvaluation.benchmarks), and the settings name the sandbox a tool protocol would get
            sandbox=run.rollout.sandbox if backend_class(run.rollout.sandbox).runs_code else DEFAULT_BACKEND,
            max_concurrency=run.rollout.max_concurrency,
            max_model_len=run.model.max_model_len,
            seed=run.seed,
            bootstrap=run.eval.bootstrap,
        )


@dataclass
class EvalSection:
    # held-out tasks (distinct problems; environments that take a `split` draw them from split="heldout" and
    # train on split="train", so no training draw can be an evaluation problem)
    num_tasks: int = 64  # 0: no held-out tasks of the environment (evaluate on eval.benchmarks only)
    base_num_tasks: int | None = (
        None  # held-out tasks for the base model (the first of them; None: num_tasks)
    )
    every: int = 0  # also evaluate every N RL steps (0: only before SFT, after SFT and at the end)
    every_num_tasks: int | None = None  # held-out tasks for the evaluations during RL (None: num_tasks)
    temperature: float = 0.0  # 0: greedy accuracy
    samples: int = 1  # samples per task (a task's score is their mean)
    bootstrap: int = 2000  # resamples of the tasks for the 95% intervals (paired for differences)
    # benchmarks evaluated every `every` RL steps and at the end of RL, into <run>/evals/step-NNNNNN/<name>/;
    # each a BenchmarkEval mapping, or just the benchmark (protocol tir, k 1)
    benchmarks: list[BenchmarkEval] = field(default_factory=list)
    data_dir: str | None = None  # where benchmark names resolve (None: $STARE_DATA_DIR, else ../shared/data)

    def __post_init__(self) -> None:
        sizes = (self.base_num_tasks or 1, self.every_num_tasks or 1, self.samples)
        if min(sizes) < 1 or min(self.num_tasks, self.every, self.bootstrap) < 0:
            raise ValueError(
                "need eval.base_num_tasks, eval.every_num_tasks, eval.samples >= 1 and eval.num_tasks, "
                f"eval.every, eval.bootstrap >= 0; got {self}"
            )
        self.benchmarks = check_benchmarks(self.benchmarks, self.data_dir)


def check_benchmarks(entries: Any, data_dir: str | None) -> list[BenchmarkEval]:
    """`eval.benchmarks` as BenchmarkEval entries, each checked where the config loads: the protocol and its
    overrides, k, and the benchmark itself (a name or file is read and checked now; a Hugging Face id is
    loaded when the run starts)."""
    from stare_agents.eval import get_protocol, load_benchmark

    if not isinstance(entries, list | tuple):
        raise ValueError(f"eval.benchmarks must be a list of benchmarks, got {entries!r}")
    out: list[BenchmarkEval] = []
    names: dict[str, str] = {}
    for i, entry in enumerate(entries):
        where = f"eval.benchmarks[{i}]"
        if isinstance(entry, str):
            entry = BenchmarkEval(benchmark=entry)
        elif isinstance(entry, dict):
            entry = build(BenchmarkEval, entry, where + ".")
        elif not isinstance(entry, BenchmarkEval):
            raise ValueError(f"{where}: expected a benchmark name, file or mapping, got {entry!r}")
        if not isinstance(entry.k, int) or isinstance(entry.k, bool) or entry.k < 1:
            raise ValueError(f"{where}.k = {entry.k!r}: samples per problem must be an integer >= 1")
        if entry.limit is not None and entry.limit < 1:
            raise ValueError(f"{where}.limit = {entry.limit!r}: must be >= 1 problems (or null for all)")
        try:
            get_protocol(entry.protocol)
        except ValueError as error:
            raise ValueError(f"{where}.protocol = {entry.protocol!r}: {error}") from None
        try:
            benchmark_protocol(entry)
        except ValueError as error:
            raise ValueError(f"{where} (temperature, top_p, max_turns, token budgets): {error}") from None
        try:
            name = _benchmark_name(entry, data_dir, load_benchmark)
        except (ValueError, FileNotFoundError, KeyError, RuntimeError) as error:
            raise ValueError(f"{where}.benchmark = {entry.benchmark!r}: {error}") from None
        if name in names:
            raise ValueError(
                f"{where}.benchmark = {entry.benchmark!r} has the name {name!r} of {names[name]}: results are "
                "kept by name; rename one of the files"
            )
        names[name] = where
        out.append(entry)
    return out


def benchmark_protocol(entry: BenchmarkEval) -> Any:
    """The eval harness's protocol of a benchmark entry, with its overrides applied (and checked)."""
    from stare_agents.eval import get_protocol

    return get_protocol(entry.protocol).override(
        temperature=entry.temperature,
        top_p=entry.top_p,
        max_turns=entry.max_turns,
        max_tokens_per_turn=entry.max_tokens_per_turn,
        max_total_tokens=entry.max_total_tokens,
    )


def _benchmark_name(entry: BenchmarkEval, data_dir: str | None, load_benchmark: Any) -> str:
    from stare_agents.eval import BENCHMARK_FILES, benchmark_source, data_dir_found

    if entry.benchmark in BENCHMARK_FILES and not data_dir_found(data_dir):
        # no data folder on this machine yet (a recipe shown or checked before the data is fetched): the name
        # is looked up when the run starts, before any work (RunEvaluation.benchmarks), as datasets are
        return entry.benchmark
    name, source = benchmark_source(entry.benchmark, data_dir=data_dir)
    if source != entry.benchmark or Path(source).exists():  # a name or a file: read and check it now
        load_benchmark(entry.benchmark, data_dir=data_dir, limit=entry.limit)
    return name
