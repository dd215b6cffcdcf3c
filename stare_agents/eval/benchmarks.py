"""Benchmarks (the paper's six by name, or any file / Hugging Face id), protocols and the paper's preset.

    load_benchmark("aime24")                                  # <data dir>/aime24.jsonl
    load_benchmark("my_set.parquet", fields={"problem": "question", "answer": "solution"})
    load_benchmark("HuggingFaceH4/MATH-500", split="test")   # needs the dataset in the HF cache (offline)
    PROTOCOLS["simpletir"]                                    # env id, env kwargs, sampling, token budgets
    PRESETS["paper"].samples_for("aime24")                    # 32 (avg@32 on AIME/AMC, avg@4 elsewhere)

Benchmark names resolve to `<name>.jsonl` in a data folder holding `{"id", "problem", "answer"}` lines:
the `data_dir` argument (`--data-dir`), else the environment variable `STARE_DATA_DIR`, else
`../shared/data/benchmarks` next to the repository when that folder exists. The project never needs that
folder: without one, a name is an error that says how to point at the data.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stare_agents.envs import Task, TaskDataset
from stare_agents.jsonl import lone_surrogate

DATA_DIR_ENV = "STARE_DATA_DIR"

# The paper's six benchmarks: name -> file in the data folder.
BENCHMARK_FILES: dict[str, str] = {
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "amc23": "amc23.jsonl",
    "math500": "math500.jsonl",
    "minerva": "minerva.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
}


def default_data_dir() -> Path:
    """`../shared/data/benchmarks` relative to the repository (exists only in a development checkout)."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "benchmarks"


def data_dir_found(data_dir: str | Path | None = None) -> bool:
    """Whether a data folder is given or found where `resolve_data_dir` looks (the given one may still be
    missing: `resolve_data_dir` says so)."""
    return data_dir is not None or bool(os.environ.get(DATA_DIR_ENV)) or default_data_dir().is_dir()


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The folder benchmark names resolve in: `data_dir`, else $STARE_DATA_DIR, else `default_data_dir()`."""
    if data_dir is not None:
        chosen, origin = Path(data_dir).expanduser(), "--data-dir"
    elif os.environ.get(DATA_DIR_ENV):
        chosen, origin = Path(os.environ[DATA_DIR_ENV]).expanduser(), f"${DATA_DIR_ENV}"
    else:
        chosen = default_data_dir()
        if chosen.is_dir():
            return chosen
        raise FileNotFoundError(
            f"benchmark names ({', '.join(BENCHMARK_FILES)}) are looked up in a data folder, and none was "
            f"given: pass --data-dir DIR (data_dir=...) or set {DATA_DIR_ENV}=DIR, where DIR holds "
            f'<name>.jsonl files with one {{"id", "problem", "answer"}} object per line '
            f"(the default, {chosen}, does not exist). Or pass a file path or Hugging Face id instead of a name."
        )
    if not chosen.is_dir():
        raise FileNotFoundError(f"the benchmark data folder {chosen} (from {origin}) is not a directory")
    return chosen


@dataclass(frozen=True)
class Benchmark:
    """A loaded benchmark: its name (the key in reports), where it came from, and its tasks."""

    name: str
    source: str
    tasks: tuple[Task, ...]

    def __len__(self) -> int:
        return len(self.tasks)


def benchmark_source(spec: str, *, data_dir: str | Path | None = None) -> tuple[str, str]:
    """(name, source) for a benchmark name, a file path or a Hugging Face dataset id."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"a benchmark is a name ({', '.join(BENCHMARK_FILES)}), a file or a dataset id; got {spec!r}"
        )
    if spec in BENCHMARK_FILES:
        path = resolve_data_dir(data_dir) / BENCHMARK_FILES[spec]
        if not path.is_file():
            raise FileNotFoundError(
                f"benchmark {spec!r}: {path} does not exist; the data folder must hold {BENCHMARK_FILES[spec]}"
            )
        return spec, str(path)
    path = Path(spec).expanduser()
    if path.exists():
        return path.stem if path.is_file() else path.name, str(path)
    # a path that does not exist is an error naming it, never a dataset id: one that looks like a path, or an
    # "owner/name" whose owner is a folder here ("data/aime24", a local file misspelt)
    looks_like_a_path = spec.startswith(("/", ".", "~")) or spec.count("/") > 1
    if looks_like_a_path or path.suffix in (".jsonl", ".json", ".parquet"):
        raise FileNotFoundError(f"benchmark file {path} does not exist")
    if spec.count("/") == 1 and path.parent.is_dir():
        raise FileNotFoundError(
            f"benchmark {spec!r}: there is no file or folder {path} (but {path.parent}/ exists here, so this "
            "looks like a mistyped local path, not a Hugging Face dataset id). Check the path; for a dataset "
            "whose owner matches a local folder's name, run from another directory."
        )
    if spec.count("/") == 1:
        return spec, spec  # a Hugging Face dataset id, loaded through `datasets`
    raise ValueError(
        f"unknown benchmark {spec!r}: not one of the names {sorted(BENCHMARK_FILES)}, not an existing file, "
        "and not a Hugging Face dataset id (owner/name)"
    )


def load_benchmark(
    spec: str,
    *,
    data_dir: str | Path | None = None,
    fields: Mapping[str, str] | None = None,
    split: str = "test",
    config: str | None = None,
    limit: int | None = None,
) -> Benchmark:
    """Load a benchmark's tasks and check them: at least one task, unique ids, a problem and an answer each.

    fields: Task field ("problem", "answer", "id") -> column name, for files and datasets with other columns.
    split / config: for Hugging Face ids. limit: keep the first `limit` problems.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 problems, got {limit}")
    name, source = benchmark_source(spec, data_dir=data_dir)
    tasks = tuple(TaskDataset(source, fields=fields, split=split, config=config, limit=limit))
    if not tasks:
        raise ValueError(f"benchmark {name!r} ({source}) has no problems")
    seen: dict[str, int] = {}
    for index, task in enumerate(tasks):
        if task.id in seen:
            raise ValueError(
                f"benchmark {name!r} ({source}): problem id {task.id!r} appears at rows {seen[task.id]} and "
                f"{index}; ids must be unique (samples and resumption are keyed by them). Map another column "
                "with fields={'id': '<column>'} or drop the id column to get row-number ids."
            )
        seen[task.id] = index
        if not task.problem.strip():
            raise ValueError(f"benchmark {name!r} ({source}): problem {task.id!r} (row {index}) has no text")
        for field_name, text in (("id", task.id), ("problem", task.problem), ("answer", str(task.answer))):
            if (found := lone_surrogate(text)) is not None:
                raise ValueError(
                    f"benchmark {name!r} ({source}): problem {task.id!a} (row {index}): its {field_name} "
                    f"holds a lone surrogate {found} (valid JSON, but no text a tokenizer or a UTF-8 file can "
                    "hold); fix or drop that row"
                )
        if task.answer is None or not str(task.answer).strip():
            raise ValueError(
                f"benchmark {name!r} ({source}): problem {task.id!r} (row {index}) has no reference answer; "
                "map the answer column with fields={'answer': '<column>'} (--field answer=<column>)"
            )
    return Benchmark(name=name, source=source, tasks=tasks)


def parse_fields(items: list[str] | None) -> dict[str, str] | None:
    """CLI `--field problem=question --field answer=solution` -> {"problem": "question", ...}."""
    if not items:
        return None
    fields: dict[str, str] = {}
    for item in items:
        key, sep, column = item.partition("=")
        key, column = key.strip(), column.strip()
        if not sep or not key or not column:
            raise ValueError(f"--field takes TASK_FIELD=COLUMN (e.g. answer=solution), got {item!r}")
        if key not in ("problem", "answer", "id"):
            raise ValueError(f"--field {item!r}: the task fields are problem, answer and id, got {key!r}")
        fields[key] = column
    return fields


# -- protocols --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Protocol:
    """How each sample is generated: the environment, its settings, sampling and token budgets.

    max_turns: None keeps the environment's default. The CLI's --temperature / --top-p / --max-turns /
    --max-tokens override these through `Protocol.override`.
    """

    name: str
    env_id: str
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int | None = None
    max_tokens_per_turn: int = 1024
    max_total_tokens: int = 4096
    description: str = ""

    @property
    def single_turn(self) -> bool:
        return self.env_id.endswith("MathCoT-v0")

    def override(
        self,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_turns: int | None = None,
        max_tokens_per_turn: int | None = None,
        max_total_tokens: int | None = None,
    ) -> Protocol:
        """A copy with the given settings replaced (None keeps the protocol's), checked."""
        if max_turns is not None and self.single_turn and max_turns != 1:
            raise ValueError(f"protocol {self.name!r} is single-turn; --max-turns {max_turns} does not apply")
        changed = replace(
            self,
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p if top_p is None else top_p,
            max_turns=self.max_turns if max_turns is None or self.single_turn else max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn
            if max_tokens_per_turn is None
            else max_tokens_per_turn,
            max_total_tokens=self.max_total_tokens if max_total_tokens is None else max_total_tokens,
        )
        changed.check()
        return changed

    def check(self) -> None:
        if not 0.0 <= self.temperature <= 10.0:
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_tokens_per_turn < 1 or self.max_total_tokens < 1:
            raise ValueError(
                f"token budgets must be >= 1, got max_tokens_per_turn={self.max_tokens_per_turn}, "
                f"max_total_tokens={self.max_total_tokens}"
            )
        if self.max_tokens_per_turn > self.max_total_tokens:
            raise ValueError(
                f"max_tokens_per_turn ({self.max_tokens_per_turn}) exceeds max_total_tokens "
                f"({self.max_total_tokens}); raise --max-tokens or lower --max-tokens-per-turn"
            )

    def make_env_kwargs(self) -> dict[str, Any]:
        """The `gym.make` keyword arguments of one sample's environment (the rollout worker adds its sandbox)."""
        kwargs = dict(self.env_kwargs)
        if self.max_turns is not None and not self.single_turn:
            kwargs["max_turns"] = self.max_turns
        return kwargs

    def effective_max_turns(self) -> int:
        """The turn limit the episodes run with: 1, the override, the environment keyword, or the environment's
        default. The id may be registered with any entry point Gymnasium accepts: a "module:attr" string, a class
        (the class's `default_max_turns`), or another callable (one environment is made to ask it)."""
        if self.single_turn:
            return 1
        if self.max_turns is not None:
            return self.max_turns
        kwargs = self.make_env_kwargs()
        if isinstance(kwargs.get("max_turns"), int):
            return kwargs["max_turns"]
        import gymnasium as gym

        from stare_agents.envs.registration import env_class

        creator = env_class(self.env_id)
        if isinstance(creator, type):  # a TextEnv (yours, say) has max_turns=1 by default
            return int(getattr(creator, "default_max_turns", 1))
        env = gym.make(self.env_id, **kwargs)
        try:
            return int(getattr(env.unwrapped, "max_turns", 1))
        finally:
            env.close()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "env_id": self.env_id,
            "env_kwargs": dict(self.env_kwargs),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_turns": self.effective_max_turns(),
            "max_tokens_per_turn": self.max_tokens_per_turn,
            "max_total_tokens": self.max_total_tokens,
        }


PROTOCOLS: dict[str, Protocol] = {
    "tir": Protocol(
        name="tir",
        env_id="stare_agents/MathTIR-v0",
        description="MathTIR-v0 with the project's defaults: 4 turns, stateful Python session, ```output "
        "observations up to 2048 characters",
    ),
    "cot": Protocol(
        name="cot",
        env_id="stare_agents/MathCoT-v0",
        env_kwargs={"cot": "short"},
        max_tokens_per_turn=4096,
        max_total_tokens=4096,
        description="MathCoT-v0: one turn of chain of thought, no tool",
    ),
    "cot-long": Protocol(
        name="cot-long",
        env_id="stare_agents/MathCoT-v0",
        env_kwargs={"cot": "long"},
        max_tokens_per_turn=16384,
        max_total_tokens=16384,
        description="MathCoT-v0 with the long-CoT prompt (think at length, then a boxed answer), one turn, no "
        "tool, 16,384 response tokens: how a long-CoT model (R1-Distill, Qwen3 thinking) is scored",
    ),
    "simpletir": Protocol(
        name="simpletir",
        env_id="stare_agents/MathTIR-v0",
        env_kwargs={"observation_format": "code_execution_result", "max_obs_chars": 512, "stateless": True},
        temperature=1.0,
        top_p=0.7,
        max_turns=10,
        max_tokens_per_turn=1024,
        max_total_tokens=8192,
        description="SimpleTIR's settings: up to 10 turns, 'Code execution result:' observations truncated "
        "to 512 characters, stateless execution, temperature 1.0, top_p 0.7",
    ),
}


# The default job's task family: `stare-agents envs export stare_agents/ArithmeticTIR-v1 --out FILE` writes
# its held-out tasks as a benchmark file (the ones the trainer evaluates on); "arith-v1" runs them with the
# environment and token budgets the default job (train/recipes/smollm2-arith.yaml) trains and evaluates with.
# "arith" is the same for ArithmeticTIR-v0, the environment of the runs before it.
PROTOCOLS["arith-v1"] = Protocol(
    name="arith-v1",
    env_id="stare_agents/ArithmeticTIR-v1",
    env_kwargs={"stateless": True},
    max_tokens_per_turn=128,
    max_total_tokens=320,
    description="ArithmeticTIR-v1 (the default job's environment, prompt and token budgets): stateless Python, "
    "exact integer grading",
)
PROTOCOLS["arith"] = Protocol(
    name="arith",
    env_id="stare_agents/ArithmeticTIR-v0",
    env_kwargs={"stateless": True},
    max_tokens_per_turn=160,
    max_total_tokens=400,
    description="ArithmeticTIR-v0 (the default job's environment and prompt): 3 turns, stateless Python, "
    "exact integer grading",
)


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; choose one of {sorted(PROTOCOLS)}")
    return PROTOCOLS[name]


@dataclass(frozen=True)
class Preset:
    """Samples per problem by benchmark name, and the sampling the numbers were reported with."""

    name: str
    samples: Mapping[str, int]
    default_samples: int
    temperature: float
    top_p: float
    description: str = ""

    def samples_for(self, benchmark: str) -> int:
        return self.samples.get(benchmark, self.default_samples)


PRESETS: dict[str, Preset] = {
    "paper": Preset(
        name="paper",
        samples={"aime24": 32, "aime25": 32, "amc23": 32},
        default_samples=4,
        temperature=1.0,
        top_p=0.7,
        description="the paper's table: avg@32 on AIME24/AIME25/AMC23, avg@4 on the rest, temperature 1.0, "
        "top_p 0.7",
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
