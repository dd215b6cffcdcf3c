"""Checks before a run starts, past what the types can say (`check_run`): the environment, its keyword
arguments, `sft.data` and `--compare`."""

from __future__ import annotations

from pathlib import Path

from stare_agents.algo.config import ALGORITHMS
from stare_agents.envs.dapo_math import DAPO_FILE
from stare_agents.envs.tasks import FILE_SUFFIXES
from stare_agents.train.config.config_code import check_config_code
from stare_agents.train.config.schema import TYPED_ENV_KEYS, TrainConfig
from stare_agents.train.config.typed import plain_data

DATA_KEYS = ("dataset", "heldout_dataset")  # env.kwargs that name a task file


def check_run(config: TrainConfig, *, compare: str | None = None) -> None:
    """What the types cannot say, checked before any work (model, engines, base evaluation, SFT) starts:
    code the config would make the trainer import or run is acknowledged (`config_code`, before `env.imports`
    import); `--compare` names another algorithm; `env.imports` import; the environment exists, takes every
    keyword of `env.kwargs` (and the typed keys TYPED_ENV_KEYS when set) and can be constructed with them, for
    training and (with eval.num_tasks > 0) held-out tasks; `sft.data` can be served (the environment has a solver, or the file exists).
    Every error is a ValueError naming the key, the value and what is allowed."""
    from stare_agents.envs.registration import (
        accepted_kwargs,
        env_class,
        has_solver,
        resolve_env_id,
        split_kwargs,
    )
    from stare_agents.rollout import RolloutTask, make_env
    from stare_agents.sandbox import NoSandbox

    check_config_code(config)
    if compare is not None and (compare not in ALGORITHMS or compare == config.rl.algorithm):
        others = [name for name in ALGORITHMS if name != config.rl.algorithm]
        raise ValueError(
            f"--compare={compare!r}: allowed: an algorithm other than rl.algorithm={config.rl.algorithm!r}: "
            f"{', '.join(others)}"
        )
    env = config.env
    try:
        env_id = resolve_env_id(env.id, env.imports)
    except ValueError as error:
        raise ValueError(f"env.id={env.id!r} (env.imports={env.imports}): {error}") from None
    kwargs = env.make_kwargs()
    accepted = accepted_kwargs(env_id)
    creator = env_class(env_id)
    what = f"{env_id} ({getattr(creator, '__name__', creator)})"
    if accepted is not None:
        for key, value in kwargs.items():
            if key not in accepted:
                name = f"env.{key}" if key in TYPED_ENV_KEYS else f"env.kwargs.{key}"
                raise ValueError(
                    f"{name}={value!r}: {what} takes no keyword {key!r}; allowed: "
                    f"{', '.join(sorted(accepted - {'sandbox', 'tools'}))}"
                )
    for key in DATA_KEYS:  # a data file the config names: missing -> said now, with how to make it
        value = kwargs.get(key)
        path = Path(value).expanduser() if isinstance(value, str | Path) else None
        if path is not None and path.suffix in FILE_SUFFIXES and not path.exists():
            raise ValueError(missing_data(f"env.kwargs.{key}", str(value)))
    # the held-out split only where held-out tasks are drawn: a dataset without a held-out part trains with
    # eval.num_tasks=0 (the paper recipes, which evaluate on eval.benchmarks)
    for split in ("train", "heldout") if config.eval.num_tasks else ("train",):
        split_args = split_kwargs(env_id, kwargs, split)
        try:
            made = make_env(RolloutTask(env_id, env_kwargs=split_args), NoSandbox())
            made.close()
        except Exception as error:  # the environment's own check of its arguments, whatever it raises
            raise ValueError(
                f"env.kwargs={plain_data(split_args)!r}: {what} cannot be made with them "
                f"({type(error).__name__}: {error})"
            ) from None
    if config.sft.enabled and config.sft.data == "solver" and not has_solver(env_id):
        raise ValueError(
            f"sft.data='solver': {what} has no solver (ToolEnv.solution_code is not overridden); allowed: "
            "'solver' for an environment with one (e.g. stare_agents/ArithmeticTIR-v0), a JSONL file of "
            "conversations, or sft.enabled=false"
        )
    if config.sft.enabled and config.sft.data != "solver" and not Path(config.sft.data).is_file():
        raise ValueError(
            missing_data("sft.data", config.sft.data)
            + "; allowed: 'solver' (the environment's solver) or a JSONL file of conversations"
        )


def missing_data(key: str, value: str) -> str:
    """What to say of a data file a config names that is not there: where it was looked for, that the package
    ships none, and the command that makes it where there is one."""
    where = Path(value).expanduser().absolute()
    message = f"{key}={value!r}: no such file (looked for {where}); the package ships no training data"
    if Path(value).name == DAPO_FILE:
        return f"{message}: make this one with `stare-agents envs prepare-dapo-math --out {value}`"
    return message
