"""The RL learner: one training step of STARE (or a baseline) on a Hugging Face causal LM.

    learner = Learner.from_pretrained(model_dir, AlgorithmConfig.preset("stare"), LearnerConfig())
    metrics = learner.step(collate(trajectories, pad_token_id), advantages)   # LEARNER_METRICS

One step, as the official STARE code does it:
  1. pre-update pass (no grad) over the step batch: log pi_old(a), entropy H, and Phi's collision term
     (when the step is one micro-batch per worker and one update, the update's own forward is this pass);
  2. entropy of the step's action tokens (aggregated like the loss) -> the gate, once per step
     (Entrocraft, when configured, switches the advantages on the same entropy);
  3. for each optimiser update (`mini_batches`, 1 by default) and each token-budget micro-batch: forward
     with grad, surprisal = -log pi(a) of the current policy (detached), L+/L- and the STARE weights over
     the micro-batch (scope "micro-batch") or over the step batch (scope "batch", from pass 1), the clipped
     surrogate normalised over the whole update (`loss.normalization` "global") or as the official code
     does it, each micro-batch's own mean times its share of the update's rows ("micro-batch"), backward
     (gradient accumulation);
  4. gradients summed over data-parallel workers, clipped, AdamW; then the LR schedule.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

import torch
from torch import Tensor, nn

from stare_agents.algo import (
    AlgorithmConfig,
    loss_normalizer,
    policy_loss,
    quadrant_counts,
    sensitivity_from_statistics,
)
from stare_agents.algo.importance import ImportanceConfig, importance_weights, mismatch_sums
from stare_agents.algo.reweighting import NO_REWEIGHTING, build_reweighting, diagnostic_selector
from stare_agents.rollout.weight_sync import GroupAddress, SyncGroup, WeightsPlan, open_group, send_weights
from stare_agents.train.checkpoint import save_checkpoint
from stare_agents.train.memory_plan import MemoryMode
from stare_agents.train.packing import PackRows
from stare_agents.train.policy import (
    PACKINGS,
    PRECISIONS,
    MicroBatch,
    OptimizerConfig,
    Packing,
    PolicyCore,
    PolicyModel,
    Precision,
    TokenStats,
    load_causal_lm,
    load_policy_shards,
    optimizer_step,
    save_policy_shards,
    split_step,
    step_schedule,
)
from stare_agents.trajectory import Batch

OldLogprobs = Literal["recompute", "rollout"]  # PPO's pi_old: the pre-update pass or the rollout's
OLD_LOGPROB_SOURCES: tuple[str, ...] = get_args(OldLogprobs)
logger = logging.getLogger(__name__)

QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")


def _finite_mean(values: list[float]) -> float:
    """The mean of the finite values (a skipped update's norm is not finite), NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


@dataclass
class UpdateSums:
    """What one micro-batch's update adds up (summed over micro-batches, then over workers): the loss as
    normalised, and per-action-token sums of the loss's statistics, STARE's selection, the importance
    correction and the sensitivity quadrants."""

    loss: float = 0.0
    clipfrac: float = 0.0
    approx_kl: float = 0.0
    ratio_mean: float = 0.0
    lplus: float = 0.0  # tokens in L+ / L-
    lminus: float = 0.0
    lplus_neg: float = 0.0  # L+ tokens with Phi < 0
    capped: float = 0.0  # action tokens whose importance weight was truncated / masked
    masked: float = 0.0
    pos_high: float = 0.0  # action tokens by advantage sign and Phi sign (diagnostics)
    pos_low: float = 0.0
    neg_high: float = 0.0
    neg_low: float = 0.0

    def __add__(self, other: UpdateSums) -> UpdateSums:
        return UpdateSums(*(a + b for a, b in zip(self.values(), other.values(), strict=True)))

    def values(self) -> list[float]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def all_reduced(self, collective: Collective) -> UpdateSums:
        return UpdateSums(
            *collective.all_reduce_sum(torch.tensor(self.values(), dtype=torch.float64)).tolist()
        )


@dataclass
class MicroBatchWork:
    """One micro-batch and what the pre-update pass decided for it."""

    mb: MicroBatch
    pre: TokenStats  # the pre-update policy's log-probs (pi_old), entropy and collision term
    advantages: Tensor  # after Entrocraft's switch, when there is one
    selection: tuple[Tensor, Tensor] | None  # L+/L- chosen over the whole step (scope "batch"), else None
    forward: TokenStats | None  # the update's own forward, when the pre-update pass was fused with it


# The metrics `Learner.step` returns, always all of them (NaN where a value is undefined that step).
LEARNER_METRICS = (
    "learner/entropy",  # pre-update entropy of the step's action tokens, aggregated like the loss (gate input)
    "learner/loss",  # the policy loss, mean over the step's optimiser updates
    "learner/grad_norm",  # total gradient norm before clipping, mean over the step's updates that were taken
    "learner/lr",  # learning rate used this step
    "learner/tokens",  # non-padding tokens in the step batch (all workers)
    "learner/action_tokens",  # policy-sampled tokens in the step batch (all workers)
    "learner/micro_batches",  # micro-batches in the step (all workers)
    "learner/tokens_per_s",  # learner/tokens / learner/step_s
    "learner/step_s",  # wall time of the step
    "learner/pre_update_s",  # wall time of the pre-update pass (of the shared forward when fused)
    "learner/skipped_updates",  # cumulative optimiser updates skipped for a non-finite gradient norm
    "learner/loss_scale",  # fp16's dynamic loss scale after the step (1 in every other precision)
    "policy/clipfrac",  # share of action tokens whose gradient a clip stopped
    "policy/approx_kl",  # k3 estimate of KL(old || new) over action tokens
    "policy/ratio_mean",
    "stare/gate_on",  # 1 if this step was reweighted (gate on, or open loop), else 0
    "stare/gate_input",  # the entropy the gate read (stare.gate_input: trained batch, all sampled, or EMA)
    "stare/w",  # the w and m in force (adaptive: after this step's update); 1 for non-STARE algorithms
    "stare/m",
    "stare/target_entropy",  # the gate's target (NaN for non-STARE algorithms)
    "stare/gate_skipped",  # cumulative gate updates skipped for a non-finite entropy
    "stare/lplus_share",  # share of action tokens in L+ (non-STARE algorithms: the L+ STARE would take)
    "stare/lminus_share",
    "stare/lplus_negative_phi",  # share of L+ tokens with Phi < 0 (NaN when L+ is empty)
    "quadrant/pos_high",  # action tokens by advantage sign and Phi sign (high surprisal = Phi < 0)
    "quadrant/pos_low",
    "quadrant/neg_high",
    "quadrant/neg_low",
    "mismatch/logprob_abs_diff",  # mean |log pi_learner - log pi_rollout| over action tokens (each <= 20)
    "mismatch/kl",  # k3 estimate of KL(pi_rollout || pi_learner) over action tokens
    "mismatch/max_abs_log_ratio",  # the largest |log pi_learner - log pi_rollout| of the step
    "mismatch/ratio_outside",  # share of action tokens with pi_learner / pi_rollout outside [0.9, 1.1]
    "importance/capped_share",  # share of action tokens whose importance weight was truncated (0 without)
    "importance/masked_share",  # share of action tokens the importance mask left out of the loss (0 without)
)


# a field whose metadata has this key is not a setting of its own: the run sets it from the setting the value
# names (the config loader refuses it as a key and leaves it out of a run's config.yaml)
DERIVED_FROM = "derived_from"


@dataclass
class LearnerConfig:
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    micro_batch_tokens: int = 8192  # padded tokens per micro-batch (rows x longest prompt + response)
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
    # micro_batch_tokens and gradient_checkpointing against the device's memory, before the model loads
    # (train/memory_plan.py): "fit" turns checkpointing on, then lowers the budget, when they do not fit;
    # "check" refuses instead, naming what would fit; "off" trusts them
    memory_plan: MemoryMode = "fit"
    head_chunk_rows: int = 1024  # action tokens per chunk of the LM head (memory: rows x vocab floats)
    old_logprobs: OldLogprobs = "recompute"  # PPO's pi_old: the pre-update pass ("recompute") or the rollout's
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
    device: str = field(default="cpu", metadata={DERIVED_FROM: "the machine (cuda where the trainer has a GPU)"})
    seed: int = 0  # Clip-Cov's random token choice
    # the rollout's sampling temperature: the learner scores softmax(logits / temperature), what the engine
    # sampled from (ratios, TIS weights, entropy, surprisal)
    temperature: float = field(default=1.0, metadata={DERIVED_FROM: "rollout.temperature"})

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


@dataclass
class TokenRecord:
    """What the learner did to one trajectory's response tokens in a step (opt-in: `step(..., record_tokens=True)`).
    Lists run over the response (action and observation tokens alike); 0 / 1 / 0 where action_mask is 0.

    learner_logprobs: log pi_old(a) of the pre-update policy (what the gate and the diagnostics saw).
    entropy: that policy's entropy at each position (at the sampling temperature).
    stare_weights: the weight each token's advantage was multiplied by (all 1 while the gate is off).
    selection: 1 for L+, -1 for L-, 0 otherwise, as selected for the update (also while the gate is off, when
        it says which tokens STARE would have reweighted); empty when nothing was selected (no STARE,
        diagnostics off).
    """

    learner_logprobs: list[float]
    stare_weights: list[float]
    selection: list[int]
    entropy: list[float] = field(default_factory=list)  # the pre-update policy's entropy at each position


class StepResult(dict):
    """What one learner step returns: its figures (every name in LEARNER_METRICS) as a mapping, with
    `token_records` (step-batch row -> TokenRecord: what it did to each token; empty unless the step was asked
    to record them) and `gate_on` (whether it reweighted the tokens; None without a token reweighting)."""

    def __init__(
        self,
        metrics: dict[str, float],
        token_records: dict[int, TokenRecord] | None = None,
        gate_on: bool | None = None,
    ) -> None:
        super().__init__(metrics)
        self.token_records: dict[int, TokenRecord] = token_records or {}
        self.gate_on = gate_on


class TrainingLearner(Protocol):
    """What the trainer asks of a learner: `Learner` (this process) and `LearnerGroup` (data-parallel workers as
    Ray actors, `stare_agents.train.distributed`) both have it, so the trainer never asks which one it holds."""

    scores_batches: bool  # whether `token_stats` scores a batch here (the entropy over every sampled trajectory)

    @property
    def gate_on(self) -> bool | None: ...

    def step(
        self,
        batch: Batch,
        advantages: Tensor,
        *,
        others_entropy: tuple[float, float] | None = None,
        record_tokens: bool = False,
    ) -> StepResult: ...

    def token_stats(self, batch: Batch) -> TokenStats: ...

    def model_state_dict(self) -> dict[str, Tensor]: ...

    def hf_model(self, model_dir: Path) -> nn.Module:
        """The trained policy as a Hugging Face model (its config and tokenizer from `model_dir`)."""
        ...

    def save_checkpoint(self, state: dict[str, Any], path: Path, *, tokenizer_dir: Path) -> None:
        """`state` (the trainer's) and this learner's own into the checkpoint `path`."""
        ...

    def resume(self, checkpoint: Path, state: dict[str, Any]) -> None:
        """Read back what `save_checkpoint` wrote (`state`: the checkpoint's trainer state)."""
        ...

    def close(self) -> None: ...


def token_records(
    mb: MicroBatch, pre: TokenStats, top_pos: Tensor | None, top_neg: Tensor | None, weights: Tensor | None
) -> dict[int, TokenRecord]:
    """Each row's learner log-probs, STARE weights and L+/L- selection in a micro-batch (see TokenRecord)."""
    lengths = mb.batch.attention_mask[:, mb.batch.prompt_length :].sum(-1).tolist()
    logprob = pre.logprob.detach().float().cpu()
    entropy = pre.entropy.detach().float().cpu()
    weight = weights.detach().float().cpu() if weights is not None else None
    chosen = (top_pos.long() - top_neg.long()).cpu() if top_pos is not None else None
    return {
        row: TokenRecord(
            learner_logprobs=logprob[j, :n].tolist(),
            stare_weights=weight[j, :n].tolist() if weight is not None else [1.0] * n,
            selection=chosen[j, :n].tolist() if chosen is not None else [],
            entropy=entropy[j, :n].tolist(),
        )
        for j, (row, n) in enumerate(zip(mb.rows, lengths, strict=True))
    }


class Collective:
    """How the learner combines numbers across data-parallel workers. This one is a single worker;
    `stare_agents.train.distributed` has the torch.distributed one."""

    world_size = 1
    rank = 0
    shards_gradients = False  # True under FSDP: the wrapper reduces gradients itself
    loss_scale = 1.0  # what each worker's loss is multiplied by before backward (FSDP averages gradients)

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return tensor

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """1-D tensors of any length from every worker, in rank order."""
        return [tensor]

    def reduce_gradients(self, params: list[nn.Parameter]) -> None:
        return None


class Learner:
    """See the module docstring. The trainer calls `step(batch, advantages)` once per training step."""

    def __init__(
        self,
        model: nn.Module,
        algorithm: AlgorithmConfig,
        config: LearnerConfig | None = None,
        *,
        collective: Collective | None = None,
        shard: Callable[[PolicyModel], None] | None = None,
    ) -> None:
        """`shard`, when given, wraps the policy in place before the optimiser is built (FSDP)."""
        self.config = config or LearnerConfig()
        self.algorithm = algorithm
        self.collective = collective or Collective()
        c = self.config
        self.device, self.policy, self.optimizer, self.scheduler, self.scaler = PolicyCore.build(
            model, c, temperature=c.temperature, fp32_head=c.fp32_head, shard=shard
        )
        # the token reweighting (STARE, or a control; None: none), and what selects L+/L- for the
        # diagnostics (without a reweighting: what STARE's defaults would select)
        self.reweighting = build_reweighting(algorithm.reweighting, algorithm.stare, seed=self.config.seed)
        self.selector = diagnostic_selector(self.reweighting)
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.step_count = 0
        self.skipped_updates = 0
        self._sync_groups: dict[int, SyncGroup] = {}  # weight-sync groups this learner sends to, by port
        self._sync_stores: dict[int, Any] = {}  # the stores of groups opened here and not yet joined

    scores_batches = True  # token_stats scores any batch in this process

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        algorithm: AlgorithmConfig,
        config: LearnerConfig | None = None,
        *,
        collective: Collective | None = None,
    ) -> Learner:
        return cls(load_causal_lm(path), algorithm, config, collective=collective)

    @property
    def model(self) -> nn.Module:
        """The Hugging Face model being trained (its state_dict is what the rollout workers load)."""
        return self.policy.model

    @property
    def gate_on(self) -> bool | None:
        """Whether the last step was reweighted (None without a token reweighting)."""
        return self.reweighting.reweighting if self.reweighting is not None else None

    @property
    def scope(self) -> str:
        return self.reweighting.config.scope if self.reweighting is not None else "micro-batch"

    # ---- the step -------------------------------------------------------------------------------------

    def step(
        self,
        batch: Batch,
        advantages: Tensor,
        *,
        others_entropy: tuple[float, float] | None = None,
        record_tokens: bool = False,
    ) -> StepResult:
        """One training step on a step batch (`collate(...)` of the kept trajectories) with per-sequence
        [B] (or per-token [B, R]) advantages. Returns every name in LEARNER_METRICS, with each row's
        TokenRecord when `record_tokens` (for the saved rollouts). `others_entropy`: (sum, count) of the current
        policy's entropy over the action tokens of the step's sampled trajectories that are not in `batch`, for
        a STARE gate that reads every sampled trajectory (stare.gate_input)."""
        plan = split_step(
            batch,
            advantages,
            mini_batches=self.config.mini_batches,
            micro_batch_tokens=self.config.micro_batch_tokens,
            packing=self.config.micro_batch_packing,
        )
        return self.step_micro_batches(plan, others_entropy=others_entropy, record_tokens=record_tokens)

    def step_micro_batches(
        self,
        plan: list[list[MicroBatch]],
        *,
        others_entropy: tuple[float, float] | None = None,
        record_tokens: bool = False,
    ) -> StepResult:
        """The step on this worker's micro-batches, grouped by optimiser update (see `split_step`). With
        several workers each holds some micro-batches of every update, and all call this together (the
        token records are then this worker's rows)."""
        start = time.perf_counter()
        records: dict[int, TokenRecord] | None = {} if record_tokens else None
        plan = [[mb.to(self.device) for mb in update] for update in plan]
        micro_batches = [mb for update in plan for mb in update]

        # 1. pre-update pass: pi_old, entropy and Phi of the policy before this step's updates. When there
        #    is one update and no worker holds more than one micro-batch, the update's own forward is that
        #    pass (nothing has changed the policy yet): one forward instead of two, the same numbers.
        want = self.config.diagnostics
        forward: list[TokenStats | None] = [None] * len(micro_batches)
        if (
            self.config.fuse_single_micro_batch
            and len(plan) == 1
            and self._one_micro_batch_each(micro_batches)
        ):
            self.policy.train()
            forward = [self._score(mb, want_collision=want) for mb in micro_batches]
            pre = [TokenStats(f.logprob.detach(), f.entropy.detach(), f.collision) for f in forward]
        else:
            self.policy.eval()
            with torch.no_grad():
                pre = [self._score(mb, want_collision=want) for mb in micro_batches]
            self.policy.train()
        pre_update_s = time.perf_counter() - start
        totals = self._step_totals(micro_batches, pre, plan)
        entropy = totals["entropy_sum"] / totals["entropy_count"] if totals["entropy_count"] else float("nan")

        # 2. the gate, once per step, on the pre-update entropy; Entrocraft's switch on the same entropy
        reweighted = False
        # (a step without action tokens has no entropy: the gate keeps its state)
        if self.reweighting is not None:
            sampled = None
            if others_entropy is not None:  # token-mean over every sampled trajectory: this batch + the others
                total, count = others_entropy
                count += totals["token_entropy_count"]
                sampled = (total + totals["token_entropy_sum"]) / count if count else float("nan")
            gate_input = self.reweighting.gate_entropy(entropy, sampled)
            if totals["entropy_count"]:
                reweighted = self.reweighting.update(gate_input)
            else:
                reweighted = self.reweighting.reweighting
        advantages = [self._switched_advantages(mb.advantages, entropy) for mb in micro_batches]
        step_selection = (
            self._step_selection(micro_batches, pre, advantages) if self.scope == "batch" else None
        )

        # 3. the updates: gradient accumulation over micro-batches, normalised as loss.normalization says
        work = [
            MicroBatchWork(
                mb, pre[i], advantages[i], step_selection[i] if step_selection else None, forward[i]
            )
            for i, mb in enumerate(micro_batches)
        ]
        sums, grad_norms, at = UpdateSums(), [], 0
        lr = self.optimizer.param_groups[0]["lr"]
        for update, normalizer, rows in zip(plan, totals["normalizers"], totals["rows"], strict=True):
            self.optimizer.zero_grad(set_to_none=True)
            for item in work[at : at + len(update)]:
                sums += self._update_micro_batch(
                    item, self._normalizer(item.mb, normalizer, rows), reweighted, records
                )
            at += len(update)
            grad_norms.append(self._apply_gradients())
        step_schedule(self.scheduler)
        self.step_count += 1
        sums = sums.all_reduced(self.collective)
        metrics = self._metrics(totals, sums, grad_norms, lr, entropy, reweighted, start, pre_update_s)
        return StepResult(metrics, records, self.gate_on)

    def _score(self, mb: MicroBatch, *, want_collision: bool = False) -> TokenStats:
        return self.policy(mb.batch, want_collision=want_collision)

    def _one_micro_batch_each(self, micro_batches: list[MicroBatch]) -> bool:
        more = torch.tensor([float(len(micro_batches) > 1)], dtype=torch.float64)
        return float(self.collective.all_reduce_sum(more)) == 0.0

    def _switched_advantages(self, advantages: Tensor, entropy: float) -> Tensor:
        switch = self.algorithm.entrocraft
        if switch is None or not math.isfinite(entropy):
            return advantages
        return switch.apply(advantages, entropy, self.step_count)

    def _normalizer(self, mb: MicroBatch, update_normalizer: float, update_rows: float) -> float:
        """What this micro-batch's summed loss is divided by. "global": the update's count (all workers), so
        the accumulated gradient is that of the unsplit update. "micro-batch" (the official code's): the
        micro-batch's own count times rows_update / rows_mb, i.e. its own mean weighted by its share of the
        update's rows (all workers; a filler micro-batch has no rows and no loss)."""
        if self.algorithm.loss.normalization == "global":
            return update_normalizer
        own = max(loss_normalizer(mb.batch.action_mask, self.algorithm.loss.aggregation), 1.0)
        return own * update_rows / max(len(mb.rows), 1)

    def _step_totals(self, micro_batches: list[MicroBatch], pre: list[TokenStats], plan) -> dict:
        """Step-level sums over all workers, in one all-reduce: entropy for the gate, token counts, the
        loss normaliser and the row count of each update and the rollout/learner mismatch."""
        aggregation = self.algorithm.loss.aggregation
        names = ["entropy_sum", "entropy_count", "tokens", "action_tokens", "micro_batches"]
        names += ["abs_diff", "kl", "outside", "token_entropy_sum", "token_entropy_count"]
        local = dict.fromkeys(names, 0.0)
        max_abs = 0.0
        for mb, stats in zip(micro_batches, pre, strict=True):
            mask = mb.batch.action_mask > 0
            if aggregation == "seq-mean-token-mean":  # mean of per-sequence means
                counts = mask.sum(-1)
                seq_means = stats.entropy.sum(-1) / counts.clamp(min=1)
                local["entropy_sum"] += float(seq_means[counts > 0].sum())
                local["entropy_count"] += float((counts > 0).sum())
            else:  # token-mean (a per-sequence sum of entropies is no entropy level: token-mean too)
                local["entropy_sum"] += float(stats.entropy[mask].sum())
                local["entropy_count"] += float(mask.sum())
            local["token_entropy_sum"] += float(stats.entropy[mask].sum())
            local["token_entropy_count"] += float(mask.sum())
            if not mb.filler:
                local["tokens"] += float(mb.batch.attention_mask.sum())
                local["micro_batches"] += 1
            local["action_tokens"] += float(mask.sum())
            mismatch = mismatch_sums(stats.logprob, mb.batch.rollout_logprobs, mb.batch.action_mask)
            for key in ("abs_diff", "kl", "outside"):
                local[key] += mismatch[key]
            max_abs = max(max_abs, mismatch["max_abs"])
        normalizers = [sum(loss_normalizer(mb.batch.action_mask, aggregation) for mb in u) for u in plan]
        rows = [float(sum(len(mb.rows) for mb in u if not mb.filler)) for u in plan]
        vector = torch.tensor([local[k] for k in names] + normalizers + rows, dtype=torch.float64)
        vector = self.collective.all_reduce_sum(vector).tolist()
        totals = dict(zip(names, vector[: len(names)], strict=True))
        counts = vector[len(names) :]
        totals["normalizers"] = [max(c, 1.0) for c in counts[: len(plan)]]
        totals["rows"] = counts[len(plan) :]
        totals["max_abs"] = max(float(t) for t in self.collective.all_gather(torch.tensor([max_abs])))
        return totals

    def _step_selection(
        self, micro_batches: list[MicroBatch], pre: list[TokenStats], advantages: list[Tensor]
    ) -> list[tuple[Tensor, Tensor]]:
        """scope="batch": L+/L- over the whole step batch (all workers), from the pre-update surprisal."""
        masks = [mb.batch.action_mask > 0 for mb in micro_batches]
        surprisal = [(-stats.logprob)[m] for stats, m in zip(pre, masks, strict=True)]
        adv = [
            (a[:, None].expand_as(m) if a.dim() == 1 else a)[m]
            for a, m in zip(advantages, masks, strict=True)
        ]
        local_s = torch.cat(surprisal) if surprisal else torch.zeros(0, device=self.device)
        local_a = torch.cat(adv) if adv else torch.zeros(0, device=self.device)
        all_s, all_a = self.collective.all_gather(local_s), self.collective.all_gather(local_a)
        offset = sum(t.numel() for t in all_s[: self.collective.rank])
        everything = torch.cat(all_s)[None]
        top_pos, top_neg = self.selector.selection(
            everything, torch.cat(all_a)[None], torch.ones_like(everything)
        )
        out = []
        for m in masks:
            n = int(m.sum())
            pos, neg = torch.zeros_like(m), torch.zeros_like(m)
            pos[m], neg[m] = top_pos[0, offset : offset + n], top_neg[0, offset : offset + n]
            out.append((pos, neg))
            offset += n
        return out

    def _update_micro_batch(
        self,
        work: MicroBatchWork,
        normalizer: float,
        reweighted: bool,
        records: dict[int, TokenRecord] | None = None,
    ) -> UpdateSums:
        """Forward (unless fused with the pre-update pass) + backward of one micro-batch; its sums. `records`:
        where its rows' TokenRecords go (None: none kept)."""
        mb, pre, advantages = work.mb, work.pre, work.advantages
        mask = mb.batch.action_mask
        num_actions = int((mask > 0).sum())
        sums = UpdateSums()
        if num_actions == 0 and not self.collective.shards_gradients:
            return sums  # an all-masked micro-batch contributes exactly nothing (under FSDP: a zero backward)
        stats = work.forward if work.forward is not None else self._score(mb)
        top_pos = top_neg = None
        if work.selection is not None:
            top_pos, top_neg = work.selection
        elif reweighted or self.config.diagnostics:  # the current policy's surprisal, over this micro-batch
            top_pos, top_neg = self.selector.selection(-stats.logprob.detach(), advantages, mask)
        weights = self.reweighting.weights_from_selection(top_pos, top_neg) if reweighted else None
        if records is not None and not mb.filler:
            records.update(token_records(mb, pre, top_pos, top_neg, weights))
        old = pre.logprob if self.config.old_logprobs == "recompute" else mb.batch.rollout_logprobs
        correction = None
        if self.config.importance.active:  # pi_old / pi_rollout, truncated and/or masked
            correction, capped, masked = importance_weights(
                pre.logprob, mb.batch.rollout_logprobs, mask, self.config.importance
            )
            sums.capped, sums.masked = float(capped.sum()), float(masked.sum())
        loss, metrics = policy_loss(
            stats.logprob,
            old,
            advantages,
            mask,
            self.algorithm.loss,
            token_weights=weights,
            importance_weights=correction,
            entropy=stats.entropy,
            normalizer=normalizer,
            generator=self.generator,
        )
        scale = self.collective.loss_scale * self.scaler.scale  # data-parallel share, fp16's loss scale
        (loss * scale if scale != 1.0 else loss).backward()
        sums.loss = float(loss.detach())
        sums.clipfrac = float(metrics["policy/clipfrac"]) * num_actions
        sums.approx_kl = float(metrics["policy/approx_kl"]) * num_actions
        sums.ratio_mean = float(metrics["policy/ratio_mean"]) * num_actions
        if self.config.diagnostics:  # Phi of the pre-update policy
            phi = sensitivity_from_statistics(
                {"logprob": pre.logprob, "entropy": pre.entropy, "collision": pre.collision}
            )
            for key, count in quadrant_counts(advantages, phi, mask).items():
                setattr(sums, key, float(count))
            sums.lplus_neg = float((top_pos & (phi < 0)).sum())
        if reweighted or self.config.diagnostics:
            sums.lplus = float(top_pos.sum())
            sums.lminus = float(top_neg.sum())
        return sums

    def _apply_gradients(self) -> float:
        scale = self.scaler.scale
        grad_norm = optimizer_step(
            self.optimizer, self.model, self.config.optimizer.max_grad_norm, self.collective, self.scaler
        )
        if not math.isfinite(grad_norm):
            self.skipped_updates += 1
            if self.scaler.absorbs(scale):  # fp16: an overflow; the scale is halved
                logger.info(
                    "learner step %d: fp16 gradients overflowed at loss scale %g; update skipped, scale now %g",
                    self.step_count,
                    scale,
                    self.scaler.scale,
                )
                return grad_norm
            warnings.warn(
                f"learner step {self.step_count}: gradient norm is {grad_norm}; the optimiser update is skipped "
                f"({self.skipped_updates} so far). Lower the learning rate or check the rewards",
                RuntimeWarning,
                stacklevel=3,
            )
        return grad_norm

    def _metrics(
        self, totals, s: UpdateSums, grad_norms, lr, entropy, reweighted, start, pre_update_s
    ) -> dict[str, float]:
        """LEARNER_METRICS from the step's totals and its update sums (both over all workers)."""
        actions = totals["action_tokens"]
        per_action = (lambda x: x / actions) if actions else (lambda x: float("nan"))
        step_s = time.perf_counter() - start
        diagnostics = self.config.diagnostics or reweighted
        metrics = {
            "learner/entropy": entropy,
            "learner/loss": s.loss / len(grad_norms),
            "learner/grad_norm": _finite_mean(grad_norms),
            "learner/lr": lr,
            "learner/tokens": totals["tokens"],
            "learner/action_tokens": actions,
            "learner/micro_batches": totals["micro_batches"],
            "learner/tokens_per_s": totals["tokens"] / step_s,
            "learner/step_s": step_s,
            "learner/pre_update_s": pre_update_s,
            "learner/skipped_updates": float(self.skipped_updates),
            "learner/loss_scale": float(self.scaler.scale),
            "policy/clipfrac": per_action(s.clipfrac),
            "policy/approx_kl": per_action(s.approx_kl),
            "policy/ratio_mean": per_action(s.ratio_mean),
            "stare/gate_on": float(reweighted),
            **(self.reweighting.figures() if self.reweighting is not None else NO_REWEIGHTING),
            "stare/lplus_share": per_action(s.lplus) if diagnostics else float("nan"),
            "stare/lminus_share": per_action(s.lminus) if diagnostics else float("nan"),
            "stare/lplus_negative_phi": s.lplus_neg / s.lplus if s.lplus else float("nan"),
            "mismatch/logprob_abs_diff": per_action(totals["abs_diff"]),
            "mismatch/kl": per_action(totals["kl"]),
            "mismatch/max_abs_log_ratio": totals["max_abs"],
            "mismatch/ratio_outside": per_action(totals["outside"]),
            "importance/capped_share": per_action(s.capped) if actions else 0.0,
            "importance/masked_share": per_action(s.masked) if actions else 0.0,
        }
        for key in QUADRANTS:
            metrics[f"quadrant/{key}"] = getattr(s, key) if self.config.diagnostics else float("nan")
        if not self.config.diagnostics:
            metrics["stare/lplus_negative_phi"] = float("nan")
        return {name: float(metrics[name]) for name in LEARNER_METRICS}

    # ---- other passes -------------------------------------------------------------------------------

    @torch.no_grad()
    def token_stats(self, batch: Batch) -> TokenStats:
        """log pi(a), entropy and Phi's collision term of the current policy over a whole batch (no update)."""
        self.policy.eval()
        stats = self.policy(batch.to(self.device), want_collision=True)
        self.policy.train()
        return stats

    # ---- weight sync: the sender's end of stare_agents.rollout.weight_sync ------------------------------

    def sync_host(self) -> str:
        """Where this learner's sync groups meet: its node's Ray address when this process runs Ray (a cluster:
        the node's network address; the local instance: 127.0.0.1), else loopback."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            return ray.util.get_node_ip_address()
        return "127.0.0.1"

    def sync_address(
        self, world_size: int, *, engines_on_gpu: bool, timeout_s: float = 300.0, host: str | None = None
    ) -> GroupAddress:
        """Open a new sync group here, on this learner's node (`open_group` binds its store's port in this
        process), and return its address for the engines: NCCL when this learner and the engines are on GPUs,
        else gloo. `host`: this node's address when the caller knows it better (`sync_host` otherwise)."""
        backend = "nccl" if engines_on_gpu and self.device.type == "cuda" else "gloo"
        address, store = open_group(host or self.sync_host(), world_size, backend, timeout_s)
        self._sync_stores[address.port] = store
        return address

    def sync_join(self, address: GroupAddress) -> None:
        """Join a sync group as its sender (rank 0); returns once every engine joined."""
        store = self._sync_stores.pop(address.port, None)
        self._sync_groups[address.port] = SyncGroup(address, 0, store=store)

    def sync_plan(self, *, version: int, dtype: torch.dtype, bucket_mb: float = 256.0) -> WeightsPlan:
        return WeightsPlan.of(
            ((name, tuple(t.shape)) for name, t in self._sync_state().items()),
            dtype=dtype,
            version=version,
            bucket_mb=bucket_mb,
        )

    def sync_send(self, plan: WeightsPlan, port: int) -> None:
        """Broadcast the current weights to the group on `port`, bucket by bucket. Under FSDP every worker
        calls this (each tensor is gathered from the shards as it is sent); only rank 0 has a group."""
        tensors = self.sync_tensors(plan)
        group = self._sync_groups.get(port)
        if group is None:
            if self.collective.rank == 0:
                raise RuntimeError(f"no sync group on port {port}: join it first")
            for _ in tensors:  # take part in the gathers
                pass
            return
        send_weights(group, plan, tensors)

    def sync_tensors(self, plan: WeightsPlan) -> Iterator[Tensor]:
        """The full tensors of the plan, in its order (under FSDP gathered one by one, a collective)."""
        state = self._sync_state()
        for name in plan.names:
            tensor = state[name]
            yield tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor

    def sync_leave(self, port: int) -> None:
        self._sync_stores.pop(port, None)  # a group opened and never joined
        group = self._sync_groups.pop(port, None)
        if group is not None:
            group.close()

    def _sync_state(self) -> dict[str, Tensor]:
        state = self.model.state_dict()
        if getattr(self.model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # the engine ties it to the embedding itself
        return state

    # ---- checkpoints --------------------------------------------------------------------------------

    def save_shards(self, folder: str | Path) -> None:
        """The model and optimiser as this worker holds them (see `save_policy_shards`)."""
        save_policy_shards(self.policy, self.optimizer, folder)

    def load_shards(self, folder: str | Path) -> None:
        load_policy_shards(self.policy, self.optimizer, folder)

    def model_state_dict(self) -> dict[str, Tensor]:
        """The model's full weights (gathered from the shards under FSDP): what rollout workers load."""
        if not self.collective.shards_gradients:
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(
            self.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return {key.removeprefix("model."): value for key, value in full.items()}

    def _optimizer_state_dict(self) -> dict:
        if not self.collective.shards_gradients:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.policy, self.optimizer, options=options)

    def state_dict(self) -> dict:
        """Everything the next step depends on: model, optimiser, LR schedule, gate, RNG states, counters."""
        return {
            "model": self.model_state_dict(),
            "optimizer": self._optimizer_state_dict(),
            **self.small_state_dict(),
        }

    def small_state_dict(self) -> dict:
        """The state without the model and the optimiser (which `save_shards` writes shard by shard)."""
        state = {
            "scheduler": self.scheduler.state_dict(),
            "stare": self.reweighting.state_dict() if self.reweighting is not None else None,
            "step_count": self.step_count,
            "skipped_updates": self.skipped_updates,
            "loss_scaler": self.scaler.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def hf_model(self, model_dir: Path) -> nn.Module:
        return self.model  # this process holds it

    def save_checkpoint(self, state: dict[str, Any], path: Path, *, tokenizer_dir: Path) -> None:
        """Model, optimiser and the rest in one checkpoint, beside a model folder `stare-agents eval --model`
        takes (and resume reads)."""
        save_checkpoint(
            {**state, "learner": self.state_dict()}, path, model=self.model, tokenizer_dir=tokenizer_dir
        )

    def resume(self, checkpoint: Path, state: dict[str, Any]) -> None:
        if state.get("sharded"):
            raise ValueError(
                f"{checkpoint} holds a data-parallel learner's shards (rl.learner_workers > 1): resume it with "
                "the settings it was trained with"
            )
        self.load_state_dict(state["learner"])  # model, optimiser, schedule, gate, RNG states

    def close(self) -> None:
        """Leave the weight-sync groups this learner sends to."""
        for port in list(self._sync_groups) + list(self._sync_stores):
            self.sync_leave(port)

    def load_state_dict(self, state: dict) -> None:
        if self.collective.shards_gradients:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
            model_state = {f"model.{key}": value for key, value in state["model"].items()}
            set_model_state_dict(self.policy, model_state, options=options)
            set_optimizer_state_dict(self.policy, self.optimizer, state["optimizer"], options=options)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.load_small_state_dict(state)

    def load_small_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        if (state["stare"] is None) != (self.reweighting is None):
            uses = "uses" if self.reweighting is not None else "does not use"
            raise ValueError(
                f"checkpoint {'has no' if state['stare'] is None else 'has a'} STARE gate state (a token "
                f"reweighting's) but the algorithm {self.algorithm.name!r} {uses} a token reweighting: resume with "
                "the algorithm the checkpoint was trained with"
            )
        if self.reweighting is not None:
            self.reweighting.load_state_dict(state["stare"])
        self.step_count = int(state["step_count"])
        self.skipped_updates = int(state["skipped_updates"])
        self.scaler.load_state_dict(state.get("loss_scaler"))
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
