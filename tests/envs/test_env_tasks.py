"""Task datasets: JSONL / JSON / Parquet files, field mapping, seeded sampling, Hugging Face ids offline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import shared_data

from stare_agents.envs import Task, TaskDataset

ROWS = [{"question": f"q{i}", "final": i * i, "level": i % 3} for i in range(20)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def test_jsonl_with_field_mapping(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", ROWS)
    tasks = TaskDataset(path, fields={"problem": "question", "answer": "final"})
    assert repr(tasks).endswith("not loaded)")  # lazy
    assert len(tasks) == 20
    assert tasks[3] == Task(problem="q3", answer="9", id="tasks-3", data={"level": 0})


def test_callable_fields(tmp_path: Path) -> None:
    rows = [{"question": "q", "solution": "work... #### 42", "uid": 7}]
    path = write_jsonl(tmp_path / "gsm.jsonl", rows)
    tasks = TaskDataset(
        path,
        fields={
            "problem": "question",
            "answer": lambda row: row["solution"].split("####")[-1].strip(),
            "id": "uid",
        },
    )
    assert (tasks[0].answer, tasks[0].id) == ("42", "7")


def test_json_list_and_parquet(tmp_path: Path) -> None:
    json_path = tmp_path / "tasks.json"
    json_path.write_text(json.dumps(ROWS))
    parquet_path = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet_path)
    fields = {"problem": "question", "answer": "final"}
    assert [t.problem for t in TaskDataset(json_path, fields=fields)] == [
        t.problem for t in TaskDataset(parquet_path, fields=fields)
    ]


def test_missing_problem_column_names_the_columns(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "x"}])
    with pytest.raises(KeyError, match="columns are \\['text'\\]"):
        len(TaskDataset(path))


def test_bad_json_line_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"problem": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl:2"):
        len(TaskDataset(path))


def test_missing_file_and_unknown_field(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        len(TaskDataset(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="unknown keys"):
        TaskDataset(ROWS, fields={"question": "problem"})


def test_seeded_sampling() -> None:
    tasks = TaskDataset([{"problem": f"p{i}", "answer": str(i)} for i in range(100)])
    first = [tasks.sample(np.random.default_rng(3)).problem for _ in range(1)]
    again = [tasks.sample(np.random.default_rng(3)).problem for _ in range(1)]
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    assert first == again
    assert [tasks.sample(rng_a).id for _ in range(10)] == [tasks.sample(rng_b).id for _ in range(10)]
    assert len({tasks.sample(rng_a).id for _ in range(50)}) > 10


def test_hugging_face_id_offline_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        RuntimeError, match="could not load Hugging Face dataset 'no-such-org/no-such-dataset'"
    ):
        len(TaskDataset("no-such-org/no-such-dataset", split="test"))


def test_shared_math500_loads() -> None:
    tasks = TaskDataset(shared_data("benchmarks/math500.jsonl"))
    assert len(tasks) == 500
    assert all(task.problem and task.answer for task in tasks)


def test_local_dataset_folder_goes_through_hugging_face_datasets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", ROWS)
    tasks = TaskDataset(folder, fields={"problem": "question", "answer": "final"}, split="train")
    assert len(tasks) == 20 and tasks[4].answer == "16"
