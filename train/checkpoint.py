"""Checkpoints written atomically: a process killed mid-save (SIGKILL included) never leaves a corrupt
or half-written checkpoint under a checkpoint's name, so the last complete one always loads.

    save_checkpoint(state, checkpoint_path(run_dir, step=7), model=learner.model, tokenizer_dir=start_dir)
    path = latest_checkpoint(run_dir)          # None when there is none yet
    state = load_checkpoint(path)              # state["learner"]["model"] filled from the folder's weights

A checkpoint of a run is a folder `checkpoints/step-<8 digits>/` that is also a Hugging Face model folder
(config.json, model.safetensors, the tokenizer), so `stare-agents eval --model <it>` evaluates the policy
of that step; what resuming needs besides the weights (optimiser, schedule, gate, RNG states, counters) is
in `trainer_state.ckpt` next to them. The weights are written once: `state["learner"]["model"]` is left out
of `trainer_state.ckpt` and put back by `load_checkpoint` from the folder's safetensors.

A save writes `.<name>.tmp-<pid>` next to the target, flushes and fsyncs it, renames it over the target
(atomic on POSIX) and fsyncs the directory. Loading uses `torch.load(weights_only=True)`: a checkpoint
holds tensors, numbers, strings, lists, tuples and dicts only, never pickled code. A single-file
checkpoint (`step-<8 digits>.pt`, the layout before folders) still lists, loads and resumes.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stare_agents.models import SHARDS_DIR  # a sharded checkpoint's model and optimiser

CHECKPOINT_NAME = re.compile(r"^step-(\d{8})(\.pt)?$")
SHARD_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # torch.distributed.checkpoint's file of one rank
STATE_FILE = "trainer_state.ckpt"  # not a weight-file suffix: model loaders and fingerprints ignore it
MODEL_STATE = ("learner", "model")  # where a trainer's state keeps the policy's weights


def checkpoint_path(directory: str | Path, step: int) -> Path:
    """`<directory>/checkpoints/step-<8 digits>` (a folder)."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return Path(directory) / "checkpoints" / f"step-{step:08d}"


def save_checkpoint(
    state: dict[str, Any],
    path: str | Path,
    *,
    model: Any = None,
    tokenizer_dir: str | Path | None = None,
    shards: Callable[[Path], Any] | None = None,
    ranks: int | None = None,
) -> Path:
    """Write `state` to `path` atomically (see the module docstring); returns `path`.

    `shards`, for a data-parallel learner: called with the folder's `learner_shards/`, which its workers fill
    with their shards (torch.distributed.checkpoint); what it returns is stored as `state["learner"]`. With `ranks`
    (the learner's world size) the folder must then hold every rank's shard file and DCP's metadata, as this process
    sees it (`missing_shards`), or nothing is kept and the error names what is missing.
    `path` ending in `.pt` is one file; otherwise a folder holding `trainer_state.ckpt` and, given `model`
    (a Hugging Face model), the model with the tokenizer of `tokenizer_dir`: then `state["learner"]["model"]`
    (when present, the same weights) is not stored twice."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        if path.suffix == ".pt":
            _save_file(state, tmp)
        else:
            tmp.mkdir()
            if shards is not None:  # a data-parallel learner's own shards, written by its workers; what it
                small = shards(tmp / SHARDS_DIR)  # returns (the rest of its state) is state["learner"]
                if small is not None:
                    state = {**state, "learner": small}
                missing = missing_shards(tmp / SHARDS_DIR, ranks) if ranks is not None else []
                if missing:
                    raise RuntimeError(unshared_shards(f"checkpoint {path}", SHARDS_DIR, ranks, missing))
                if tokenizer_dir is not None:  # the model's config and tokenizer: `stare-agents eval --model`
                    for source in Path(tokenizer_dir).iterdir():  # exports the weights from the shards
                        if source.is_file() and not source.name.endswith((".safetensors", ".bin", ".pt")):
                            shutil.copy2(source, tmp / source.name)
                for file in (tmp / SHARDS_DIR).iterdir():
                    if file.is_file():
                        _fsync_file(file)
                _fsync_dir(tmp / SHARDS_DIR)
            if model is not None:
                model.save_pretrained(tmp, safe_serialization=True)
                if tokenizer_dir is not None:
                    from transformers import AutoTokenizer

                    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp)
                state = _without_model(state)
            _save_file(state, tmp / STATE_FILE)
            for file in tmp.iterdir():  # the model's files too: the folder is complete once renamed
                if file.is_file():
                    _fsync_file(file)
            _fsync_dir(tmp)
            _remove(path)  # only a repeated save of the same step finds one here
        os.replace(tmp, path)
    finally:
        _remove(tmp)
    _fsync_dir(path.parent)
    return path


def missing_shards(folder: Path, ranks: int) -> list[str]:
    """What a sharded checkpoint's folder lacks of what `ranks` workers write with torch.distributed.checkpoint:
    its `.metadata` (the coordinator's, rank 0) and each rank's shard file (`__<rank>_<n>.distcp`)."""
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    have = {int(m.group(1)) for name in names if (m := SHARD_FILE.match(name))}
    missing = [] if ".metadata" in names else [".metadata (rank 0's)"]
    return missing + [f"__{rank}_0.distcp (rank {rank}'s)" for rank in range(ranks) if rank not in have]


def unshared_shards(what: str, folder: str | Path, ranks: int, missing: list[str]) -> str:
    """The error of shards written where this process does not see them (`missing_shards`)."""
    return (
        f"{what}: after the {ranks} learner workers wrote their shards, {folder} lacks {', '.join(missing)} where "
        "this process looks: those workers wrote on storage it does not see (their node does not share the run "
        "folder). Nothing was kept (every rank's shards are needed); put --out on storage every node mounts at "
        "the same path"
    )


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state of a checkpoint folder (with the policy's weights put back) or of a `.pt` file."""
    path = Path(path)
    file = path / STATE_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}; list the run's checkpoints with latest_checkpoint(run_dir)"
        )
    try:
        state = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as error:
        raise ValueError(
            f"checkpoint {file} cannot be loaded ({type(error).__name__}: {str(error)[:300]}); it holds "
            "something other than tensors, numbers, strings, lists and dicts, or was not written by "
            "save_checkpoint"
        ) from error
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {file} holds a {type(state).__name__}, not a state dict")
    if path.is_dir() and (path / "config.json").is_file() and not state.get("sharded"):
        outer, key = MODEL_STATE
        if isinstance(state.get(outer), dict) and key not in state[outer]:
            state[outer][key] = checkpoint_model_state(path)
    return state


def checkpoint_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The policy's weights of a checkpoint folder, as the learner holds them (float32, tied weights too)."""
    from stare_agents.train.policy import load_causal_lm

    return load_causal_lm(path).state_dict()


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint of a run directory, by step."""
    folder = Path(directory) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in folder.iterdir()
        if (m := CHECKPOINT_NAME.match(p.name))
        and (p.is_file() if m.group(2) else (p / STATE_FILE).is_file())
    ]
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
        _remove(path)
    return removed


def _without_model(state: dict[str, Any]) -> dict[str, Any]:
    outer, key = MODEL_STATE
    if isinstance(state.get(outer), dict) and key in state[outer]:
        state = {**state, outer: {k: v for k, v in state[outer].items() if k != key}}
    return state


def _save_file(state: dict[str, Any], path: Path) -> None:
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
