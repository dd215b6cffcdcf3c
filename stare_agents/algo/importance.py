"""The rollout/learner mismatch and its correction.

The engine samples from pi_rollout; the learner scores the same tokens as pi_old. When both compute in the
same precision these agree (to float rounding); in bf16 they differ, and the policy gradient is then an
off-policy estimate. Per action token, with log r = log pi_old(a) - log pi_rollout(a):

    mismatch_sums(...)          the figures a run logs each step (sums over action tokens, to be reduced)
    importance_weights(...)     truncated IS  w = min(r, cap)              (TIS)
                                masked IS     w = 1 if low <= r <= high else 0   (MIS)
                                at level "token" (r per token) or "sequence" (r = exp(mean log r over the
                                sequence's action tokens), the geometric mean, so long answers are not
                                masked for their length alone)

The weights multiply the clipped surrogate per token (`policy_loss(importance_weights=...)`). Where the two
log-probs are equal, every weight is exactly 1.0 and nothing is masked, so the step is bit-identical to one
without the correction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from stare_agents.algo.losses import LOG_RATIO_LIMIT

ImportanceLevel = Literal["token", "sequence"]
IMPORTANCE_LEVELS: tuple[str, ...] = get_args(ImportanceLevel)
OUTSIDE_BAND = (0.9, 1.1)  # mismatch/ratio_outside: the share of tokens whose ratio leaves this band


@dataclass
class ImportanceConfig:
    """How the learner corrects for pi_rollout != pi_old. `cap`: truncate the weight at `cap` (None: no
    truncation); `mask`: (low, high), drop tokens (or sequences) whose ratio is outside it (None: no mask)."""

    cap: float | None = None
    mask: tuple[float, float] | None = None
    level: ImportanceLevel = "token"

    def __post_init__(self) -> None:
        if self.cap is not None and not self.cap > 0:
            raise ValueError(f"importance cap must be > 0, got {self.cap}")
        if self.mask is not None:
            if len(self.mask) != 2:
                raise ValueError(f"importance mask must be (low, high), got {self.mask}")
            self.mask = (float(self.mask[0]), float(self.mask[1]))
            low, high = self.mask
            if not 0 <= low < 1 < high:
                raise ValueError(
                    f"importance mask must be (low, high) with 0 <= low < 1 < high, got {self.mask}"
                )
        if self.level not in IMPORTANCE_LEVELS:
            raise ValueError(f"importance level must be one of {IMPORTANCE_LEVELS}, got {self.level!r}")

    @property
    def active(self) -> bool:
        return self.cap is not None or self.mask is not None


def log_ratios(learner_logprobs: Tensor, rollout_logprobs: Tensor, action_mask: Tensor) -> Tensor:
    """log pi_old(a) - log pi_rollout(a) on action tokens (clamped to +-20), 0 elsewhere."""
    diff = (learner_logprobs.detach() - rollout_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.where(action_mask > 0, diff, 0.0)


def importance_weights(
    learner_logprobs: Tensor, rollout_logprobs: Tensor, action_mask: Tensor, config: ImportanceConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """(weights [B, T], capped [B, T] bool, masked [B, T] bool); weights are 1 off the action tokens."""
    is_action = action_mask > 0
    log_r = log_ratios(learner_logprobs, rollout_logprobs, action_mask)
    if config.level == "sequence":  # geometric mean of the sequence's token ratios, on each of its tokens
        counts = is_action.sum(-1, keepdim=True).clamp(min=1)
        log_r = torch.where(is_action, (log_r.sum(-1, keepdim=True) / counts).expand_as(log_r), 0.0)
    ratio = log_r.exp()  # exactly 1 where the log-probs agree and off the action tokens
    capped = is_action & (ratio > config.cap) if config.cap is not None else torch.zeros_like(is_action)
    weights = ratio.clamp(max=config.cap) if config.cap is not None else ratio
    masked = torch.zeros_like(is_action)
    if config.mask is not None:
        low, high = config.mask
        masked = is_action & ((ratio < low) | (ratio > high))
        weights = torch.where(masked, 0.0, weights)
    return weights, capped, masked


def mismatch_sums(
    learner_logprobs: Tensor, rollout_logprobs: Tensor, action_mask: Tensor
) -> dict[str, float]:
    """Sums over the action tokens, for per-step means after a reduction over micro-batches and workers:
    |log r| (abs_diff), the k3 estimate of KL(pi_rollout || pi_old), (r - 1) - log r with r = pi_old /
    pi_rollout on tokens sampled from pi_rollout (kl), tokens whose r leaves OUTSIDE_BAND (outside), and the
    largest |log r| (max_abs, a max rather than a sum)."""
    is_action = action_mask > 0
    log_r = log_ratios(learner_logprobs, rollout_logprobs, action_mask)[is_action].double()
    if log_r.numel() == 0:
        return {"abs_diff": 0.0, "kl": 0.0, "outside": 0.0, "max_abs": 0.0}
    ratio = log_r.exp()
    low, high = OUTSIDE_BAND
    return {
        "abs_diff": float(log_r.abs().sum()),
        "kl": float((ratio - 1 - log_r).sum()),
        "outside": float(((ratio < low) | (ratio > high)).sum()),
        "max_abs": float(log_r.abs().max()),
    }


# When a step's mismatch is large enough to matter (BENCHMARKS.md, "Precision"): the k3 KL estimate or the
# share of tokens whose ratio leaves [0.9, 1.1] above these. bf16 on both sides, in runs that learned as fp32
# did, reached KL 2.7e-3 and 7.3% per step (35 steps, 3 seeds, an AMX Xeon); an engine left on its first
# weights reads KL 2.6-4e-2 against a trained learner. The lines sit about 2x above the first.
WARN_KL = 5e-3
WARN_OUTSIDE = 0.10


def mismatch_warning(metrics: dict[str, float], *, corrected: bool, fp32_head: bool) -> str | None:
    """A message when the step's rollout/learner mismatch (`mismatch/kl`, `mismatch/ratio_outside` of the
    learner's metrics) is above WARN_KL / WARN_OUTSIDE, naming what would reduce it; None otherwise."""
    kl, outside = metrics.get("mismatch/kl", 0.0), metrics.get("mismatch/ratio_outside", 0.0)
    if not (kl > WARN_KL or outside > WARN_OUTSIDE):  # NaN (no action tokens) is no warning
        return None
    remedies = []
    if not fp32_head:
        remedies.append("model.fp32_lm_head=true (an fp32 LM head in the engine and the learner)")
    if not corrected:
        remedies.append("rl.learner.importance.cap=2.0 (truncated importance sampling)")
    remedies.append("fp32 in both (model.rollout_dtype=float32 rl.learner.precision=fp32)")
    return (
        f"the rollout and the learner disagree on the sampled tokens: KL(rollout || learner) ~ {kl:.2g} "
        f"(warn above {WARN_KL:g}), {outside:.1%} of the tokens with a probability ratio outside [0.9, 1.1] "
        f"(warn above {WARN_OUTSIDE:.0%}); the update is that far off-policy. To reduce it: "
        + "; or ".join(remedies)
    )
