"""What a learner step reports: its figures as typed sums (`StepTotals`, `UpdateSums`; LEARNER_METRICS follows
from them), the per-token records of the trajectories it trained and scored, and the `StepResult` carrying both.

A new learner figure is a field of `StepTotals` (measured before the updates, over the step batch) or of
`UpdateSums` (summed over the updates' micro-batches; the reweighting's own are in `algo/reweighting.py`) with
its name and divisor, and the line in `train/learner.py` that computes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from stare_agents.algo.importance import mismatch_sums
from stare_agents.algo.reweighting import REWEIGHTING_FIGURES, ReweightingSums
from stare_agents.algo.sums import Sums, figure
from stare_agents.train.policy import MicroBatch, TokenStats


@dataclass
class StepTotals(Sums):
    """Step-level sums over the step batch and every worker (one all-reduce, before the updates)."""

    entropy_sum: float = figure(
        "learner/entropy", per="entropy_count"
    )  # aggregated like the loss (the gate's)
    entropy_count: float = 0.0
    token_entropy_sum: float = 0.0  # token mean over the action tokens (with the untrained: entropy_all)
    token_entropy_count: float = 0.0
    tokens: float = figure("learner/tokens")  # non-padding tokens
    action_tokens: float = figure("learner/action_tokens")  # policy-sampled tokens
    micro_batches: float = figure("learner/micro_batches")
    abs_diff: float = figure(
        "mismatch/logprob_abs_diff", per="action_tokens"
    )  # |log pi_learner - log pi_rollout|
    kl: float = figure("mismatch/kl", per="action_tokens")  # k3 estimate of KL(pi_rollout || pi_learner)
    outside: float = figure("mismatch/ratio_outside", per="action_tokens")  # ratio outside [0.9, 1.1]

    @property
    def entropy(self) -> float:
        return self.entropy_sum / self.entropy_count if self.entropy_count else math.nan

    @classmethod
    def measure(cls, mb: MicroBatch, stats: TokenStats, aggregation: str) -> tuple[StepTotals, float]:
        """One micro-batch's totals from its pre-update statistics, and its largest |log pi_learner - log
        pi_rollout| (a max, not a sum)."""
        out = cls()
        mask = mb.batch.action_mask > 0
        if aggregation == "seq-mean-token-mean":  # mean of per-sequence means
            counts = mask.sum(-1)
            seq_means = stats.entropy.sum(-1) / counts.clamp(min=1)
            out.entropy_sum, out.entropy_count = float(seq_means[counts > 0].sum()), float((counts > 0).sum())
        else:  # token-mean (a per-sequence sum of entropies is no entropy level: token-mean too)
            out.entropy_sum, out.entropy_count = float(stats.entropy[mask].sum()), float(mask.sum())
        out.token_entropy_sum, out.token_entropy_count = float(stats.entropy[mask].sum()), float(mask.sum())
        if not mb.filler:
            out.tokens, out.micro_batches = float(mb.batch.attention_mask.sum()), 1.0
        out.action_tokens = float(mask.sum())
        mismatch = mismatch_sums(stats.logprob, mb.batch.rollout_logprobs, mb.batch.action_mask)
        out.abs_diff, out.kl, out.outside = mismatch["abs_diff"], mismatch["kl"], mismatch["outside"]
        return out, mismatch["max_abs"]


@dataclass
class UpdateSums(Sums):
    """What the micro-batches' updates add up (over micro-batches, then workers): the loss as normalised,
    per-action-token sums of its statistics and of the importance correction, and the reweighting's sums."""

    loss: float = figure("learner/loss", per="updates")  # mean over the step's optimiser updates
    clipfrac: float = figure("policy/clipfrac", per="action_tokens")  # tokens whose gradient a clip stopped
    approx_kl: float = figure("policy/approx_kl", per="action_tokens")  # k3 estimate of KL(old || new)
    ratio_mean: float = figure("policy/ratio_mean", per="action_tokens")
    capped: float = figure("importance/capped_share", per="action_tokens")  # importance weight truncated
    masked: float = figure("importance/masked_share", per="action_tokens")  # left out by the importance mask
    reweighting: ReweightingSums = field(default_factory=ReweightingSums)  # L+/L-, their mismatch, Phi


# the figures that are not sums (see _metrics)
STEP_FIGURES = (
    "learner/entropy_all",  # token mean over every sampled trajectory (trained and untrained) before the update
    "learner/grad_norm",  # total gradient norm before clipping, mean over the step's updates that were taken
    "learner/lr",  # learning rate used this step
    "learner/tokens_per_s",  # learner/tokens / learner/step_s
    "learner/step_s",  # wall time of the step
    "learner/pre_update_s",  # wall time of the pre-update pass (of the shared forward when fused)
    "learner/skipped_updates",  # cumulative optimiser updates skipped for a non-finite gradient norm
    "learner/loss_scale",  # fp16's dynamic loss scale after the step (1 in every other precision)
    "mismatch/max_abs_log_ratio",  # the largest |log pi_learner - log pi_rollout| of the step
    "stare/gate_on",  # 1 if this step was reweighted (gate on, or open loop), else 0
)
# The metrics `Learner.step` returns, always all of them (NaN where a value was not measured that step: absent
# from metrics.jsonl). stare/* are the reweighting's (any method's; a baseline's L+/L- are STARE's defaults').
LEARNER_METRICS = StepTotals.names() + UpdateSums.names() + STEP_FIGURES + REWEIGHTING_FIGURES


@dataclass
class StepRun:
    """What applying a step's plan did besides its sums."""

    lr: float
    grad_norms: list[float]  # one per optimiser update (non-finite: skipped)
    step_s: float

    @property
    def grad_norm(self) -> float:
        """The mean of the finite norms (a skipped update's is not finite), NaN when there are none."""
        finite = [v for v in self.grad_norms if math.isfinite(v)]
        return sum(finite) / len(finite) if finite else math.nan


@dataclass
class TokenRecord:
    """What the learner saw of one trajectory's response tokens in a step (`step(..., record_tokens=True)`), for
    the trained trajectories and the untrained ones it scored. Lists run over the response (action and
    observation tokens alike); 0 / 1 / 0 where action_mask is 0.

    learner_logprobs: log pi_old(a) of the pre-update policy (what the gate and the diagnostics saw).
    entropy: that policy's entropy at each position (at the sampling temperature).
    phi: its entropy sensitivity Phi at each position (empty without `diagnostics` for a trained trajectory).
    stare_weights: the weight each token's advantage was multiplied by (all 1 while the gate is off); None for
        an untrained trajectory.
    selection: 1 for L+, -1 for L-, 0 otherwise, as selected for the update (also while the gate is off, when
        it says which tokens STARE would have reweighted); empty when nothing was selected (no STARE,
        diagnostics off, untrained).
    """

    learner_logprobs: list[float]
    entropy: list[float]
    phi: list[float] = field(default_factory=list)
    stare_weights: list[float] | None = None
    selection: list[int] = field(default_factory=list)


class StepResult(dict):
    """What one learner step returns: its figures (every name in LEARNER_METRICS) as a mapping, with
    `token_records` (step-batch row -> TokenRecord, empty unless the step was asked to record them),
    `other_records` (the same for the rows of `others`, the untrained trajectories it scored) and `gate_on`
    (whether it reweighted the tokens; None without a token reweighting)."""

    def __init__(
        self,
        metrics: dict[str, float],
        token_records: dict[int, TokenRecord] | None = None,
        gate_on: bool | None = None,
        other_records: dict[int, TokenRecord] | None = None,
    ) -> None:
        super().__init__(metrics)
        self.token_records: dict[int, TokenRecord] = token_records or {}
        self.other_records: dict[int, TokenRecord] = other_records or {}
        self.gate_on = gate_on

    @classmethod
    def untrained(cls, gate_on: bool | None, entropy_all: float = math.nan, **records: Any) -> StepResult:
        """A step with nothing to train on: every figure NaN but the entropy over the untrained trajectories."""
        return cls(
            {**dict.fromkeys(LEARNER_METRICS, math.nan), "learner/entropy_all": entropy_all},
            gate_on=gate_on,
            **records,
        )


def token_records(
    mb: MicroBatch,
    stats: TokenStats,
    phi: Tensor | None,
    top_pos: Tensor | None = None,
    top_neg: Tensor | None = None,
    weights: Tensor | None = None,
    *,
    trained: bool = True,
) -> dict[int, TokenRecord]:
    """Each row's TokenRecord in a micro-batch (`stats`: the pre-update policy's; see TokenRecord)."""
    lengths = mb.batch.attention_mask[:, mb.batch.prompt_length :].sum(-1).tolist()

    def rows(values: Tensor | None) -> list[list]:
        cpu = values.detach().cpu() if values is not None else None
        return [cpu[j, :n].tolist() if cpu is not None else [] for j, n in enumerate(lengths)]

    logprob, entropy, phi_rows = rows(stats.logprob.float()), rows(stats.entropy.float()), rows(phi)
    weight = rows(weights.float()) if weights is not None else [[1.0] * n for n in lengths]
    chosen = (
        rows(top_pos.long() - top_neg.long()) if top_pos is not None and top_neg is not None else rows(None)
    )
    return {
        row: TokenRecord(logprob[j], entropy[j], phi_rows[j], weight[j] if trained else None, chosen[j])
        for j, row in enumerate(mb.rows)
    }
