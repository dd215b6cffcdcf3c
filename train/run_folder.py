"""A training run's folder and its one writer: where each output lives, metrics.jsonl with TensorBoard and W&B
fed from the same records (`RunLog`), what the run has done and its stage times (`RunState`, progress.json),
stage timing within a step (`StageTimer`), the resume check, and the model folders a run saves.

    log = RunLog(folder, config)          # metrics.jsonl + TensorBoard (+ W&B)
    log.log({"kind": "rl", "step": 3, "learner/loss": 0.1})
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stare_agents.jsonl import dumps, dumps_line, finite, read_lines, report_unread
from stare_agents.train.config import TrainConfig, derived_keys, flatten

PROGRESS_FILE = "progress.json"
SFT_CHECKPOINT = "sft_checkpoint"  # the SFT fit under way (sft.checkpoint_every), removed once it is done
SFT_MODEL = "sft_model"
EVALS_DIR = "evals"  # eval.benchmarks during RL: <run>/evals/step-NNNNNN/<name>/ (eval harness folders)
FINAL_MODEL = "final_model"  # the trained policy as a Hugging Face folder, in each RL run's folder


# -- the writer ----------------------------------------------------------------------------------------------
class RunLog:
    """metrics.jsonl + TensorBoard (+ W&B when configured): one writer that feeds every sink.

    Records carry `kind` ("rl", "eval", "sft", "sft-step") and `step`. In TensorBoard and W&B a figure `x` of
    a record of kind `k` is `k/x` (figures named `a/b` keep their name), an evaluation's figures are
    `eval/<point>/x`, and nested counts such as `stop_reasons` become `k/stop_reasons/<reason>`. W&B plots
    each kind against its own step (`k/step`), and the run's id is kept in the run folder (`wandb_run_id`),
    so a resumed run continues the same W&B run.
    """

    def __init__(self, folder: Path, config: TrainConfig, *, purge_from: int | None = None) -> None:
        self.folder = folder
        self.path = folder / "metrics.jsonl"
        if (
            purge_from is not None and self.path.exists()
        ):  # drop what a killed run logged after its checkpoint
            records, unread = read_lines(self.path)  # split at "\n" only; a torn line is named in a warning
            report_unread(unread, None, "metrics lines")
            kept = [dumps_line(record) for _, record in records if _keep(record, purge_from)]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        self.writer = None
        if config.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(folder / "tensorboard"), purge_step=purge_from)
        self.wandb = _open_wandb(folder, config) if config.logging.wandb_project else None
        self._wandb_kinds: set[str] = set()

    def forget(self, kind: str, after: int) -> None:
        """Drop the records of `kind` past step `after` from metrics.jsonl: what a killed stage logged after the
        checkpoint it resumes from (it logs those steps again)."""
        if not self.path.exists():
            return
        records, unread = read_lines(self.path)
        report_unread(unread, None, "metrics lines")
        kept = [
            dumps_line(r)
            for _, r in records
            if isinstance(r, dict) and not (r.get("kind") == kind and int(r.get("step", 0)) > after)
        ]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        """Append `record` to every sink. A figure that is not a finite number (not measured: NaN) is left out
        of it, so that metrics.jsonl is strict JSON and an absent figure never reads as another."""
        record = finite(json.loads(json.dumps(record, default=_jsonable)))  # tensors and numpy as numbers
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(dumps_line(record) + "\n")
        step = int(record.get("step", 0))
        prefix = scalar_prefix(record)
        numbers = scalars(record, prefix)
        if self.writer is not None:
            for key, value in numbers.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.wandb is not None:
            kind = prefix.split("/")[0]
            if kind not in self._wandb_kinds:  # each kind on its own x axis
                self.wandb.define_metric(f"{kind}/step")
                self.wandb.define_metric(f"{kind}/*", step_metric=f"{kind}/step")
                self._wandb_kinds.add(kind)
            self.wandb.log({**numbers, f"{kind}/step": step})

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.wandb is not None:
            _close_wandb(self.folder)
            self.wandb = None


WANDB_ID_FILE = "wandb_run_id"
_wandb_runs: dict[Path, list] = {}  # run folder -> [W&B run, RunLogs using it]


def _open_wandb(folder: Path, config: TrainConfig) -> Any:
    """The folder's W&B run: started once per process and shared; resumed by the id kept in the folder."""
    key = folder.resolve()
    if key in _wandb_runs:
        _wandb_runs[key][1] += 1
        return _wandb_runs[key][0]
    try:
        import wandb
    except ImportError as error:
        raise RuntimeError(
            "logging.wandb_project is set but wandb is not installed: pip install wandb"
        ) from error
    id_file = folder / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else ""
    if not run_id:
        run_id = uuid.uuid4().hex[:12]  # a W&B run id: letters and digits
        id_file.write_text(run_id + "\n")
    name = config.name if key == Path(config.out_dir).resolve() else f"{config.name}-{folder.name}"
    run = wandb.init(
        project=config.logging.wandb_project,
        name=name,
        id=run_id,
        resume="allow",
        dir=str(folder),
        config=config.to_dict(),
        reinit="create_new",
    )
    _wandb_runs[key] = [run, 1]
    return run


def _close_wandb(folder: Path) -> None:
    entry = _wandb_runs[folder.resolve()]
    entry[1] -= 1
    if entry[1] == 0:
        entry[0].finish()
        del _wandb_runs[folder.resolve()]


def scalar_prefix(record: dict[str, Any]) -> str:
    kind = str(record.get("kind", "rl"))
    return f"{kind}/{record['point']}" if kind == "eval" and "point" in record else kind


def scalars(record: dict[str, Any], prefix: str) -> dict[str, float]:
    """The finite numbers of a record (nested dicts flattened) under their TensorBoard/W&B names."""
    out: dict[str, float] = {}

    def visit(key: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                visit(f"{key}/{k}", v)
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)

    for key, value in record.items():
        if key in ("step", "kind", "point"):
            continue
        visit(key if "/" in key else f"{prefix}/{key}", value)
    return out


RESUMABLE_CHANGES = ("rl.steps", "logging.", "checkpoint.", "out_dir")  # what a resumed run may change


def check_same_run(saved: Path, config: TrainConfig) -> None:
    import yaml

    derived = set(derived_keys(TrainConfig))  # a config.yaml written before they were derived holds them
    before = {k: v for k, v in flatten(yaml.safe_load(saved.read_text()) or {}).items() if k not in derived}
    now = flatten(json.loads(json.dumps(config.to_dict())))  # tuples as lists, as YAML reads them
    changed = sorted(
        key
        for key in set(before) | set(now)
        if before.get(key) != now.get(key) and not key.startswith(RESUMABLE_CHANGES)
    )
    if changed:
        details = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed[:5])
        raise FileExistsError(
            f"{saved.parent} holds a run with another configuration ({details}); resume it with the same "
            "settings, or start a new run with --out DIR"
        )


def _keep(record: Any, purge_from: int) -> bool:
    if not isinstance(record, dict):
        return False
    return not (record.get("kind") in ("rl", "eval-rl") and int(record.get("step", 0)) >= purge_from)


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


class RunState:
    """What a run has done, kept in its folder's progress.json (written atomically at each `save`): the stages
    finished, the accuracies and evaluations, the seconds per stage and the run's wall time, earlier (killed)
    attempts included up to their last save. Without `resume` it starts empty."""

    def __init__(self, folder: Path, *, resume: bool) -> None:
        self.path = folder / PROGRESS_FILE
        self.progress: dict[str, Any] = json.loads(self.path.read_text()) if resume and self.path.exists() else {}
        self.started = time.perf_counter()
        self.previous_wall_s = float(self.progress.get("wall_time_s", 0.0))
        self.stage_seconds: dict[str, float] = dict(self.progress.get("stage_seconds", {}))
        self.timer = StageTimer(self.stage_seconds)  # the run's stages (saved with the next `save`)

    def wall_time_s(self) -> float:
        return self.previous_wall_s + time.perf_counter() - self.started

    def save(self) -> None:
        self.progress["stage_seconds"] = self.stage_seconds
        self.progress["wall_time_s"] = self.wall_time_s()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(dumps(self.progress, indent=2))
        tmp.replace(self.path)


class StageTimer:
    """Wall seconds per named stage: `with timer("rollout") as took: ...` adds them (a stage entered twice adds
    up; `took.seconds` is this time's), `add(stage, seconds)` adds a measured amount (a step's stages to the
    run's). The one way stages are timed: a step's (rl_loop) and the run's (RunState.timer, progress.json)."""

    def __init__(self, seconds: dict[str, float] | None = None) -> None:
        self.seconds: dict[str, float] = seconds if seconds is not None else {}

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[Elapsed]:
        took, started = Elapsed(), time.perf_counter()
        try:
            yield took
        finally:
            took.seconds = time.perf_counter() - started
            self.add(stage, took.seconds)


@dataclass
class Elapsed:
    """What a stage took, once its `with` block is left."""

    seconds: float = 0.0
