"""Checkpoints written atomically: a process killed mid-save (SIGKILL included) never leaves a corrupt
or half-written checkpoint under a checkpoint's name, so the last complete one always loads.

    save_checkpoint(learner.state_dict() | {"data_position": 7}, checkpoint_path(run_dir, step=7))
    path = latest_checkpoint(run_dir)          # None when there is none yet
    learner.load_state_dict(load_checkpoint(path))

A save writes `.<name>.tmp-<pid>` next to the target, flushes and fsyncs it, renames it over the target
(atomic on POSIX) and fsyncs the directory. Loading uses `torch.load(weights_only=True)`: a checkpoint
holds tensors, numbers, strings, lists, tuples and dicts only, never pickled code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(directory: str | Path, step: int) -> Path:
    """`<directory>/checkpoints/step-<8 digits>.pt`."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return Path(directory) / "checkpoints" / f"step-{step:08d}.pt"


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write `state` to `path` atomically (see the module docstring); returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}; list the run's checkpoints with latest_checkpoint(run_dir)"
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise ValueError(
            f"checkpoint {path} cannot be loaded ({type(error).__name__}: {str(error)[:300]}); it holds "
            "something other than tensors, numbers, strings, lists and dicts, or was not written by "
            "save_checkpoint"
        ) from error


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint of a run directory, by step."""
    folder = Path(directory) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := CHECKPOINT_NAME.match(p.name))]
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1][1] if checkpoints else None


def prune_checkpoints(directory: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the `keep_last` newest checkpoints and any temporary file of a killed save;
    returns what was deleted."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (never delete the last checkpoint), got {keep_last}")
    removed = [path for _, path in list_checkpoints(directory)[:-keep_last]]
    folder = Path(directory) / "checkpoints"
    if folder.is_dir():
        removed += [p for p in folder.iterdir() if p.name.startswith(".") and ".tmp-" in p.name]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed
