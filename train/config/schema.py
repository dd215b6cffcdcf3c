"""The training configuration's schema: one typed dataclass per section (the one source of truth), each
checked where it is built, and `TrainConfig`, which builds the runtime settings (worker spec, sampling, SFT,
benchmark evaluation) next to the fields they copy. See the package docstring for keys and recipes."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

from stare_agents.algo import AlgorithmConfig
from stare_agents.algo.config import ALGORITHMS, AlgorithmName
from stare_agents.rollout import RolloutConfig, WorkerSpec
from stare_agents.rollout.engine import Dtype
from stare_agents.rollout.placement import Placement, check_custom_resources
from stare_agents.rollout.workers import DEFAULT_DTYPE, DEFAULT_MAX_MODEL_LEN
from stare_agents.sandbox.channel import check_limits
from stare_agents.sandbox.runner import DEFAULT_TIMEOUT_S
from stare_agents.train.config.evaluation import EvalSection
from stare_agents.train.config.rollout_section import RolloutSection
from stare_agents.train.config.typed import INLINE, convert, plain_data, settings_dict
from stare_agents.train.learner_config import LearnerConfig
from stare_agents.train.policy import OptimizerConfig, Precision
from stare_agents.train.sft import SFTConfig

RECIPES_DIR = Path(__file__).parents[1] / "recipes"  # train/recipes/
logger = logging.getLogger("stare_agents.train")


@dataclass
class ModelSection:
    name: str = "smollm2-135m"  # "tiny", "smollm2-135m", a local HF folder or a hub id
    # the engine's dtype: "auto" (the checkpoint's), "float32", "bfloat16", "fast" (bfloat16 where it is fast)
    rollout_dtype: Dtype = DEFAULT_DTYPE
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    # the LM head and its log-softmax in fp32 in the engine (vLLM's head_dtype) and in the learner, whatever
    # the precisions: the fix for bf16's rounded logits (BENCHMARKS.md, "Precision"); no effect in fp32
    fp32_lm_head: bool = False


# keys of the environment's that have typed keys of their own in `env` (never in env.kwargs)
TYPED_ENV_KEYS = ("max_turns", "tool_timeout_s", "tool_wall_timeout_s")
# environment arguments that a run sets itself, never env.kwargs: why, and what to set instead
NOT_ENV_KWARGS = {
    "sandbox": (
        "the run's sandbox (rollout.sandbox) is the one its environments' tools use; a sandbox here (null "
        "included, which sends the tool to a Docker sandbox of its own) would run code where the run did not "
        "say; set rollout.sandbox"
    ),
}


@dataclass
class EnvSection:
    """The environment. `id` is a registered id, or gymnasium's `module:Name-v0` (the module is imported
    first: it is moved to `imports`). `kwargs` go to `gymnasium.make` for training and evaluation; the turn
    limit and the python tool's time limit have keys of their own."""

    id: str = "stare_agents/ArithmeticTIR-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)  # for gym.make (training and evaluation)
    imports: list[str] = field(default_factory=list)  # modules that register your own environments
    max_turns: int | None = None  # the episode's turn limit (None: the environment's default_max_turns)
    # the CPU seconds one python tool call may use (None: the environment's default, 5 s for ToolEnv's tool): CPU
    # time, so that a busy machine never fails an honest program
    tool_timeout_s: float | None = None
    # the wall-clock cap of one python tool call, for code that sleeps or waits (None: 4 x the CPU limit)
    tool_wall_timeout_s: float | None = None
    train_seed: int = 0  # training task i of the run is reset with seed train_seed + i
    eval_seed: int = 1_000_000  # held-out tasks: eval_seed + i (disjoint from training seeds)

    def __post_init__(self) -> None:
        module, sep, name = self.id.rpartition(":")
        if sep:
            if not module or not name:
                raise ValueError(f"env.id={self.id!r}: expected a registered id or module:Name-v0")
            self.id = name
            if module not in self.imports:
                self.imports = [*self.imports, module]
        for key in NOT_ENV_KWARGS:
            if key in self.kwargs:
                raise ValueError(f"env.kwargs.{key}={self.kwargs[key]!r}: not allowed: {NOT_ENV_KWARGS[key]}")
        for key in TYPED_ENV_KEYS:
            if key in self.kwargs:
                raise ValueError(
                    f"env.kwargs.{key}={self.kwargs[key]!r}: set env.{key} instead (a typed key, checked at load)"
                )
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"env.max_turns={self.max_turns!r}: allowed: an int >= 1, or null (the env's)")
        if self.tool_timeout_s is not None or self.tool_wall_timeout_s is not None:
            try:
                check_limits(
                    DEFAULT_TIMEOUT_S if self.tool_timeout_s is None else self.tool_timeout_s,
                    self.tool_wall_timeout_s,
                    ("env.tool_timeout_s", "env.tool_wall_timeout_s"),
                )
            except (TypeError, ValueError) as error:
                raise ValueError(f"{error} (or null: the environment's default)") from None

    def make_kwargs(self) -> dict[str, Any]:
        """What `gymnasium.make(self.id, ...)` gets: `kwargs`, plus the typed keys (TYPED_ENV_KEYS) that are set."""
        kwargs = dict(self.kwargs)
        for key in TYPED_ENV_KEYS:
            if getattr(self, key) is not None:
                kwargs[key] = getattr(self, key)
        return kwargs


@dataclass
class SFTSection:
    enabled: bool = True
    data: str = "solver"  # "solver": verified traces from the environment's solution_code(); or a JSONL file
    num_examples: int = 128
    # data "solver" only: this many traces of every task kind the environment draws (task.data["kind"]) in place
    # of num_examples seeds at random, which may leave a kind out of the cold start; 0: off
    per_kind: int = 0
    epochs: int = 1
    batch_size: int = 8
    lr: float = 5e-5
    warmup_steps: int = 2
    micro_batch_tokens: int = 4096
    precision: Precision = "fast"  # "fp32", "bf16", "fp16" (autocast, fp16 with a loss scale) or "fast"
    # the seed of the cold start's example order (the only randomness SFT has here); None: the run's seed. A fixed
    # seed makes the cold start one model for every RL seed, so runs of seed=0..4 measure RL from the same start
    seed: int | None = None
    # a checkpoint of the fit under way every this many optimiser steps (0: none), in the run folder's
    # sft_checkpoint/; `--resume` goes on from it after a crash, and it is removed once SFT is done
    checkpoint_every: int = 50

    # the fields the trainer reads itself (what to train on, whether, and its checkpoints); sft_config has the rest
    TRAINER_FIELDS = ("enabled", "data", "num_examples", "per_kind", "checkpoint_every")

    def __post_init__(self) -> None:
        if isinstance(self.per_kind, bool) or not isinstance(self.per_kind, int) or self.per_kind < 0:
            raise ValueError(f"sft.per_kind must be an integer >= 0 (0: off), got {self.per_kind!r}")
        if self.per_kind and self.data != "solver":
            raise ValueError(
                f"sft.per_kind draws solver traces by task kind; sft.data is {self.data!r} (use sft.num_examples)"
            )
        if self.checkpoint_every < 0:
            raise ValueError(
                f"sft.checkpoint_every must be >= 0 (0: no checkpoints), got {self.checkpoint_every}"
            )
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"sft.seed must be an integer >= 0 or null (the run's seed), got {self.seed!r}")

    def sft_config(self, *, seed: int, device: str) -> SFTConfig:
        """The SFT trainer's settings (train/sft.py) from this section, the run's seed (unless sft.seed is set) and
        the device."""
        return SFTConfig(
            optimizer=OptimizerConfig(lr=self.lr, warmup_steps=self.warmup_steps),
            epochs=self.epochs,
            batch_size=self.batch_size,
            micro_batch_tokens=self.micro_batch_tokens,
            precision=self.precision,
            seed=seed if self.seed is None else self.seed,
            device=device,
        )


MAX_PROMPT_ROUNDS = 64  # rl.sampling_rounds x rl.sampling_batch_factor: batches of prompts one step may draw


@dataclass
class RLSection:
    """The RL stage. `algorithm` is a preset; `algo` holds its settings (an AlgorithmConfig built over the preset),
    whose fields are keys of this section itself: `rl.stare.w`, `rl.loss.clip_high`, `rl.dynamic_sampling`
    (see the module docstring)."""

    steps: int = 8
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    algorithm: AlgorithmName = "stare"
    # the algorithm's fields (AlgorithmConfig's, less its name, which is `algorithm`) as keys of rl: the preset's
    # values unless set
    algo: AlgorithmConfig = field(default_factory=AlgorithmConfig, metadata={INLINE: True})
    learner: LearnerConfig = field(
        default_factory=lambda: LearnerConfig(optimizer=OptimizerConfig(lr=1e-6), micro_batch_tokens=4096)
    )
    learner_workers: int = 1  # > 1: data-parallel learner workers (Ray actors, gloo on CPU, NCCL on GPU)
    learner_gpus_per_worker: float = 0.0  # GPU cluster: 1
    fsdp: bool = False  # shard the learner's model over its GPU workers (models that do not fit one GPU)
    learner_placement: Placement = "none"  # a Ray placement group for the learner workers ("PACK": one node)
    # custom Ray resources each learner worker needs (as rollout.resources_per_worker), e.g. {learner_node: 1}
    learner_resources_per_worker: dict[str, float] = field(default_factory=dict)
    drop_void_turns: bool = False  # SimpleTIR: trajectories with a void turn are left out of the loss
    # dynamic sampling (DAPO): the refill budget. A step draws up to this many rounds of prompts until
    # prompts_per_step groups have reward variance, so that it trains on the batch it names; a step that spends
    # the budget and is still short trains on what it has and says so (data/budget_exhausted). 1: filter only
    sampling_rounds: int = 4
    # a run stops, saying why, after this many steps in a row found no group with reward variance in their
    # whole budget (every reward equal: the tasks are all solved or all failed); 0: never stop
    max_empty_steps: int = 2
    # prompts drawn per sampling round, as a multiple of prompts_per_step (the official code's gen_batch_size:
    # 3 x the train batch); the groups past prompts_per_step are left out, the data position moves past them
    sampling_batch_factor: int = 1
    # a step stops the run when more than this share of its episodes failed for the infrastructure (engine,
    # sandbox, environment); below it, failed episodes leave the loss and are counted (rollout/failed)
    max_failed_fraction: float = 0.5
    # "one-step": the rollouts of step k+1 are generated with the weights the learner had before step k's update,
    # while it updates (AReaL / slime / verl's one-step off-policy mode: staleness 1, recorded per trajectory;
    # needs rl.learner.importance). "off": each step samples with the weights of the step before it
    pipeline: Literal["off", "one-step"] = "off"

    def __post_init__(self) -> None:
        check_custom_resources(self.learner_resources_per_worker, "rl.learner_resources_per_worker")
        if self.pipeline == "one-step" and not self.learner.importance.active:
            raise ValueError(
                "rl.pipeline=one-step trains on rollouts one weight version old: set rl.learner.importance.cap "
                "(e.g. 2.0) so that truncated importance sampling corrects for the sampler being behind the learner"
            )
        if not 0 <= self.max_failed_fraction <= 1:
            raise ValueError(f"rl.max_failed_fraction must be in [0, 1], got {self.max_failed_fraction}")
        if (
            self.steps < 0
            or self.prompts_per_step < 1
            or self.samples_per_prompt < 1
            or self.sampling_rounds < 1
            or self.sampling_batch_factor < 1
        ):
            raise ValueError(
                "need rl.steps >= 0 and rl.prompts_per_step, rl.samples_per_prompt, rl.sampling_rounds, "
                f"rl.sampling_batch_factor >= 1; got {self.steps}, {self.prompts_per_step}, "
                f"{self.samples_per_prompt}, {self.sampling_rounds}, {self.sampling_batch_factor}"
            )
        if self.sampling_rounds * self.sampling_batch_factor > MAX_PROMPT_ROUNDS:
            raise ValueError(
                f"rl.sampling_rounds x rl.sampling_batch_factor = {self.sampling_rounds} x "
                f"{self.sampling_batch_factor} batches of prompts a step is over the {MAX_PROMPT_ROUNDS} allowed: a step "
                "that needs that many to find groups with reward variance has tasks too easy or too hard for the "
                "model; lower them (the official recipes use 10 x 3)"
            )
        if self.max_empty_steps < 0:
            raise ValueError(f"rl.max_empty_steps must be >= 0 (0: never stop), got {self.max_empty_steps}")
        algorithm = self.algorithm_config()  # the combination is checked where it loads
        if algorithm.reads_all_sampled and (
            self.learner_workers > 1 or algorithm.loss.aggregation != "token-mean"
        ):
            gate_input = getattr(algorithm.stare, "gate_input", None)
            raise ValueError(
                f"rl.stare.gate_input={gate_input!r} (the entropy over every sampled trajectory, a token mean) needs "
                f"one learner worker and rl.loss.aggregation=token-mean; got rl.learner_workers="
                f"{self.learner_workers}, rl.loss.aggregation={algorithm.loss.aggregation!r}"
            )

    @classmethod
    def base_for(cls, data: dict[str, Any], where: str) -> RLSection:
        """Where the loader takes the keys a config leaves out: the defaults with `algorithm`'s preset."""
        return cls.preset(convert(AlgorithmName, data.get("algorithm", cls.algorithm), f"{where}algorithm"))

    @classmethod
    def preset(cls, algorithm: str) -> RLSection:
        """The defaults, with the algorithm settings of preset `algorithm`."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"rl.algorithm={algorithm!r}: allowed: {', '.join(ALGORITHMS)}")
        return cls(algorithm=algorithm, algo=AlgorithmConfig.preset(algorithm))

    def algorithm_config(self) -> AlgorithmConfig:
        """The algorithm: `algo` under the preset's name (`algorithm`)."""
        return (
            self.algo
            if self.algo.name == self.algorithm
            else dataclasses.replace(self.algo, name=self.algorithm)
        )


ALGORITHM_FIELDS = tuple(f.name for f in dataclasses.fields(AlgorithmConfig) if f.name != "name")


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
    # log learner/entropy_all: the learner's exact entropy over every trajectory that ran, not only the
    # trained ones (one more no-grad forward pass over the untrained trajectories per step, which also gives
    # them their per-token statistics in rollouts/). Off: the figure is absent (rollout/sampler_entropy, the
    # sampled tokens' mean surprisal, is always logged beside it)
    entropy_all: bool = True

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
    # the RL run's precision in one word (PRECISION_PRESETS): fp16 (the official STARE runs') or bf16 (with the fp32
    # head and importance sampling); it sets the keys it names where the config leaves them out. None: each its own
    precision: RunPrecision | None = None
    model: ModelSection = field(default_factory=ModelSection)
    env: EnvSection = field(default_factory=EnvSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    sft: SFTSection = field(default_factory=SFTSection)
    rl: RLSection = field(default_factory=RLSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)

    def __post_init__(self) -> None:
        # the learner's derived fields (DERIVED_FROM): one knob for both ends of the LM head's precision, the
        # learner scores the distribution the rollout sampled from, and the untrained trajectories when logged
        self.rl.learner.fp32_head = self.model.fp32_lm_head
        self.rl.learner.temperature = self.rollout.temperature
        self.rl.learner.score_untrained = self.logging.entropy_all
        if self.model.fp32_lm_head and self.rollout.engine != "vllm":
            raise ValueError(
                f"model.fp32_lm_head=true needs rollout.engine=vllm (the {self.rollout.engine} engine computes its "
                "head in its own dtype)"
            )
        absolute_paths(self)
        problem = gpu_sharing_problem(self, driver_has_gpu=torch.cuda.is_available())
        if problem:
            raise ValueError(problem)
        if self.algorithm().loss.normalization == "micro-batch" and self.rl.learner.micro_batch_packing == (
            "longest-first"
        ):
            logger.warning(MICRO_BATCH_SKEW)

    def algorithm(self) -> AlgorithmConfig:
        """The RL algorithm: preset `rl.algorithm` with the algorithm keys under `rl` as set."""
        return self.rl.algorithm_config()

    def worker_spec(self, model_dir: str | Path) -> WorkerSpec:
        """What each rollout worker builds (engine, sandbox, placement) to serve `model_dir`."""
        m, r = self.model, self.rollout
        return WorkerSpec(
            model=str(model_dir),
            engine=r.engine,
            dtype=m.rollout_dtype,
            seed=self.seed,
            max_model_len=m.max_model_len,
            kv_cache_gib=r.kv_cache_gib,
            sandbox=r.sandbox,
            sandbox_pool_size=r.sandbox_pool_size,
            sandbox_kwargs=r.resolved_sandbox_kwargs(),
            multiprocess=r.multiprocess,
            env_processes=r.resolved_env_processes(),
            env_cpus=list(r.env_cpus),
            num_cpus=r.num_cpus_per_worker,
            num_gpus=r.num_gpus_per_worker,
            imports=list(self.env.imports),
            engine_kwargs=r.vllm_kwargs() if r.engine == "vllm" else {},
            placement=r.placement,
            resources=dict(r.resources_per_worker),
            fp32_head=m.fp32_lm_head,
        )

    def rollout_config(self, *, evaluation: bool = False) -> RolloutConfig:
        """How episodes are sampled: for training (rollout.*), or for held-out evaluation (eval.temperature,
        the full distribution, no step deadline)."""
        r = self.rollout
        return RolloutConfig(
            temperature=self.eval.temperature if evaluation else r.temperature,
            top_p=1.0 if evaluation else r.top_p,
            max_tokens_per_turn=r.max_tokens_per_turn,
            max_total_tokens=r.max_total_tokens,
            rendering=r.rendering,
            max_concurrency=r.max_concurrency,
            seed=self.seed,
            timeout_s=None if evaluation else r.timeout_s,  # a hung engine or sandbox cannot hold a step
        )

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain data: every field but those the run derives from another (DERIVED_FROM)."""
        return settings_dict(self)

    def to_yaml(self) -> str:
        """The resolved config as YAML: what `--show-config` prints and a run folder's config.yaml holds;
        `load_config(path=...)` reads it back to an equal config."""
        return yaml.safe_dump(plain_data(self.to_dict()), sort_keys=False)


# `precision`: the RL run's precision in one word. Each sets the engine's dtype and the learner's precision, which
# the config may not set otherwise (a run called fp16 that samples in bf16 is not one), and the corrections that go
# with them, which it may (as an algorithm preset's keys). docs/precision.md has the measurements behind them.
RunPrecision = Literal["fp16", "bf16"]
PRECISION_PRESETS: dict[str, dict[str, Any]] = {
    # the official STARE runs: fp16 actor (autocast over float32 master weights, a dynamic loss scale) and engine;
    # 11 significant bits, so engine and learner agree to ~0.001 nats a token: no fp32 head, no importance weights
    "fp16": {
        "model.rollout_dtype": "float16",
        "rl.learner.precision": "fp16",
        "model.fp32_lm_head": False,
        "rl.learner.importance.cap": None,
    },
    # bf16 on both sides, with this project's correction for their mismatch: the LM head in fp32 on both sides and
    # truncated importance sampling over the rollout's log-probs (cap 2)
    "bf16": {
        "model.rollout_dtype": "bfloat16",
        "rl.learner.precision": "bf16",
        "model.fp32_lm_head": True,
        "rl.learner.importance.cap": 2.0,
    },
}
PRECISION_FIXES = ("model.rollout_dtype", "rl.learner.precision")  # what `precision` names: not set otherwise


# the audit of issue 29 measured it on a batch of short and long responses
MICRO_BATCH_SKEW = (
    "rl.loss.normalization=micro-batch with rl.learner.micro_batch_packing=longest-first: longest-first puts "
    "the long responses in one micro-batch and the short ones in another, and micro-batch normalisation gives "
    "each micro-batch's token mean its share of the rows, so the shorter half of the responses gets 0.50 of the "
    "loss where their tokens are 0.26 of it (the official code's dynamic batching mixes them); set "
    "rl.learner.micro_batch_packing=balanced (as the paper recipes do) or rl.loss.normalization=global"
)


def resolved_weight_sync(config: TrainConfig, *, driver_has_gpu: bool) -> str:
    """rollout.weight_sync with "auto" resolved: the collective with a data-parallel learner group, or with one
    learner (in the trainer's process) on a GPU whose engines are not on GPUs; the driver path otherwise: one
    learner on a CPU (measured faster there: BENCHMARKS.md, Weight sync), and one learner on the trainer's GPU
    with engines on GPUs (Ray does not count the trainer's GPU and may give it to an engine: two ranks of one
    NCCL group on one GPU)."""
    r, rl = config.rollout, config.rl
    if r.weight_sync != "auto":
        return r.weight_sync
    if rl.learner_workers > 1:
        return "collective"
    return "collective" if driver_has_gpu and r.num_gpus_per_worker == 0 else "driver"


def gpu_sharing_problem(config: TrainConfig, *, driver_has_gpu: bool) -> str | None:
    """Why two ranks of one NCCL group could be given one GPU (NCCL stops with "Duplicate GPU detected"), or
    None: learner workers on shares of a GPU; or an NCCL weight sync (the sender and the engines on GPUs) with
    engines on shares of a GPU, or with the learner in the trainer's process on its machine's GPU, which Ray
    does not count and may hand to an engine."""
    r, rl = config.rollout, config.rl
    fix = "give each worker whole GPUs (1), or set rollout.weight_sync=driver (weights through Ray's object store)"
    if rl.learner_workers > 1 and 0 < rl.learner_gpus_per_worker < 1:
        return (
            f"rl.learner_gpus_per_worker={rl.learner_gpus_per_worker} with rl.learner_workers={rl.learner_workers}: "
            "Ray may put two ranks of the learners' NCCL group on one GPU; allowed: whole GPUs (1) per learner "
            "worker, or rl.learner_workers=1"
        )
    sender_on_gpu = rl.learner_gpus_per_worker > 0 if rl.learner_workers > 1 else driver_has_gpu
    nccl_sync = resolved_weight_sync(config, driver_has_gpu=driver_has_gpu) == "collective"
    if not (nccl_sync and sender_on_gpu and r.num_gpus_per_worker > 0):
        return None
    if r.num_gpus_per_worker < 1:
        return (
            f"rollout.num_gpus_per_worker={r.num_gpus_per_worker} with the weight sync over NCCL "
            f"(rollout.weight_sync={r.weight_sync}): Ray may put two engines of the sync group on one GPU; {fix}"
        )
    if rl.learner_workers == 1:
        return (
            f"rollout.weight_sync={r.weight_sync} with one learner, in the trainer's process on this machine's GPU, "
            "and engines on GPUs (rollout.num_gpus_per_worker > 0): Ray does not count the trainer's GPU and may "
            "give it to an engine, two ranks of the NCCL sync group on one GPU; set rollout.weight_sync=driver "
            "(or auto), or run the learner as Ray workers (rl.learner_workers >= 2, rl.learner_gpus_per_worker=1)"
        )
    return None


def absolute_paths(config: TrainConfig) -> None:
    """The config's paths made absolute, against the working folder it is loaded in: Ray workers (on other
    nodes, or started in another folder) read and write them too. The run folder (`out_dir`, and with it the SFT
    model, the checkpoints and their `learner_shards/`) and `eval.data_dir`; and where they name a path that
    exists here, `sft.data`, `model.name` and the environment's datasets (`env.kwargs.dataset`,
    `env.kwargs.*_dataset`; anything else there is a Hugging Face id)."""
    from stare_agents.models import MODEL_NAMES

    def absolute(path: str) -> str:
        return os.path.abspath(os.path.expanduser(path))

    def existing(path: Any) -> bool:
        return isinstance(path, str) and bool(path) and Path(path).expanduser().exists()

    config.out_dir = absolute(config.out_dir)
    if config.sft.data != "solver" and existing(config.sft.data):
        config.sft.data = absolute(config.sft.data)
    if config.eval.data_dir is not None:
        config.eval.data_dir = absolute(config.eval.data_dir)
    if config.model.name not in MODEL_NAMES and existing(config.model.name):
        config.model.name = absolute(config.model.name)
    for key, value in config.env.kwargs.items():
        if (key == "dataset" or key.endswith("_dataset")) and existing(value):
            config.env.kwargs[key] = absolute(value)
