"""Loading a training configuration: defaults <- a recipe (train/recipes/NAME.yaml) or a YAML file <-
`key=value` overrides, built by the typed builder (`typed.build`); and saving one.

    config = load_config(recipe="smollm2-arith", overrides=["rl.steps=4"])
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from stare_agents.train.config.schema import (
    ALGORITHM_FIELDS,
    PRECISION_FIXES,
    PRECISION_PRESETS,
    RECIPES_DIR,
    TrainConfig,
)
from stare_agents.train.config.typed import build, did_you_mean, flatten, load_scalars, plain_data

logger = logging.getLogger("stare_agents.train")


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def load_config(
    recipe: str | None = None, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> TrainConfig:
    """Defaults <- a recipe (train/recipes/NAME.yaml) or a YAML file <- `key=value` overrides."""
    if recipe is not None and path is not None:
        raise ValueError("give a recipe name or a config file, not both")
    data: dict[str, Any] = {}
    if recipe is not None:
        file = RECIPES_DIR / f"{recipe}.yaml"
        if not file.exists():
            raise FileNotFoundError(f"no recipe {recipe!r}; recipes: {recipe_names()}{did_you_mean([recipe], recipe_names())}")
        data = _read_yaml(file)
    elif path is not None:
        data = _read_yaml(Path(path))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not key=value (e.g. rl.steps=4)")
        _set_path(data, key.strip().split("."), load_scalars(raw, f"override {item!r}"))
    _merge_algorithm_overrides(data)
    _apply_precision(data)
    return build(TrainConfig, data, "")


def save_config(config: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(config.to_yaml())


def _read_yaml(path: Path) -> dict[str, Any]:
    data = load_scalars(path.read_text(), str(path)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping")
    return data


def _set_path(data: dict, keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        data = data.setdefault(key, {})
        if not isinstance(data, dict):
            raise ValueError(f"cannot set {'.'.join(keys)}: {key} is not a section")
    data[keys[-1]] = value


def _apply_precision(data: dict[str, Any]) -> None:
    """The one-word `precision` (PRECISION_PRESETS): its keys set where the config leaves them out; a dtype it
    names (PRECISION_FIXES) that the config sets otherwise is refused."""
    word = plain_data(data.get("precision"))
    if word is None:
        return
    if word not in PRECISION_PRESETS:
        raise ValueError(
            f"precision={word!r}: allowed: {', '.join(PRECISION_PRESETS)}, or null (model.rollout_dtype, "
            "rl.learner.precision and their corrections each set on their own)"
        )
    for key, value in PRECISION_PRESETS[word].items():
        *sections, name = key.split(".")
        target = data
        for part in sections:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ValueError(f"precision={word} sets {key}, but {part} is set to a value, not a section")
        if name not in target:
            target[name] = value
        elif key in PRECISION_FIXES and plain_data(target[name]) != value:
            raise ValueError(
                f"{key}={plain_data(target[name])!r} disagrees with precision={word}, which sets {key}={value!r}: "
                f"remove one of them (precision=null to set the precisions key by key)"
            )


def _merge_algorithm_overrides(data: dict[str, Any]) -> None:
    """The deprecated `rl.algorithm_overrides.<field>` read as `rl.<field>` (a key set both ways is refused)."""
    rl = data.get("rl")
    if not isinstance(rl, dict) or "algorithm_overrides" not in rl:
        return
    overrides = rl.pop("algorithm_overrides")
    if not isinstance(overrides, dict):
        raise ValueError(
            f"rl.algorithm_overrides={overrides!r}: allowed: a mapping of the algorithm's fields"
        )
    logger.warning(
        "rl.algorithm_overrides is deprecated: its keys are typed keys under rl now (rl.stare.w=1.2, "
        "rl.loss.clip_high=0.2, rl.dynamic_sampling=false); reading %s as rl.*",
        sorted(flatten(overrides)),
    )
    for key, value in flatten(overrides).items():
        path = key.split(".")
        if path[0] not in ALGORITHM_FIELDS:
            raise ValueError(
                f"rl.algorithm_overrides.{key}={plain_data(value)!r}: {path[0]!r} is not a field of the "
                f"algorithm; allowed: {', '.join(ALGORITHM_FIELDS)}"
            )
        target = rl
        for part in path[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ValueError(f"rl.algorithm_overrides.{key}: rl.{part} is set to a value, not a section")
        if path[-1] in target:
            raise ValueError(f"rl.{key} is set twice: as rl.{key} and as rl.algorithm_overrides.{key}")
        target[path[-1]] = value
