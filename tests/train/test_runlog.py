"""The run's metrics writer: every kind of record reaches TensorBoard (and W&B) under stable names, a
resumed run continues the same W&B run, and progress bars in a log file redraw rarely."""

from __future__ import annotations

import importlib.util
import io
import json

import pytest
from support import require

from stare_agents._quiet_progress import quiet_progress_bars
from stare_agents.records import read_records
from stare_agents.train.config import TrainConfig
from stare_agents.train.run_folder import WANDB_ID_FILE, RunLog, scalars


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


RECORDS = [
    {
        "kind": "eval",
        "point": "base",
        "step": 0,
        "accuracy": 0.25,
        "failed": 1,
        "stop_reasons": {"answered": 3},
    },
    {"kind": "sft-step", "step": 1, "loss": 2.5, "lr": 1e-3},
    {"kind": "sft-step", "step": 2, "loss": 2.0, "lr": 1e-3},
    {"kind": "sft", "step": 1, "epoch": 1.0, "loss": 2.25, "traces": 8},
    {
        "kind": "eval",
        "point": "sft",
        "step": 0,
        "accuracy": 0.5,
        "failed": 0,
        "stop_reasons": {"answered": 4},
    },
    {
        "kind": "rl",
        "step": 0,
        "learner/entropy": 0.3,
        "stare/gate_on": float("nan"),
        "rollout/failed": 2,
        "stop_reasons": {"answered": 6, "turn_limit": 2},
        "algorithm": "stare",
        "flag": True,
    },
]


def test_every_kind_reaches_tensorboard_under_its_name(tmp_path):
    log = RunLog(tmp_path, TrainConfig())
    for record in RECORDS:
        log.log(record)
    log.close()
    tags = tensorboard_scalars(tmp_path)
    assert tags["eval/base/accuracy"] == [(0, 0.25)] and tags["eval/sft/accuracy"] == [(0, 0.5)]
    assert tags["eval/base/failed"] == [(0, 1.0)] and tags["eval/base/stop_reasons/answered"] == [(0, 3.0)]
    assert tags["sft-step/loss"] == [(1, 2.5), (2, 2.0)] and tags["sft/loss"] == [(1, 2.25)]
    assert tags["learner/entropy"] == [(0, pytest.approx(0.3))] and tags["rollout/failed"] == [(0, 2.0)]
    assert tags["rl/stop_reasons/turn_limit"] == [(0, 2.0)]
    assert (
        "stare/gate_on" not in tags and "rl/flag" not in tags and "rl/algorithm" not in tags
    )  # NaN, bool, text
    assert [r["kind"] for r in read_records(tmp_path / "metrics.jsonl")] == [r["kind"] for r in RECORDS]


def test_scalar_names():
    assert scalars({"kind": "rl", "step": 3, "a/b": 1, "c": 2, "d": {"e": {"f": 4}}}, "rl") == {
        "a/b": 1.0,
        "rl/c": 2.0,
        "rl/d/e/f": 4.0,
    }


def wandb_config(tmp_path) -> TrainConfig:
    require(
        importlib.util.find_spec("wandb") is not None,
        "wandb",
        "pip install wandb (optional: only runs with logging.wandb_project need it)",
        ci_required=False,
    )
    config = TrainConfig(out_dir=str(tmp_path), name="resume-test")
    config.logging.wandb_project = "stare-agents-tests"
    config.logging.tensorboard = False
    return config


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = wandb_config(tmp_path)
    first = RunLog(tmp_path, config)
    shared = RunLog(tmp_path, config)  # the trainer's eval/SFT log and the RL log share one W&B run
    assert shared.wandb is first.wandb
    run_id = first.wandb.id
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == run_id
    first.log(RECORDS[0])
    shared.log(RECORDS[-1])
    shared.close()
    first.log({"kind": "rl", "step": 1, "learner/entropy": 0.2})
    first.close()
    resumed = RunLog(tmp_path, config, purge_from=1)  # a killed run, resumed from its step-1 checkpoint
    assert resumed.wandb.id == run_id
    resumed.log({"kind": "rl", "step": 1, "learner/entropy": 0.25})
    resumed.close()
    records = read_records(tmp_path / "metrics.jsonl", "rl")
    assert [(r["step"], r["learner/entropy"]) for r in records] == [(0, 0.3), (1, 0.25)]


def test_progress_bars_in_a_log_file_redraw_every_few_seconds(tmp_path):
    """The command line, its stderr a log file: tqdm bars (of any module) get a 5 s minimum interval."""
    import os
    import subprocess
    import sys

    code = (
        "import stare_agents.cli\n"
        "import io\nfrom tqdm import tqdm\n"
        "stream = io.StringIO()\nbar = tqdm(total=10000, file=stream)\n"
        "for _ in range(10000): bar.update(1)\n"
        "bar.close()\nprint(bar.mininterval, stream.getvalue().count(chr(13)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TQDM_MININTERVAL"}
    with open(tmp_path / "log.txt", "w") as log:
        out = subprocess.run(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=log, text=True, env=env, check=True
        )
    interval, redraws = out.stdout.split()
    assert float(interval) == 5.0 and int(redraws) <= 3  # the first draw, at most one in between, the last


def test_a_terminal_keeps_the_default_refresh(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    monkeypatch.setattr("sys.stderr", Terminal())
    quiet_progress_bars()
    import os

    assert "TQDM_MININTERVAL" not in os.environ


def strict_json(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as strict parsers (JavaScript, jq) do."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_records_are_strict_json_lines_without_what_was_not_measured(tmp_path):
    import numpy as np
    import torch

    log = RunLog(tmp_path, TrainConfig())
    log.log(
        {
            "kind": "rl",
            "step": 0,
            "x": float("nan"),
            "y": 0.5,
            "inf": float("-inf"),
            "tensor": torch.tensor(float("nan")),
            "numpy": np.float32("inf"),
            "nested": {"a": float("nan"), "b": 1},
            "text": "a\u2028b",
        }
    )
    log.close()
    [line] = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").split("\n")[:-1]
    assert strict_json(line) == {"kind": "rl", "step": 0, "y": 0.5, "nested": {"b": 1}, "text": "a\u2028b"}
    assert set(tensorboard_scalars(tmp_path)) == {"rl/y", "rl/nested/b"}


def test_a_resume_keeps_every_record_before_its_checkpoint_and_names_a_torn_one(tmp_path, caplog):
    """The purge of a resumed run splits lines at "\\n" only: a line separator inside a record (left raw by
    an older writer) does not lose the record, and the line a kill tore is named in a warning."""
    import logging

    kept = {"kind": "eval", "point": "base", "step": 0, "note": "one\u2028two\u2029three\x85four"}
    lines = [
        json.dumps(kept, ensure_ascii=False),
        json.dumps({"kind": "rl", "step": 0}),
        '{"kind": "rl", "st',
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        RunLog(tmp_path, TrainConfig(), purge_from=0).close()
    assert read_records(tmp_path / "metrics.jsonl") == [kept]
    assert f"{tmp_path / 'metrics.jsonl'}:3: torn last line" in caplog.text
