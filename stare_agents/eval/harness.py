"""The evaluation harness: every problem of every benchmark sampled k times through the rollout layer.

    from stare_agents.eval import EvalConfig, evaluate
    results = evaluate("runs/checkpoint-200", ["aime24", "math500"], EvalConfig(protocol="tir", samples=4),
                       out="evals/ckpt200")

How it runs:

1. Settings are resolved once: the protocol (`tir`, `cot`, `simpletir`), the preset (`paper`: 32 samples
   on AIME/AMC, 4 elsewhere, temperature 1.0, top_p 0.7), then explicit overrides.
2. Every (benchmark, problem, sample index) is one `RolloutTask` of the protocol's environment, pinned to the
   problem with `reset(options={"problem", "answer", "id"})`, with its own seed derived from the run seed
   and the sample's identity, and `group_id` "<benchmark>/<problem id>".
3. Tasks run in chunks through a runner: `RolloutWorkerGroup` (Ray actors, `workers >= 1`) or the
   in-process `collect` (`workers = 0`). After each chunk its samples are appended to `samples.jsonl`,
   flushed and fsynced.
4. An interrupted run started again with the same folder and settings resumes: samples already in
   `samples.jsonl` are kept and not redone (a torn last line is cut off); different settings or a different
   model in the same folder is an error. `run.json` holds what a resume must match. A kept sample is not
   taken on trust: a record without exactly the known fields of their types refuses the file by name (the
   folder is left as it was), and every record is graded again from its own response text by the protocol
   environment's `score` (`regrade_resumed`): one whose grade, extracted answer or reward is not what that
   gives (an edited or forged record, or one graded by another grader) is set aside into
   `samples.rejected.jsonl`, sampled again, and counted in results.json (`timing.samples_regraded_rerun`).
5. At the end `results.json`, `results.md` and `pass_at_k.png` are computed from `samples.jsonl` alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare_agents.envs import Task
from stare_agents.envs.registration import import_modules
from stare_agents.eval.benchmarks import (
    Benchmark,
    Protocol,
    get_preset,
    get_protocol,
    load_benchmark,
)
from stare_agents.eval.metrics import BenchmarkMetrics
from stare_agents.eval.report import (
    RESULTS_FILE,
    SAMPLES_FILE,
    append_samples,
    build_results,
    drop_torn_tail,
    metrics_of,
    model_identity,
    read_samples,
    sample_key,
    sample_record,
    write_results,
)
from stare_agents.jsonl import dumps
from stare_agents.rollout.engine import DTYPES, ENGINES
from stare_agents.rollout.render import RENDERINGS
from stare_agents.sandbox import BACKENDS, backend_class
from stare_agents.trajectory import Trajectory

logger = logging.getLogger("stare_agents.eval")

RUN_FILE = "run.json"
# the closed word sets are the rollout layer's and the sandbox's; an evaluation runs its tools, so only the
# backends that run code ("auto": an older name of "docker", never the host)
SANDBOXES = tuple(b for b in BACKENDS if backend_class(b).runs_code)


@dataclass
class EvalConfig:
    """Everything that decides an evaluation's numbers (and how it is run).

    protocol: "tir", "cot", "cot-long", "simpletir" or "arith" (see `benchmarks.PROTOCOLS`).
    samples: samples per problem (the k of avg@k); None: the preset's count per benchmark, else 1.
    preset: None or "paper" (samples per benchmark and the sampling the paper reports with).
    temperature / top_p / max_turns / max_tokens_per_turn / max_total_tokens: override the protocol (and
        the preset's sampling) when given.
    limit: evaluate only the first `limit` problems of each benchmark.
    data_dir / fields / split: where benchmark names resolve, column mapping, split of dataset ids.
    workers: Ray rollout workers (each one engine and one sandbox); 0 runs in this process without Ray.
    engine: "vllm" or "hf"; dtype: "auto", "float32" or "bfloat16"; rendering: "auto", "chat" or "inline";
    sandbox: "docker" or "local" (model-written code on this host: needs STARE_ALLOW_LOCAL_SANDBOX=1).
    max_concurrency: episodes in flight per worker. max_model_len: the engine's context window (None:
        1024 prompt tokens + the protocol's response budget, within the model's max_position_embeddings).
    seed: the run seed; each sample's seed is derived from it and the sample's identity.
    imports: modules imported first, here and in every rollout worker (the current folder searched first):
        they register your environments and may add protocols to `benchmarks.PROTOCOLS`.
    chunk_size: tasks per chunk; a killed run loses at most the chunk in flight.
    bootstrap / confidence: bootstrap resamples and level of the intervals.
    """

    protocol: str = "tir"
    samples: int | None = None
    preset: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_turns: int | None = None
    max_tokens_per_turn: int | None = None
    max_total_tokens: int | None = None
    limit: int | None = None
    data_dir: str | None = None
    fields: dict[str, str] | None = None
    split: str = "test"
    workers: int = 0
    engine: str = "vllm"
    dtype: str = "auto"
    rendering: str = "auto"
    sandbox: str = "docker"
    max_concurrency: int = 64
    max_model_len: int | None = None
    seed: int = 0
    chunk_size: int = 64
    bootstrap: int = 1000
    confidence: float = 0.95
    imports: list[str] = field(default_factory=list)

    def check(self) -> None:
        if self.samples is not None and self.samples < 1:
            raise ValueError(f"samples per problem (--k) must be >= 1, got {self.samples}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = in-process), got {self.workers}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 problems, got {self.limit}")
        if self.bootstrap < 0:
            raise ValueError(f"bootstrap must be >= 0 resamples, got {self.bootstrap}")
        for name, value, allowed in (
            ("engine", self.engine, ENGINES),
            ("dtype", self.dtype, DTYPES),
            ("rendering", self.rendering, RENDERINGS),
            ("sandbox", self.sandbox, SANDBOXES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 tokens, got {self.max_model_len}")

    def resolve_protocol(self) -> Protocol:
        """The protocol with the preset's sampling, then the explicit overrides, applied."""
        protocol = get_protocol(self.protocol)
        preset = get_preset(self.preset) if self.preset else None
        return protocol.override(
            temperature=self.temperature if self.temperature is not None else (preset and preset.temperature),
            top_p=self.top_p if self.top_p is not None else (preset and preset.top_p),
            max_turns=self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            max_total_tokens=self.max_total_tokens,
        )

    def samples_for(self, benchmark: str) -> int:
        if self.samples is not None:
            return self.samples
        if self.preset:
            return get_preset(self.preset).samples_for(benchmark)
        return 1


@dataclass(frozen=True)
class SampleSpec:
    """One sample to draw: a benchmark problem, its sample index and its seed."""

    benchmark: str
    task: Task
    sample_index: int
    seed: int

    @property
    def group_id(self) -> str:
        return f"{self.benchmark}/{self.task.id}"

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.benchmark, self.task.id, self.sample_index)


def sample_seed(run_seed: int, benchmark: str, problem_id: str, sample_index: int) -> int:
    """A 31-bit seed for one sample, stable across runs, resumption and chunking."""
    text = json.dumps([run_seed, benchmark, problem_id, sample_index])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


class Runner(typing.Protocol):
    """Turns samples into trajectories, in order. `RolloutRunner` is the real one."""

    def collect(self, specs: Sequence[SampleSpec]) -> list[Trajectory]: ...

    def close(self) -> None: ...


class RolloutRunner:
    """Samples through the rollout layer: a `RolloutWorkerGroup` of Ray actors (`workers >= 1`) or one
    worker in this process (`workers = 0`). Each worker holds one engine and one sandbox (none for
    single-turn protocols). `RolloutRunner.on_workers` runs on a group that is already up instead."""

    def __init__(self, model_dir: str, protocol: Protocol, config: EvalConfig) -> None:
        from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec

        self._setup(protocol, config)
        self.spec = WorkerSpec(
            model=model_dir,
            engine=config.engine,
            dtype=config.dtype,
            seed=config.seed,
            max_model_len=config.max_model_len or default_max_model_len(model_dir, protocol),
            sandbox="none" if protocol.single_turn else config.sandbox,
            imports=list(config.imports),
        )
        self.group = RolloutWorkerGroup(self.spec, max(1, config.workers), use_ray=config.workers > 0)
        self.owns_group = True

    @classmethod
    def on_workers(cls, group: Any, protocol: Protocol, config: EvalConfig) -> RolloutRunner:
        """A runner on rollout workers that are already running (a training run's, with its current weights):
        the group's engines, sandboxes and context window; `close()` leaves the group running."""
        runner = cls.__new__(cls)
        runner._setup(protocol, config)
        runner.spec = group.spec
        runner.group = group
        runner.owns_group = False
        return runner

    def _setup(self, protocol: Protocol, config: EvalConfig) -> None:
        from stare_agents.rollout import RolloutConfig, RolloutTask

        self.task_class = RolloutTask
        self.protocol = protocol
        self.env_kwargs = protocol.make_env_kwargs()
        self.rollout_config = RolloutConfig(
            temperature=protocol.temperature,
            top_p=protocol.top_p,
            max_tokens_per_turn=protocol.max_tokens_per_turn,
            max_total_tokens=protocol.max_total_tokens,
            rendering=config.rendering,
            max_concurrency=config.max_concurrency,
            seed=config.seed,
        )

    def describe(self) -> dict[str, Any]:
        """What actually ran (e.g. which sandbox backend "auto" chose), for the results."""
        workers = self.group.ping()
        return {
            "workers": len(workers),
            "use_ray": self.group.use_ray,
            "sandbox_backend": workers[0]["sandbox"] if workers else None,
            "max_model_len": self.spec.max_model_len,
        }

    def collect(self, specs: Sequence[SampleSpec]) -> list[Trajectory]:
        tasks = []
        for s in specs:
            row = {"problem": s.task.problem, "answer": s.task.answer, "id": s.task.id}
            tasks.append(
                self.task_class(
                    env_id=self.protocol.env_id,
                    options=row,  # pins the episode to this problem
                    seed=s.seed,
                    # the problem is also the env's whole dataset (so it never falls back to demo problems)
                    env_kwargs={**self.env_kwargs, "dataset": [row]},
                    group_id=s.group_id,
                    sample_index=s.sample_index,
                )
            )
        return self.group.collect(tasks, self.rollout_config, progress=False)

    def close(self) -> None:
        if self.owns_group:
            self.group.close()


PROMPT_ROOM_TOKENS = 1024


def default_max_model_len(model_dir: str, protocol: Protocol) -> int:
    """Room for the prompt plus the protocol's response budget, within the model's own context length."""
    wanted = PROMPT_ROOM_TOKENS + protocol.max_total_tokens
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        limit = int(config.get("max_position_embeddings") or wanted)
    except (OSError, ValueError, TypeError):
        return wanted
    return min(wanted, limit)


def run_settings(
    config: EvalConfig, protocol: Protocol, benchmarks: Sequence[Benchmark], model: dict[str, Any]
) -> dict[str, Any]:
    """What decides the numbers (a resume must match it) — not how many workers or chunks ran them."""
    return {
        "protocol": protocol.to_dict(),
        "preset": config.preset,
        "samples": {b.name: config.samples_for(b.name) for b in benchmarks},
        "benchmarks": {
            b.name: {"source": b.source, "problems": len(b), "content": benchmark_fingerprint(b)}
            for b in benchmarks
        },
        "limit": config.limit,
        "fields": config.fields,
        "split": config.split,
        "seed": config.seed,
        "engine": config.engine,
        "dtype": config.dtype,
        "rendering": config.rendering,
        "sandbox": config.sandbox,
        "max_model_len": config.max_model_len,
        # the model's content when it is a folder (moving it does not matter), else its name
        "model": model.get("fingerprint") or model.get("path"),
    }


def benchmark_fingerprint(benchmark: Benchmark) -> str:
    """A hash of a benchmark's problems (ids, texts, answers): the data, wherever its file lives."""
    rows = [[t.id, t.problem, str(t.answer)] for t in benchmark.tasks]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()[:16]


def _resume_key(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings a resume must match: all of them, except where the benchmark files live."""
    key = json.loads(json.dumps(settings))
    for entry in (key.get("benchmarks") or {}).values():
        entry.pop("source", None)
    return key


def _check_resume(out: Path, settings: dict[str, Any]) -> None:
    run_file = out / RUN_FILE
    samples_file = out / SAMPLES_FILE
    if not run_file.exists():
        if samples_file.exists() and samples_file.stat().st_size > 0:
            raise FileExistsError(
                f"{samples_file} exists but {run_file} does not: {out} is not a resumable evaluation folder. "
                "Use another --out folder."
            )
        return
    previous = _resume_key(json.loads(run_file.read_text(encoding="utf-8"))["settings"])
    settings = _resume_key(settings)
    differing = sorted(key for key in set(previous) | set(settings) if previous.get(key) != settings.get(key))
    if differing:
        details = "; ".join(
            f"{key}: was {previous.get(key)!r}, now {settings.get(key)!r}" for key in differing
        )
        raise ValueError(
            f"{out} holds an evaluation with other settings ({details}). Resuming would mix them: use another "
            "--out folder, or the same settings to resume that run."
        )


_INT, _NUMBER, _TEXT = (int,), (int, float), (str,)
_NONE = (type(None),)
SAMPLE_TYPES: dict[str, tuple[type, ...]] = {  # what each samples.jsonl field must hold (bool is no int here)
    "benchmark": _TEXT,
    "problem_id": _TEXT,
    "sample_index": _INT,
    "seed": _INT + _NONE,
    "correct": (bool,),
    "reward": _NUMBER,
    "failed": (bool,),
    "error": _TEXT + _NONE,
    "stop_reason": _TEXT,
    "extracted": _TEXT + _NONE,
    "grade_reason": _TEXT + _NONE,
    "answer": _TEXT,
    "num_turns": _INT,
    "prompt_tokens": _INT,
    "response_tokens": _INT,
    "weight_version": _INT,
    "text": _TEXT,
    "turns": (list,),
    "stats": (dict,),
}


def check_sample_records(records: Sequence[dict[str, Any]], path: Path) -> None:
    """Refuse a samples file that cannot be trusted: every record has exactly the known fields, each of its
    type (`"correct": "false"` is not a boolean, so it never counts as correct), the numbers are finite and in
    range, the stop reason is one of STOP_REASONS and agrees with `failed`, and nothing failed or
    policy-failed is correct."""
    from stare_agents.eval.report import SAMPLE_TOKENS
    from stare_agents.trajectory import FAILED_STOP_REASONS, STOP_REASONS

    for number, record in enumerate(records, 1):
        where = f"{path}: record {number} ({record.get('benchmark')!r}, {record.get('problem_id')!r})"
        unknown = sorted(set(record) - set(SAMPLE_TYPES) - {SAMPLE_TOKENS})
        if unknown:
            raise ValueError(
                f"{where}: unknown fields {unknown}; the file was edited or damaged and is not resumed. Use "
                "another --out folder."
            )
        for key, types in SAMPLE_TYPES.items():
            value = record.get(key)
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise ValueError(
                    f"{where}: {key} = {value!r} is not a {' or '.join(t.__name__ for t in types)}; the file "
                    "was edited or damaged and is not resumed. Use another --out folder."
                )
        problems = []
        tokens = record.get("tokens")  # optional (older files); when there, four lists of the same episode
        if tokens is not None:
            problems += _token_problems(tokens, record["response_tokens"])
        if not math.isfinite(record["reward"]):
            problems.append(f"reward {record['reward']!r} is not finite")
        if min(record[k] for k in ("sample_index", "num_turns", "prompt_tokens", "response_tokens")) < 0:
            problems.append("a count is negative")
        if record["stop_reason"] not in STOP_REASONS:
            problems.append(f"stop_reason {record['stop_reason']!r} is not one of {STOP_REASONS}")
        elif record["failed"] != (record["stop_reason"] in FAILED_STOP_REASONS):
            problems.append(f"failed={record['failed']} disagrees with stop_reason {record['stop_reason']!r}")
        if record["correct"] and (record["failed"] or record["stop_reason"] == "policy_error"):
            problems.append("a failed sample is marked correct")
        if problems:
            raise ValueError(
                f"{where}: {'; '.join(problems)}; the file is not trusted. Use another --out folder."
            )


REJECTED_FILE = "samples.rejected.jsonl"
# stops where the environment graded the episode (it terminated or truncated it); at the others the rollout
# ended it (reward 0, never correct)
GRADED_STOPS = ("answered", "void_turn", "turn_limit")


@dataclass
class Regraded:
    """Resumed sample records split by grading them again: those kept, and those to sample again, each with
    why (`regrade_resumed`)."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    rerun: list[tuple[dict[str, Any], str]] = field(default_factory=list)


def regrade_problem(record: dict[str, Any], task: Task, grader: Any) -> str | None:
    """Why a resumed record's grade is not the one this run gives it, or None. The record must carry the
    benchmark's answer; where the environment graded the episode (`GRADED_STOPS`) its `correct`, `extracted` and
    `reward` must be what the environment's `score` gives its policy text (its turns' texts joined, as the
    episode handed them to the environment), clipped into the reward range; elsewhere the episode was never
    graded: not correct, reward the range's low end."""
    from stare_agents.envs.core import clip_reward

    reference = str(task.answer)
    if record["answer"] != reference:
        return f"its answer {record['answer']!r} is not the benchmark's, {reference!r}"
    low = float(grader.reward_range[0])
    said = (record["correct"], record["extracted"], float(record["reward"]))
    if record["stop_reason"] not in GRADED_STOPS:
        if record["correct"] or float(record["reward"]) != low:
            return (
                f"it ended {record['stop_reason']!r}, ungraded, yet says correct={said[0]}, reward={said[2]}"
            )
        return None
    turns = record["turns"]
    if not all(isinstance(turn, dict) and isinstance(turn.get("text"), str) for turn in turns):
        return "its turns do not hold the policy's text"
    try:
        score = grader.score(task, "\n".join(turn["text"] for turn in turns))
        reward = clip_reward(score.reward, grader.reward_range)[0]
    except Exception as error:  # an environment whose grading needs what is not here (a sandbox)
        return f"it cannot be graded again here ({type(error).__name__}: {error})"
    given = (bool(score.correct), score.extracted, float(reward))
    if said != given:
        return (
            f"graded again from its response text it is correct={given[0]}, extracted={given[1]!r}, "
            f"reward={given[2]}, where the record says correct={said[0]}, extracted={said[1]!r}, reward={said[2]}"
        )
    return None


def regrade_resumed(
    records: Sequence[dict[str, Any]], benchmarks: Sequence[Benchmark], protocol: Protocol
) -> Regraded:
    """Grade every resumed record again from its response text with the protocol environment's own `score`
    (`regrade_problem`): a record that grades otherwise is sampled again, never counted as it says."""
    out = Regraded()
    if not records:
        return out
    from stare_agents.rollout import RolloutTask, make_env
    from stare_agents.sandbox import NoSandbox

    tasks = {(b.name, t.id): t for b in benchmarks for t in b.tasks}
    first = benchmarks[0].tasks[0]
    row = {"problem": first.problem, "answer": first.answer, "id": first.id}
    env_kwargs = {**protocol.make_env_kwargs(), "dataset": [row]}
    env = make_env(RolloutTask(protocol.env_id, env_kwargs=env_kwargs), NoSandbox())  # grades; runs no code
    try:
        for record in records:
            problem = regrade_problem(
                record, tasks[(record["benchmark"], record["problem_id"])], env.unwrapped
            )
            if problem is None:
                out.kept.append(record)
            else:
                out.rerun.append((record, problem))
    finally:
        env.close()
    return out


def set_aside(samples_path: Path, regraded: Regraded) -> None:
    """Move the records to sample again out of `samples_path` into REJECTED_FILE beside it (appended, fsynced,
    each with why), then replace `samples_path` by the kept records at once (a crash in between leaves them in
    both, and the next resume sets them aside again)."""
    from stare_agents.jsonl import dumps_line

    rejected = samples_path.with_name(REJECTED_FILE)
    with open(rejected, "a", encoding="utf-8") as handle:
        for record, why in regraded.rerun:
            handle.write(dumps_line({"rejected_because": why, "record": record}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    fresh = samples_path.with_name(samples_path.name + ".tmp")
    fresh.unlink(missing_ok=True)
    append_samples(fresh, regraded.kept)
    fresh.replace(samples_path)


def _token_problems(tokens: Any, response_tokens: int) -> list[str]:
    from stare_agents.eval.report import TOKEN_FIELDS

    if not isinstance(tokens, dict) or set(tokens) != set(TOKEN_FIELDS):
        return [f"tokens must be a mapping of {list(TOKEN_FIELDS)}"]
    ints = ("prompt_ids", "response_ids", "action_mask")
    if not all(isinstance(tokens[k], list) and all(type(v) is int for v in tokens[k]) for k in ints):
        return ["token ids and the action mask must be lists of integers"]
    logprobs = tokens["rollout_logprobs"]
    if not isinstance(logprobs, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in logprobs
    ):
        return ["rollout log-probs must be a list of finite numbers"]
    n = len(tokens["response_ids"])
    if len(tokens["action_mask"]) != n or len(logprobs) != n or n != response_tokens:
        return [
            f"the token lists disagree in length with each other or with response_tokens {response_tokens}"
        ]
    if any(bit not in (0, 1) for bit in tokens["action_mask"]):
        return ["the action mask holds values other than 0 and 1"]
    return []


def plan_samples(benchmarks: Sequence[Benchmark], config: EvalConfig) -> list[SampleSpec]:
    """Every sample of the run, problem by problem (a chunk finishes whole problems first)."""
    return [
        SampleSpec(b.name, task, index, sample_seed(config.seed, b.name, task.id, index))
        for b in benchmarks
        for task in b.tasks
        for index in range(config.samples_for(b.name))
    ]


@dataclass
class Progress:
    """What `evaluate` reports after each chunk (for a progress bar or a test that stops a run)."""

    done: int
    total: int
    resumed: int
    elapsed_s: float
    chunk_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def evaluate(
    model: str | Path,
    benchmarks: Sequence[str | Benchmark],
    config: EvalConfig | None = None,
    *,
    out: str | Path,
    runner: Runner | None = None,
    on_chunk: Callable[[Progress], None] | None = None,
    progress: bool = True,
    identity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate `model` on `benchmarks` into the folder `out`; returns the results.json content.

    model: a model name `prepare_model` knows ("tiny", "smollm2-135m"), a local HF folder (a checkpoint) or
    a hub id. benchmarks: names, files or dataset ids (see `load_benchmark`), or loaded `Benchmark`s.
    runner: how samples are drawn (default: `RolloutRunner` on the rollout layer).
    identity: who is evaluated, when `runner` samples from weights that are in no folder (a training run's
    workers mid-run): {"path", "name", "fingerprint"}; `model` is then the folder of their tokenizer.
    """
    config = config or EvalConfig()
    config.check()
    import_modules(config.imports)  # your environments and protocols, before the protocol is looked up
    protocol = config.resolve_protocol()
    loaded = [
        b
        if isinstance(b, Benchmark)
        else load_benchmark(
            b, data_dir=config.data_dir, fields=config.fields, split=config.split, limit=config.limit
        )
        for b in benchmarks
    ]
    if not loaded:
        raise ValueError("evaluate needs at least one benchmark")
    names = [b.name for b in loaded]
    if len(set(names)) != len(names):
        raise ValueError(
            f"two benchmarks share a name ({names}); reports are keyed by name: rename one of the files"
        )
    if identity is not None and runner is None:
        raise ValueError("evaluate(identity=...) names weights that only a given runner holds; pass runner=")
    model_dir = _model_dir(model)
    identity = dict(identity) if identity is not None else model_identity(model_dir)
    settings = run_settings(config, protocol, loaded, identity)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # everything a resume may refuse is checked before anything in `out` is written: a refusal leaves it as it was
    _check_resume(out, settings)
    samples_path = out / SAMPLES_FILE
    existing = read_samples(samples_path, unread=[])  # a torn last line is cut off below, and said
    check_sample_records(existing, samples_path)
    planned = plan_samples(loaded, config)
    planned_keys = {spec.key for spec in planned}
    stray = [sample_key(r) for r in existing if sample_key(r) not in planned_keys]
    if stray:
        raise ValueError(
            f"{samples_path} holds samples this run does not plan, e.g. {stray[:3]}; use another --out"
        )
    regraded = regrade_resumed(existing, loaded, protocol)
    (out / RUN_FILE).write_text(dumps({"settings": settings, "model": identity}, indent=2) + "\n")
    cut = drop_torn_tail(samples_path)
    if cut:
        logger.warning(
            "%s: dropped a torn last line (%d bytes) left by an interrupted run", samples_path, cut
        )
    if regraded.rerun:
        set_aside(samples_path, regraded)
        first, why = regraded.rerun[0]
        logger.warning(
            "%s: %d resumed sample(s) do not grade as they say and are sampled again (kept in %s), e.g. %s: %s",
            samples_path,
            len(regraded.rerun),
            REJECTED_FILE,
            sample_key(first),
            why,
        )
    done = {sample_key(r) for r in regraded.kept}
    pending = [spec for spec in planned if spec.key not in done]
    if done:
        logger.info("resuming %s: %d of %d samples already done", out, len(done), len(planned))

    start = time.perf_counter()
    generation_s = 0.0
    runtime: dict[str, Any] = {}
    if pending:
        own_runner = runner is None
        runner = runner or RolloutRunner(str(model_dir), protocol, config)
        try:
            if hasattr(runner, "describe"):
                runtime = runner.describe()
            generation_s = _run_chunks(
                runner, pending, samples_path, config, len(planned), len(done), on_chunk, progress
            )
        finally:
            if own_runner:
                runner.close()

    records = read_samples(samples_path)
    check_sample_records(records, samples_path)
    results = build_results(
        records,
        benchmarks={
            b.name: {
                "source": b.source,
                "problems": len(b),
                "samples_per_problem": config.samples_for(b.name),
            }
            for b in loaded
        },
        settings={**settings, "workers": config.workers, "chunk_size": config.chunk_size},
        model=identity,
        bootstrap=config.bootstrap,
        confidence=config.confidence,
        seed=config.seed,
        timing={
            "samples_this_run": len(pending),
            "samples_resumed": len(done),
            "samples_regraded_rerun": len(regraded.rerun),
            "rollout_s_this_run": round(generation_s, 3),
            "wall_s_this_run": round(time.perf_counter() - start, 3),
            "runtime": runtime,
        },
    )
    write_results(out, results)
    return results


def _run_chunks(
    runner: Runner,
    pending: list[SampleSpec],
    samples_path: Path,
    config: EvalConfig,
    total: int,
    resumed: int,
    on_chunk: Callable[[Progress], None] | None,
    progress: bool,
) -> float:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as Bar

    start = time.perf_counter()
    rollout_s = 0.0
    done = resumed
    with Bar(
        TextColumn("eval"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not progress,
    ) as bar:
        task_bar = bar.add_task("samples", total=total, completed=resumed)
        for offset in range(0, len(pending), config.chunk_size):
            chunk = pending[offset : offset + config.chunk_size]
            chunk_start = time.perf_counter()
            trajectories = runner.collect(chunk)
            chunk_s = time.perf_counter() - chunk_start
            rollout_s += chunk_s
            if len(trajectories) != len(chunk):
                raise RuntimeError(
                    f"the runner returned {len(trajectories)} trajectories for {len(chunk)} tasks"
                )
            records = []
            for spec, trajectory in zip(chunk, trajectories, strict=True):
                if trajectory.group_id != spec.group_id or trajectory.sample_index != spec.sample_index:
                    raise RuntimeError(
                        f"the runner returned trajectory {trajectory.group_id!r}#{trajectory.sample_index} where "
                        f"{spec.group_id!r}#{spec.sample_index} was expected: results must come back in task order"
                    )
                records.append(
                    sample_record(
                        benchmark=spec.benchmark,
                        problem_id=spec.task.id,
                        answer=str(spec.task.answer),
                        sample_index=spec.sample_index,
                        seed=spec.seed,
                        trajectory=trajectory,
                    )
                )
            append_samples(samples_path, records)
            done += len(chunk)
            bar.update(task_bar, completed=done)
            if on_chunk is not None:
                on_chunk(Progress(done, total, resumed, time.perf_counter() - start, chunk_s))
    return rollout_s


def _model_dir(model: str | Path) -> Path:
    from stare_agents.models import prepare_model

    return Path(prepare_model(str(model)))


__all__ = [
    "RESULTS_FILE",
    "RUN_FILE",
    "EvalConfig",
    "Progress",
    "Regraded",
    "RolloutRunner",
    "Runner",
    "SampleSpec",
    "evaluate",
    "plan_samples",
    "regrade_resumed",
    "run_settings",
    "sample_seed",
]


def evaluate_on_workers(
    group: Any,
    protocol: Protocol,
    config: EvalConfig,
    tokenizer_dir: str | Path,
    benchmark: Benchmark,
    *,
    out: str | Path,
    identity: dict[str, Any],
    progress: bool = False,
) -> BenchmarkMetrics:
    """One benchmark on rollout workers that are already running (a training run's, with their current weights):
    the samples, results.json and results.md go to `out` as `evaluate` writes them; returns the metrics. The
    one entry point training uses to evaluate (the workers keep running)."""
    runner = RolloutRunner.on_workers(group, protocol, config)
    results = evaluate(
        tokenizer_dir, [benchmark], config, out=out, runner=runner, identity=identity, progress=progress
    )
    metrics = metrics_of(results["benchmarks"][benchmark.name])
    if metrics is None:
        raise RuntimeError(f"{benchmark.name}: the evaluation in {out} ended without metrics")
    return metrics
