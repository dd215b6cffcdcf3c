"""A run's held-out evaluations for the viewer's across-training view: each evaluation point (base, SFT, each
evaluation during RL, the end of each RL run) with its accuracy (metrics.jsonl "eval" records, and "rl" records'
`eval/accuracy`) and its samples (`<run>/heldout/<point>.jsonl.gz`, kept by trainers since issue 49).

    points, note = heldout_points_of(folder, records, unread)

A compare arm's folder (`train --compare grpo-ds` writes `RUN/grpo-ds/`) has no `heldout/` of its own: its
points are its parent's "base", "sft" and "rl-grpo-ds*". A run folder written before samples were kept shows
its accuracies with a note that says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare_agents.jsonl import Unread
from stare_agents.records import read_records
from stare_agents.rollout_log import (
    HELDOUT_DIR,
    SavedRollout,
    heldout_order,
    heldout_points,
    heldout_stage,
    read_rollouts,
)


@dataclass
class HeldoutPoint:
    """One evaluation point of a run: its name ("sft", "rl-step-000010"), a label for people, the RL steps
    done when it was taken (None: before RL), its accuracy when logged, and its samples when kept."""

    name: str
    label: str
    steps_done: int | None
    source: Path  # the run folder whose heldout/ holds it (a compare arm's parent for its base and SFT)
    accuracy: float | None = None
    samples: list[SavedRollout] = field(default_factory=list)

    def meta(self) -> dict[str, Any]:
        return {
            "point": self.name,
            "label": self.label,
            "steps": self.steps_done,
            "accuracy": self.accuracy,
            "samples": len(self.samples),
        }


def label(point: str, arm: str | None = None) -> tuple[str, int | None]:
    """("RL step 10", 10) for "rl-step-000010"; ("SFT", None); ("RL end", None) for "rl"; `arm` names the RL
    key the run folder's own RL has ("rl-grpo-ds" in a compare arm's parent) so that it reads "RL"."""
    if point == "base":
        return "base", None
    if point == "sft":
        return "SFT", None
    key, step = heldout_stage(point)
    name = "RL" if key in ("rl", arm) else "RL " + key.removeprefix("rl-")
    return (f"{name} step {step}" if step is not None else f"{name} end"), step


def heldout_points_of(
    folder: Path, records: list[dict[str, Any]], unread: list[Unread] | None = None
) -> tuple[list[HeldoutPoint], str | None]:
    """The evaluation points of the run in `folder` (see the module docstring) in training order, and a note
    when samples are missing (None when every point has them). `records`: the run's metrics.jsonl records."""
    own = heldout_points(folder)
    source, arm, eval_records = folder, None, records
    if not own and (folder.parent / HELDOUT_DIR).is_dir():  # a compare arm: its points are in its parent's
        parent = [
            p for p in heldout_points(folder.parent) if p in ("base", "sft") or _key(p) == f"rl-{folder.name}"
        ]
        if any(p not in ("base", "sft") for p in parent):
            own, source, arm = parent, folder.parent, f"rl-{folder.name}"
            eval_records = read_records(folder.parent / "metrics.jsonl")
    accuracies = {
        **_accuracies([r for r in eval_records if r.get("kind") == "eval"], arm),
        **_accuracies([r for r in records if r.get("kind") == "rl"], arm),
    }
    for key in {_key(p) for p in own} - {
        "base",
        "sft",
        "rl",
        arm,
    }:  # a compare arm's own evaluations during RL
        if key.startswith("rl-") and (folder / key.removeprefix("rl-") / "metrics.jsonl").is_file():
            arm_records = read_records(folder / key.removeprefix("rl-") / "metrics.jsonl", "rl")
            accuracies.update(_accuracies(arm_records, key))
    names = sorted(set(own) | set(accuracies), key=heldout_order)
    points = []
    for name in names:
        text, step = label(name, arm)
        samples = _samples(source / HELDOUT_DIR / f"{name}.jsonl.gz", unread) if name in own else []
        points.append(HeldoutPoint(name, text, step, source, accuracies.get(name), samples))
    missing = [p.label for p in points if not p.samples]
    note = None
    if points and missing:
        note = (
            f"{folder.name}: no held-out samples for {', '.join(missing)} (accuracy only): the trainer keeps them "
            f"in {HELDOUT_DIR}/ since issue 49; older run folders have the accuracies in metrics.jsonl only"
        )
    elif not points:
        note = f"{folder.name}: no held-out evaluations (eval.num_tasks = 0, or not a training run's folder)"
    return points, note


def _samples(path: Path, unread: list[Unread] | None) -> list[SavedRollout]:
    """The samples of a held-out file; what cannot be read is named in `unread` (a file of which nothing could
    be read too: it costs its column, never the page)."""
    try:
        return read_rollouts(path, unread=unread)
    except ValueError as error:
        if unread is not None:
            unread.append(Unread(str(path), None, str(error).removeprefix(f"{path}: ")))
        return []


def _key(point: str) -> str:
    return heldout_stage(point)[0]


def _accuracies(records: list[dict[str, Any]], arm: str | None) -> dict[str, float]:
    """point -> held-out accuracy from a run's records: "eval" records by point, "rl" records' eval/accuracy
    (evaluations during RL, as "<key>-step-NNNNNN" after the record's step + 1 steps)."""
    out: dict[str, float] = {}
    for r in records:
        value = r.get("accuracy") if r.get("kind") == "eval" else r.get("eval/accuracy")
        if not (isinstance(value, int | float) and math.isfinite(value)):
            continue
        if r.get("kind") == "eval" and isinstance(r.get("point"), str):
            out[r["point"]] = float(value)
        elif r.get("kind") == "rl" and isinstance(r.get("step"), int):
            out[f"{arm or 'rl'}-step-{r['step'] + 1:06d}"] = float(value)
    if arm is not None:
        out = {p: v for p, v in out.items() if p in ("base", "sft") or _key(p) == arm}
    return out
