"""The RL learner's settings (`rl.learner` in a training config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from stare_agents.algo.importance import ImportanceConfig
from stare_agents.train.config_fields import DERIVED_FROM
from stare_agents.train.memory_plan import MemoryMode
from stare_agents.train.packing import PackRows
from stare_agents.train.policy import PACKINGS, PRECISIONS, OptimizerConfig, Packing, Precision

OldLogprobs = Literal["recompute", "rollout"]  # PPO's pi_old: the pre-update pass or the rollout's
OLD_LOGPROB_SOURCES: tuple[str, ...] = get_args(OldLogprobs)


@dataclass
class LearnerConfig:
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    # tokens per micro-batch: padded (rows x longest prompt + response), or packed with share_prompts
    micro_batch_tokens: int = 8192
    # how rows are packed into micro-batches: "longest-first" (rows of like length together, fewest padding
    # tokens) or "balanced" (padded token counts evened out across micro-batches by mixing long and short
    # rows, as the official code's dynamic batching does; costs some padding, sometimes one micro-batch
    # more); with several micro-batches this changes the per-micro-batch STARE selection and the
    # "micro-batch" loss normalisation, never the budget
    micro_batch_packing: Packing = "longest-first"
    mini_batches: int = 1  # optimiser updates per training step (contiguous row ranges of the step batch)
    precision: Precision = "fp32"  # see train/policy.py: fp32, bf16 (autocast), fast, bf16-emulated, fp16
    gradient_checkpointing: bool = False
    # a micro-batch's real tokens run as one sequence, attended row by row (train/packing.py): no FLOPs on
    # padding; "auto" where a probe at load finds it exact for the model, "on" (refuse otherwise), "off"
    pack_rows: PackRows = "auto"
    # packed rows that share their prompt (a GRPO group's samples) run it once: one copy of the prompt, each
    # response attending to it (train/packing.py); the micro-batch budget then counts packed tokens, and a
    # group's rows stay in one micro-batch ("longest-first"; other packings only share within their micro-batches)
    share_prompts: bool = True
    # micro_batch_tokens and gradient_checkpointing against the device's memory, before the model loads
    # (train/memory_plan.py): "fit" turns checkpointing on, then lowers the budget, when they do not fit;
    # "check" refuses instead, naming what would fit; "off" trusts them
    memory_plan: MemoryMode = "fit"
    head_chunk_rows: int = 1024  # action tokens per chunk of the LM head (memory: rows x vocab floats)
    old_logprobs: OldLogprobs = (
        "recompute"  # PPO's pi_old: the pre-update pass ("recompute") or the rollout's
    )
    # the correction for pi_rollout != pi_old (stare_agents.algo.importance): truncated (cap) and/or masked
    # (mask: (low, high)) importance sampling, per token or per sequence; needs old_logprobs="recompute"
    importance: ImportanceConfig = field(default_factory=ImportanceConfig)
    # the LM head and its log-softmax in fp32 even under bf16 autocast (one knob for both ends: model.fp32_lm_head
    # also gives the vLLM engine an fp32 head)
    fp32_head: bool = field(default=False, metadata={DERIVED_FROM: "model.fp32_lm_head"})
    diagnostics: bool = True  # Phi quadrants and L+/L- shares (also for non-STARE algorithms)
    # one update and at most one micro-batch per worker: the update's forward doubles as the pre-update pass
    fuse_single_micro_batch: bool = True
    # "cuda" where the trainer's process has a GPU (each data-parallel worker picks its own device)
    device: str = field(
        default="cpu", metadata={DERIVED_FROM: "the machine (cuda where the trainer has a GPU)"}
    )
    seed: int = 0  # Clip-Cov's random token choice
    # the rollout's sampling temperature: the learner scores softmax(logits / temperature), what the engine
    # sampled from (ratios, TIS weights, entropy, surprisal)
    temperature: float = field(default=1.0, metadata={DERIVED_FROM: "rollout.temperature"})
    # score the step's untrained trajectories too (one more no-grad pass): learner/entropy_all, and their
    # per-token statistics in rollouts/ (a gate reading every sampled trajectory scores them whatever this says)
    score_untrained: bool = field(default=True, metadata={DERIVED_FROM: "logging.entropy_all"})

    def __post_init__(self) -> None:
        if isinstance(self.optimizer, dict):
            self.optimizer = OptimizerConfig(**self.optimizer)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.micro_batch_packing not in PACKINGS:
            raise ValueError(
                f"micro_batch_packing must be one of {PACKINGS}, got {self.micro_batch_packing!r}"
            )
        if self.old_logprobs not in OLD_LOGPROB_SOURCES:
            raise ValueError(f"old_logprobs must be one of {OLD_LOGPROB_SOURCES}, got {self.old_logprobs!r}")
        if isinstance(self.importance, dict):
            self.importance = ImportanceConfig(**self.importance)
        if self.importance.active and self.old_logprobs != "recompute":
            raise ValueError(
                f"importance={self.importance} needs old_logprobs='recompute' (the weight is pi_old / pi_rollout, "
                "which is 1 when pi_old is the rollout's)"
            )
        if self.micro_batch_tokens < 1 or self.mini_batches < 1:
            raise ValueError(
                f"need micro_batch_tokens >= 1 and mini_batches >= 1, got {self.micro_batch_tokens}, "
                f"{self.mini_batches}"
            )
