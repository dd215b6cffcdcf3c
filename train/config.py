"""The training configuration: typed dataclasses (the one source of truth), YAML recipes, key=value overrides.

    config = load_config(recipe="smollm2-arith", overrides=["rl.steps=4", "rl.stare.w=1.2"])
    config = load_config(path="my.yaml")                          # same schema as train/recipes/*.yaml

Every field is read where it takes effect (`Trainer`); an unknown key is an error that lists the known ones.
The algorithm is a preset name (`rl.algorithm: stare | stare-c2 | grpo | grpo-ds | dapo | entropy-bonus |
clip-cov | kl-cov | entrocraft`) whose fields can be overridden under `rl.algorithm_overrides`
(e.g. `rl.algorithm_overrides.stare.target_entropy=0.2`, `rl.algorithm_overrides.loss.clip_high=0.2`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stare_agents.algo import AlgorithmConfig
from stare_agents.train.learner import LearnerConfig
from stare_agents.train.policy import OptimizerConfig

RECIPES_DIR = Path(__file__).with_name("recipes")


@dataclass
class ModelSection:
    name: str = "smollm2-135m"  # "tiny", "smollm2-135m", a local HF folder or a hub id
    rollout_dtype: str = (
        "fast"  # the engine's dtype: "auto" (the checkpoint's), "float32", "bfloat16", "fast"
    )
    max_model_len: int = 2048


@dataclass
class EnvSection:
    id: str = "stare_agents/ArithmeticTIR-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)  # for gym.make (training and evaluation)
    imports: list[str] = field(default_factory=list)  # modules that register your own environments
    train_seed: int = 0  # training task i of the run is reset with seed train_seed + i
    eval_seed: int = 1_000_000  # held-out tasks: eval_seed + i (disjoint from training seeds)


@dataclass
class RolloutSection:
    engine: str = "vllm"  # "vllm" or "hf"
    use_ray: bool = True  # False: one in-process worker (no Ray)
    workers: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens_per_turn: int = 256
    max_total_tokens: int = 768  # response budget per episode (policy + observation tokens)
    rendering: str = "auto"  # "auto" | "chat" | "inline"
    sandbox: str = "docker"  # "docker" | "local" (needs STARE_ALLOW_LOCAL_SANDBOX=1) | "none" (no tools run)
    sandbox_pool_size: int = 8
    sandbox_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"runtime": "runsc"}
    max_concurrency: int = 64
    kv_cache_gib: float = 2.0  # vLLM on CPU: KV cache per worker
    multiprocess: bool | None = None  # vLLM's engine core in its own process (None: yes on GPUs, no on CPUs)
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0  # 1 on a GPU cluster: one rollout worker per GPU
    timeout_s: float | None = 10800.0  # one step's rollout; episodes unfinished by then fail (engine_error)

    def __post_init__(self) -> None:
        # the learner scores softmax(logits / temperature) exactly; a top-p nucleus it cannot reproduce per token
        # (the rollout log-prob of a token inside the nucleus is renormalised, the learner's would not be)
        if not self.temperature > 0:
            raise ValueError(f"rollout.temperature must be > 0 for RL training, got {self.temperature}")
        if self.top_p != 1.0:
            raise ValueError(
                f"rollout.top_p={self.top_p}: RL training samples with top_p=1, because the learner scores the "
                "full distribution at rollout.temperature, and nucleus-truncated log-probs would make every "
                "ratio, TIS weight and surprisal compare two different distributions; use rollout.temperature "
                "to sharpen sampling (evaluation has its own eval.temperature)"
            )


@dataclass
class SFTSection:
    enabled: bool = True
    data: str = "solver"  # "solver": traces from the environment's solver; or a JSONL file of conversations
    num_examples: int = 128
    epochs: int = 1
    batch_size: int = 8
    lr: float = 5e-5
    warmup_steps: int = 2
    micro_batch_tokens: int = 4096
    precision: str = "fast"  # "fp32", "bf16" (autocast) or "fast" (bf16 where the hardware has it)


@dataclass
class RLSection:
    steps: int = 8
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    algorithm: str = "stare"
    algorithm_overrides: dict[str, Any] = field(default_factory=dict)
    learner: LearnerConfig = field(
        default_factory=lambda: LearnerConfig(optimizer=OptimizerConfig(lr=1e-6), micro_batch_tokens=4096)
    )
    learner_workers: int = 1  # > 1: data-parallel learner workers (Ray actors, gloo on CPU, NCCL on GPU)
    learner_gpus_per_worker: float = 0.0  # GPU cluster: 1
    fsdp: bool = False  # shard the learner's model over its GPU workers (models that do not fit one GPU)
    drop_void_turns: bool = False  # SimpleTIR: trajectories with a void turn are left out of the loss
    # dynamic sampling (DAPO): draw up to this many batches of prompts per step until prompts_per_step groups
    # have reward variance; 1: filter only (a step may train on fewer groups)
    sampling_rounds: int = 1
    # a step stops the run when more than this share of its episodes failed for the infrastructure (engine,
    # sandbox, environment); below it, failed episodes leave the loss and are counted (rollout/failed)
    max_failed_fraction: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.max_failed_fraction <= 1:
            raise ValueError(f"rl.max_failed_fraction must be in [0, 1], got {self.max_failed_fraction}")
        if (
            self.steps < 0
            or self.prompts_per_step < 1
            or self.samples_per_prompt < 1
            or self.sampling_rounds < 1
        ):
            raise ValueError(
                f"need rl.steps >= 0 and rl.prompts_per_step, rl.samples_per_prompt, rl.sampling_rounds >= 1; got "
                f"{self.steps}, {self.prompts_per_step}, {self.samples_per_prompt}, {self.sampling_rounds}"
            )


@dataclass
class BenchmarkEval:
    """One held-out benchmark evaluated during training (every eval.every RL steps and at the end) with the
    eval harness (`stare_agents.eval`), as `stare-agents eval` would evaluate it."""

    benchmark: str  # a harness name (aime24, math500, ...: <eval.data_dir>/<name>.jsonl), a file or a HF id
    protocol: str = "tir"  # the harness's protocol: tir, cot, simpletir, arith
    k: int = 1  # samples per problem: avg@k and pass@k
    limit: int | None = None  # only the first `limit` problems
    # None: the protocol's own setting
    temperature: float | None = None
    top_p: float | None = None
    max_turns: int | None = None
    max_tokens_per_turn: int | None = None
    max_total_tokens: int | None = None


@dataclass
class EvalSection:
    # held-out tasks (distinct problems; environments that take a `split` draw them from split="heldout" and
    # train on split="train", so no training draw can be an evaluation problem)
    num_tasks: int = 64
    base_num_tasks: int | None = (
        None  # held-out tasks for the base model (the first of them; None: num_tasks)
    )
    every: int = 0  # also evaluate every N RL steps (0: only before SFT, after SFT and at the end)
    every_num_tasks: int | None = None  # held-out tasks for the evaluations during RL (None: num_tasks)
    temperature: float = 0.0  # 0: greedy accuracy
    samples: int = 1  # samples per task (a task's score is their mean)
    bootstrap: int = 2000  # resamples of the tasks for the 95% intervals (paired for differences)
    # benchmarks evaluated every `every` RL steps and at the end of RL, into <run>/evals/step-NNNNNN/<name>/;
    # each a BenchmarkEval mapping, or just the benchmark (protocol tir, k 1)
    benchmarks: list[BenchmarkEval] = field(default_factory=list)
    data_dir: str | None = None  # where benchmark names resolve (None: $STARE_DATA_DIR, else ../shared/data)

    def __post_init__(self) -> None:
        sizes = (self.num_tasks, self.base_num_tasks or 1, self.every_num_tasks or 1, self.samples)
        if min(sizes) < 1 or self.every < 0 or self.bootstrap < 0:
            raise ValueError(
                "need eval.num_tasks, eval.base_num_tasks, eval.every_num_tasks, eval.samples >= 1 and "
                f"eval.every, eval.bootstrap >= 0; got {self}"
            )
        self.benchmarks = check_benchmarks(self.benchmarks, self.data_dir)


def check_benchmarks(entries: Any, data_dir: str | None) -> list[BenchmarkEval]:
    """`eval.benchmarks` as BenchmarkEval entries, each checked where the config loads: the protocol and its
    overrides, k, and the benchmark itself (a name or file is read and checked now; a Hugging Face id is
    loaded when the run starts)."""
    from stare_agents.eval.benchmarks import get_protocol, load_benchmark

    if not isinstance(entries, list | tuple):
        raise ValueError(f"eval.benchmarks must be a list of benchmarks, got {entries!r}")
    out: list[BenchmarkEval] = []
    names: dict[str, str] = {}
    for i, entry in enumerate(entries):
        where = f"eval.benchmarks[{i}]"
        if isinstance(entry, str):
            entry = BenchmarkEval(benchmark=entry)
        elif isinstance(entry, dict):
            entry = build(BenchmarkEval, entry, where + ".")
        elif not isinstance(entry, BenchmarkEval):
            raise ValueError(f"{where}: expected a benchmark name, file or mapping, got {entry!r}")
        if not isinstance(entry.k, int) or isinstance(entry.k, bool) or entry.k < 1:
            raise ValueError(f"{where}.k = {entry.k!r}: samples per problem must be an integer >= 1")
        if entry.limit is not None and entry.limit < 1:
            raise ValueError(f"{where}.limit = {entry.limit!r}: must be >= 1 problems (or null for all)")
        try:
            get_protocol(entry.protocol)
        except ValueError as error:
            raise ValueError(f"{where}.protocol = {entry.protocol!r}: {error}") from None
        try:
            benchmark_protocol(entry)
        except ValueError as error:
            raise ValueError(f"{where} (temperature, top_p, max_turns, token budgets): {error}") from None
        try:
            name = _benchmark_name(entry, data_dir, load_benchmark)
        except (ValueError, FileNotFoundError, KeyError, RuntimeError) as error:
            raise ValueError(f"{where}.benchmark = {entry.benchmark!r}: {error}") from None
        if name in names:
            raise ValueError(
                f"{where}.benchmark = {entry.benchmark!r} has the name {name!r} of {names[name]}: results are "
                "kept by name; rename one of the files"
            )
        names[name] = where
        out.append(entry)
    return out


def benchmark_protocol(entry: BenchmarkEval) -> Any:
    """The eval harness's protocol of a benchmark entry, with its overrides applied (and checked)."""
    from stare_agents.eval.benchmarks import get_protocol

    return get_protocol(entry.protocol).override(
        temperature=entry.temperature,
        top_p=entry.top_p,
        max_turns=entry.max_turns,
        max_tokens_per_turn=entry.max_tokens_per_turn,
        max_total_tokens=entry.max_total_tokens,
    )


def _benchmark_name(entry: BenchmarkEval, data_dir: str | None, load_benchmark: Any) -> str:
    from stare_agents.eval.benchmarks import benchmark_source

    name, source = benchmark_source(entry.benchmark, data_dir=data_dir)
    if source != entry.benchmark or Path(source).exists():  # a name or a file: read and check it now
        load_benchmark(entry.benchmark, data_dir=data_dir, limit=entry.limit)
    return name


@dataclass
class CheckpointSection:
    every: int = 2  # RL steps between checkpoints (0: none)
    keep_last: int = 2


@dataclass
class LoggingSection:
    tensorboard: bool = True
    wandb_project: str | None = None  # W&B when set (needs `pip install wandb` and a login)
    progress: bool = True
    rollouts: float = 1.0  # share of each RL step's groups saved to rollouts/ (1: all, 0: none)
    # also log learner/entropy_all: the learner's exact entropy over every trajectory that ran, not only the
    # trained ones (one more no-grad forward pass over the untrained trajectories per step). Off: the sampler's
    # mean surprisal over all trajectories (rollout/sampler_entropy, free) estimates the same quantity.
    entropy_all: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.rollouts, bool) or not 0.0 <= self.rollouts <= 1.0:
            raise ValueError(
                f"logging.rollouts is the share of each RL step's groups saved to rollouts/, in [0, 1] "
                f"(1: all, 0: none); got {self.rollouts!r}"
            )


@dataclass
class TrainConfig:
    name: str = "run"
    out_dir: str = "runs/run"
    seed: int = 0
    model: ModelSection = field(default_factory=ModelSection)
    env: EnvSection = field(default_factory=EnvSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    sft: SFTSection = field(default_factory=SFTSection)
    rl: RLSection = field(default_factory=RLSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)

    def __post_init__(self) -> None:
        # the learner scores what the rollout sampled: one temperature, set under rollout
        if self.rl.learner.temperature == 1.0:
            self.rl.learner.temperature = self.rollout.temperature
        elif self.rl.learner.temperature != self.rollout.temperature:
            raise ValueError(
                f"rl.learner.temperature={self.rl.learner.temperature} differs from rollout.temperature="
                f"{self.rollout.temperature}: the learner must score the distribution the rollout sampled "
                "from; set rollout.temperature only"
            )

    def algorithm(self) -> AlgorithmConfig:
        """The RL algorithm: the preset with `rl.algorithm_overrides` applied (dotted keys)."""
        config = AlgorithmConfig.preset(self.rl.algorithm)
        for key, value in _flatten(self.rl.algorithm_overrides).items():
            config = _replace_path(config, key.split("."), value, f"rl.algorithm_overrides.{key}")
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- loading ----------------------------------------------------------------------------------------------------
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
            raise FileNotFoundError(f"no recipe {recipe!r}; recipes: {recipe_names()}")
        data = _read_yaml(file)
    elif path is not None:
        data = _read_yaml(Path(path))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value (e.g. rl.steps=4)")
        _set_path(data, key.strip().split("."), yaml.safe_load(raw))
    return build(TrainConfig, data, "")


def save_config(config: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))


def _read_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping")
    return data


def _set_path(data: dict, keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        data = data.setdefault(key, {})
        if not isinstance(data, dict):
            raise ValueError(f"cannot set {'.'.join(keys)}: {key} is not a section")
    data[keys[-1]] = value


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, checking every key and converting every value to its field's type."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(
            f"unknown key(s) {sorted(unknown)} in {repr(where.rstrip('.')) if where else 'the config'}; "
            f"known: {sorted(known)}"
        )
    kwargs = {name: _convert(hints[name], value, f"{where}{name}") for name, value in data.items()}
    return cls(**kwargs)


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _convert(options[0], value, where)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where + ".")
    if hint is Any:
        return value
    if origin in (dict,):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        return origin(value)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):  # YAML reads "3e-6" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{where}: expected a number, got {value!r}") from None
    if hint in (int, str, bool) and not isinstance(value, hint):
        raise ValueError(f"{where}: expected {hint.__name__}, got {value!r}")
    if hint is int and isinstance(value, bool):
        raise ValueError(f"{where}: expected int, got {value!r}")
    return value


def _replace_path(obj: Any, keys: list[str], value: Any, where: str) -> Any:
    if not dataclasses.is_dataclass(obj):
        raise ValueError(f"{where}: cannot set a field on {obj!r}")
    names = {f.name for f in dataclasses.fields(obj)}
    if keys[0] not in names:
        raise ValueError(f"{where}: {type(obj).__name__} has no field {keys[0]!r}; fields: {sorted(names)}")
    if len(keys) == 1:
        hint = typing.get_type_hints(type(obj))[keys[0]]
        return dataclasses.replace(obj, **{keys[0]: _convert(hint, value, where)})
    inner = getattr(obj, keys[0])
    if inner is None:
        raise ValueError(f"{where}: {keys[0]} is None in this preset (the algorithm does not use it)")
    return dataclasses.replace(obj, **{keys[0]: _replace_path(inner, keys[1:], value, where)})
