"""Code a configuration can make the trainer import or run, acknowledged only by whoever starts the run.

A config file travels (a recipe from a colleague, a run folder copied from elsewhere), and a few of its keys
reach past the project's own code: `rollout.engine_kwargs.trust_remote_code` runs a model repository's own
Python, class-path engine options (`worker_cls`, `logits_processors`, any value shaped like `pkg.module.Class`
or a `.py` file) make vLLM import what they name, and `rollout.ray_address` attaches to a Ray cluster, whose
tasks' results this process unpickles. As host execution (the local sandbox, STARE_ALLOW_LOCAL_SANDBOX=1), no
config can acknowledge them: the environment of the person who starts the run does, with
STARE_ALLOW_CONFIG_CODE=1; a cluster's address may also come as RAY_ADDRESS, which is that person's setting.

`config_code(config)` lists what a config asks for (a pure function); `check_config_code(config)` refuses it
unacknowledged, naming each key, its value and the remedy. `env.imports` (and `env.id`'s `module:Name`) are not
listed: they name modules of the user's own project on this machine, the documented way to add environments.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from stare_agents.rollout.local_ray import AUTO, LOCAL
from stare_agents.train.config.schema import TrainConfig
from stare_agents.train.config.typed import plain_data

ALLOW_CONFIG_CODE_ENV = "STARE_ALLOW_CONFIG_CODE"

# vLLM's EngineArgs fields whose value names code to import, whatever its shape (a class, a plugin file)
CODE_ENGINE_KWARGS = (
    "worker_cls",
    "worker_extension_cls",
    "scheduler_cls",
    "logits_processors",
    "model_class_overrides",
    "reasoning_parser_plugin",
    "io_processor_plugin",
    "log_config_file",
)
# values vLLM reads as the name of a Python object ("pkg.module.Class", "pkg.module:Class") or a file of code
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$|^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class CodeKey:
    """One key of a config that makes the trainer import or run code: where, its value, what it runs."""

    key: str
    value: Any
    runs: str


def _import_paths(value: Any, key: str) -> list[tuple[str, Any]]:
    """(key, value) of every string under `value` shaped like an import path or a .py file."""
    if isinstance(value, str):
        text = value.strip()
        return [(key, value)] if _IMPORT_PATH.match(text) or text.endswith(".py") else []
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _import_paths(v, f"{key}.{k}")]
    if isinstance(value, list | tuple):
        return [found for i, v in enumerate(value) for found in _import_paths(v, f"{key}[{i}]")]
    return []


def config_code(config: TrainConfig) -> list[CodeKey]:
    """The keys of `config` through which it would make the trainer import or run code from outside the project
    (see the module docstring), in the order of the config."""
    found: list[CodeKey] = []
    for name, value in config.rollout.engine_kwargs.items():
        key = f"rollout.engine_kwargs.{name}"
        if name == "trust_remote_code":
            if value:
                found.append(
                    CodeKey(key, value, "the model repository's own Python (Hugging Face remote code)")
                )
        elif name in CODE_ENGINE_KWARGS:
            if value:
                found.append(CodeKey(key, plain_data(value), "the code it names, imported by vLLM"))
        else:
            found += [
                CodeKey(k, v, "the code it names, imported by vLLM") for k, v in _import_paths(value, key)
            ]
    address = config.rollout.ray_address
    if address and address not in (LOCAL, AUTO):
        runs = "a Ray cluster's tasks, whose results this process unpickles"
        found.append(CodeKey("rollout.ray_address", address, runs))
    return found


def code_acknowledged() -> bool:
    """True when STARE_ALLOW_CONFIG_CODE is 1/true/yes in this process's environment."""
    return os.environ.get(ALLOW_CONFIG_CODE_ENV, "").strip().lower() in ("1", "true", "yes")


def check_config_code(config: TrainConfig) -> None:
    """Refuse a config that would make the trainer import or run code (`config_code`) unless whoever starts the
    run acknowledged it with STARE_ALLOW_CONFIG_CODE=1. The error names every such key, its value and the
    remedy."""
    found = config_code(config)
    if not found or code_acknowledged():
        return
    listed = "; ".join(f"{c.key}={c.value!r} runs {c.runs}" for c in found)
    remedies = [f"set {ALLOW_CONFIG_CODE_ENV}=1 in the environment of the run if you trust them"]
    if any(c.key == "rollout.ray_address" for c in found):
        remedies.append(f"give the cluster as RAY_ADDRESS={config.rollout.ray_address} instead of the key")
    remedies.append("or remove the keys")
    raise ValueError(
        f"the run's config makes the trainer import or run code from outside the project: {listed}. A config "
        f"cannot acknowledge that, whoever starts the run does: {', '.join(remedies)}"
    )


__all__ = ["ALLOW_CONFIG_CODE_ENV", "CODE_ENGINE_KWARGS", "CodeKey", "check_config_code", "config_code"]
