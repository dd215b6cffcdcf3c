"""The training configuration: typed dataclasses (the one source of truth), YAML recipes, key=value overrides.

    config = load_config(recipe="smollm2-arith", overrides=["rl.steps=4", "rl.stare.w=1.2"])
    config = load_config(path="my.yaml")                          # same schema as train/recipes/*.yaml

Every key is typed and checked where the config loads: an unknown key, a value of the wrong type or shape, or
a word outside its closed set (engines, dtypes, renderings, sandboxes, algorithms, ...) is an error that names
the key, the value, what is allowed and the nearest allowed word ("did you mean"). A scalar is read with its field's type: `sft.data=off` and
`name=2024-01-01` stay strings, `rl.steps=4` is an int. Every field is read where it takes effect (`Trainer`).

The algorithm is a preset (`rl.algorithm`: one of `stare_agents.algo.config.ALGORITHMS`, e.g. stare, stare-c2,
stare-random, grpo-ds) whose fields are typed keys under `rl` that override the preset's values:
`rl.stare.top_ratio` (P), `rl.stare.w` (W), `rl.stare.m` (M), `rl.stare.target_entropy` (H_tgt),
`rl.stare.adaptive` / `alpha` / `w_max` / `m_min`, `rl.loss.clip_high`, `rl.loss.normalization`,
`rl.dynamic_sampling`, `rl.one_member_groups`, ... (AlgorithmConfig's fields). A key left out keeps the
preset's value; `config.algorithm()` is the result. The older spelling `rl.algorithm_overrides.<field>` is
still read (as `rl.<field>`) and says once that it is deprecated.

The package's files: `schema.py` (the sections and `TrainConfig`), `rollout_section.py` (the `rollout` section and
its engine and GPU checks), `evaluation.py` (the `eval` section and its benchmarks), `typed.py` (the typed builder under them), `loading.py` (recipes, files, overrides) and `checks.py`
(`check_run`).

`check_run(config)` (the trainer calls it before any work) goes further than the types: it imports
`env.imports`, constructs the environment once with its keyword arguments (a keyword it does not take is an
error naming it), and checks that `sft.data` can be served.
"""

from __future__ import annotations

from stare_agents.train.config.checks import (
    check_run,
)
from stare_agents.train.config.evaluation import (
    BenchmarkEval,
    EvalSection,
    benchmark_protocol,
    check_benchmarks,
)
from stare_agents.train.config.loading import (
    load_config,
    recipe_names,
    save_config,
)
from stare_agents.train.config.rollout_section import ENGINE_OWNED_KWARGS, RolloutSection
from stare_agents.train.config.schema import (
    ALGORITHM_FIELDS,
    MICRO_BATCH_SKEW,
    RECIPES_DIR,
    CheckpointSection,
    EnvSection,
    LoggingSection,
    ModelSection,
    RLSection,
    SFTSection,
    TrainConfig,
    absolute_paths,
    gpu_sharing_problem,
    resolved_weight_sync,
)
from stare_agents.train.config.typed import (
    INLINE,
    build,
    derived_keys,
    flatten,
    settings_dict,
)

__all__ = [
    "ALGORITHM_FIELDS",
    "ENGINE_OWNED_KWARGS",
    "INLINE",
    "MICRO_BATCH_SKEW",
    "RECIPES_DIR",
    "BenchmarkEval",
    "CheckpointSection",
    "EnvSection",
    "EvalSection",
    "LoggingSection",
    "ModelSection",
    "RLSection",
    "RolloutSection",
    "SFTSection",
    "TrainConfig",
    "absolute_paths",
    "benchmark_protocol",
    "build",
    "check_benchmarks",
    "check_run",
    "derived_keys",
    "flatten",
    "gpu_sharing_problem",
    "load_config",
    "recipe_names",
    "resolved_weight_sync",
    "save_config",
    "settings_dict",
]
