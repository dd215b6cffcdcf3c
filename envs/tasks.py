"""Tasks and task datasets: JSONL / JSON / Parquet files, Hugging Face dataset ids, or in-memory rows.

    >>> tasks = TaskDataset("data/train.jsonl", fields={"problem": "question", "answer": "solution"})
    >>> task = tasks.sample(np.random.default_rng(0))

Rows are read on first use (a dataset handed to an environment costs nothing until the first `reset`).
`fields` maps each `Task` field ("problem", "answer", "id") to a column name or to a function of the row;
every other column is kept in `Task.data`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FieldSpec = str | Callable[[Mapping[str, Any]], Any]
DEFAULT_FIELDS: dict[str, FieldSpec] = {"problem": "problem", "answer": "answer", "id": "id"}
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Task:
    """One task: what the policy is asked and what the environment grades against.

    problem: the text shown to the policy (inserted into the environment's prompt template).
    answer: the reference answer (a LaTeX string for math); None where the environment's score needs none.
    id: a stable identifier (row id, or a generated one).
    data: any other fields the environment needs (unit tests, function name, difficulty, ...).
    """

    problem: str
    answer: Any = None
    id: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


class TaskDataset(Sequence[Task]):
    """A lazily loaded, indexable collection of `Task`s with seeded sampling.

    Args:
        source: a path to a `.jsonl`, `.json` (list of objects or JSON lines) or `.parquet` file; a Hugging
            Face dataset id such as "HuggingFaceH4/MATH-500" or a local dataset folder (both loaded with
            `datasets.load_dataset`; an id needs the dataset cached or network access); or a sequence of rows.
        fields: Task field -> column name or function of the row. Defaults: problem="problem",
            answer="answer", id="id" (a missing id column yields ids "<name>-<index>").
        split: split to load for Hugging Face ids.
        config: dataset configuration name for Hugging Face ids.
        limit: keep only the first `limit` rows.
    """

    def __init__(
        self,
        source: str | Path | Sequence[Mapping[str, Any]],
        *,
        fields: Mapping[str, FieldSpec] | None = None,
        split: str = "train",
        config: str | None = None,
        limit: int | None = None,
    ) -> None:
        unknown = set(fields or {}) - set(DEFAULT_FIELDS)
        if unknown:
            raise ValueError(
                f"fields may map only {sorted(DEFAULT_FIELDS)}, got unknown keys {sorted(unknown)}"
            )
        self.source = source
        self.fields: dict[str, FieldSpec] = {**DEFAULT_FIELDS, **(fields or {})}
        self.split = split
        self.config = config
        self.limit = limit
        self.name = source if isinstance(source, str | Path) else "rows"
        self._tasks: list[Task] | None = None
        self._keep: Callable[[Task], bool] | None = None

    def where(self, keep: Callable[[Task], bool], name: str | None = None) -> TaskDataset:
        """The tasks for which `keep(task)` is true, as a dataset (loaded when first used, like this one)."""
        subset = TaskDataset.__new__(TaskDataset)
        subset.__dict__.update(self.__dict__)
        previous = self._keep
        subset._keep = keep if previous is None else (lambda task: previous(task) and keep(task))
        subset._tasks = None if self._tasks is None else [task for task in self._tasks if keep(task)]
        subset.name = name or f"{self.name!s} (subset)"
        return subset

    # -- Sequence -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int) -> Task:  # type: ignore[override]
        return self.tasks[index]

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __repr__(self) -> str:
        loaded = f"{len(self._tasks)} tasks" if self._tasks is not None else "not loaded"
        return f"TaskDataset({self.name!s}, {loaded})"

    # -- sampling -------------------------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> Task:
        """A task drawn uniformly with `rng` (the environment passes its seeded `np_random`)."""
        if len(self) == 0:
            raise ValueError(f"dataset {self.name!s} has no rows to sample from")
        return self.tasks[int(rng.integers(len(self)))]

    @property
    def tasks(self) -> list[Task]:
        """All tasks, loading the source on first access."""
        if self._tasks is None:
            rows = load_rows(self.source, split=self.split, config=self.config)
            if self.limit is not None:
                rows = rows[: self.limit]
            tasks = [self._to_task(row, index) for index, row in enumerate(rows)]
            self._tasks = tasks if self._keep is None else [task for task in tasks if self._keep(task)]
        return self._tasks

    def _to_task(self, row: Mapping[str, Any], index: int) -> Task:
        values: dict[str, Any] = {}
        used: set[str] = set()
        for name, spec in self.fields.items():
            if callable(spec):
                values[name] = spec(row)
            elif spec in row:
                values[name] = row[spec]
                used.add(spec)
            elif name == "problem":
                raise KeyError(
                    f"row {index} of {self.name!s} has no column {spec!r} for the problem text; columns are "
                    f"{sorted(row)}. Pass fields={{'problem': '<column>'}}."
                )
            else:
                values[name] = None
        task_id = values["id"] if values["id"] is not None else f"{Path(str(self.name)).stem}-{index}"
        answer = values["answer"]
        if answer is not None and not isinstance(answer, str):
            answer = str(answer)
        extra = {key: value for key, value in row.items() if key not in used}
        return Task(problem=str(values["problem"]), answer=answer, id=str(task_id), data=extra)


def load_rows(
    source: str | Path | Sequence[Mapping[str, Any]], *, split: str = "train", config: str | None = None
) -> list[dict[str, Any]]:
    """Read the rows of a file, a Hugging Face dataset id or an in-memory sequence as dicts."""
    if not isinstance(source, str | Path):
        return [dict(row) for row in source]
    path = Path(source).expanduser()
    if path.is_dir():  # a local dataset folder (data files, or a dataset repository): let `datasets` read it
        return _load_hf(str(path), split=split, config=config)
    if path.suffix in FILE_SUFFIXES or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"task file {path} does not exist")
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json" and text.lstrip().startswith("["):
            return [dict(row) for row in json.loads(text)]
        rows = []
        # lines split at "\n" only: str.splitlines() also breaks at U+2028/U+2029/U+0085 inside a JSON string
        for number, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number} is not valid JSON: {error}") from error
        return rows
    return _load_hf(str(source), split=split, config=config)


def _load_hf(dataset_id: str, *, split: str, config: str | None) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as error:  # declared dependency; only a broken install gets here
        raise ImportError("loading a Hugging Face dataset id needs the 'datasets' package") from error
    try:
        loaded = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as error:
        raise RuntimeError(
            f"could not load Hugging Face dataset {dataset_id!r} (config={config!r}, split={split!r}): {error}. "
            "Offline? Pass a local .jsonl/.parquet path instead, or pre-download the dataset into the HF cache."
        ) from error
    return [dict(row) for row in loaded]


def unique_tasks(env: Any, count: int, *, first_seed: int, max_seeds: int | None = None) -> list[Task]:
    """`count` tasks with distinct problems: the tasks `env.reset(seed=first_seed + i)` draws for i = 0, 1, ...,
    skipping a seed whose problem an earlier seed already drew (no tool runs: tasks are drawn at reset).

    Raises ValueError when `max_seeds` seeds (default 20 * count + 1000) give fewer than `count` distinct
    problems: the environment's task space (or its split) is smaller than the request."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    limit = max_seeds if max_seeds is not None else 20 * count + 1000
    tasks: list[Task] = []
    seen: set[str] = set()
    for seed in range(first_seed, first_seed + limit):
        env.reset(seed=seed)
        task = env.unwrapped.task
        if task.problem not in seen:
            seen.add(task.problem)
            tasks.append(task)
            if len(tasks) == count:
                return tasks
    raise ValueError(
        f"only {len(tasks)} distinct problems in seeds {first_seed}..{first_seed + limit - 1}, {count} asked: "
        "the environment's task space is smaller than that; ask for fewer tasks or widen the environment's kinds"
    )
