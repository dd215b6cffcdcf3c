"""Clipped policy-gradient loss shared by GRPO, GRPO-ds, STARE and the entropy-control baselines.

All inputs are [B, T] over response positions; `action_mask` is 1 on policy-generated tokens and 0 on
prompt padding and observation tokens, which never enter the loss. The clipped surrogate is
`clipped_surrogate`; the baselines' extra terms are `entropy_bonus` here and Clip-Cov / KL-Cov in
`stare_agents.algo.baselines`; `policy_loss` puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from stare_agents.algo.baselines import clip_cov_keep, kl_cov_per_token
from stare_agents.algo.logits import masked_mean
from stare_agents.algo.stare import broadcast_advantages

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
Normalization = Literal["global", "micro-batch"]
NORMALIZATIONS: tuple[str, ...] = get_args(Normalization)
CovMode = Literal["none", "clip-cov", "kl-cov"]
COV_MODES: tuple[str, ...] = get_args(CovMode)
LOG_RATIO_LIMIT = 20.0  # log pi - log pi_old is clamped to [-20, 20] before exp


@dataclass
class PolicyLossConfig:
    clip_low: float = 0.2  # ratio floor 1 - eps_low
    clip_high: float = 0.28  # ratio ceiling 1 + eps_high (DAPO clip-higher)
    dual_clip: float = 10.0  # c: per-token loss of a negative-advantage token is at most -A * c
    aggregation: Aggregation = "token-mean"
    # what a gradient-accumulation micro-batch's loss is divided by (the learner applies it, knowing the plan):
    # "global": the whole optimiser update's count (tokens, or sequences for the seq-mean modes), so the
    #   update equals one pass over the unsplit batch; "micro-batch": the official STARE code's, each
    #   micro-batch's own mean scaled by its share of the update's rows, loss_mb * rows_mb / rows_update
    normalization: Normalization = "global"
    entropy_coef: float = 0.0  # entropy bonus: loss -= coef * aggregate(H)
    cov_mode: CovMode = "none"  # "clip-cov" / "kl-cov" (Cui et al. 2025)
    clip_cov_ratio: float = 2e-4
    clip_cov_low: float = 1.0
    clip_cov_high: float = 5.0
    kl_cov_ratio: float = 2e-3
    kl_cov_coef: float = 1.0

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"loss.normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}: 'global' "
                "divides by the whole update's token count, 'micro-batch' (the official STARE code) takes each "
                "micro-batch's mean weighted by its share of rows"
            )
        if self.cov_mode not in COV_MODES:
            raise ValueError(f"cov_mode must be one of {COV_MODES}, got {self.cov_mode!r}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0 and self.dual_clip > 1):
            raise ValueError(
                f"need 0 <= clip_low < 1, clip_high >= 0, dual_clip > 1; got "
                f"{self.clip_low=}, {self.clip_high=}, {self.dual_clip=}"
            )
        if self.entropy_coef < 0 or not 0 <= self.clip_cov_ratio <= 1 or not 0 <= self.kl_cov_ratio <= 1:
            raise ValueError(
                f"need entropy_coef >= 0 and clip_cov_ratio, kl_cov_ratio in [0, 1]; got "
                f"{self.entropy_coef=}, {self.clip_cov_ratio=}, {self.kl_cov_ratio=}"
            )


def aggregate(per_token: Tensor, mask: Tensor, aggregation: str, normalizer: float | None = None) -> Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    token-mean: sum over all action tokens / their count. seq-mean-token-sum: mean over sequences of
    the per-sequence sum. seq-mean-token-mean: mean over sequences of the per-sequence mean.
    `normalizer` replaces the local token (or sequence) count, e.g. the whole step's count when a
    batch is split into gradient-accumulation micro-batches (`loss_normalizer` counts it). Values at
    masked positions never enter, not even as NaN or inf.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    is_action = mask > 0
    masked = torch.where(is_action, per_token, 0.0)
    counts = is_action.sum(-1).to(per_token.dtype)
    normalizer = max(loss_normalizer(mask, aggregation) if normalizer is None else normalizer, 1.0)
    if aggregation == "token-mean":
        return masked.sum() / normalizer
    if aggregation == "seq-mean-token-sum":
        return masked.sum(-1).sum() / normalizer
    return (masked.sum(-1) / counts.clamp(min=1.0)).sum() / normalizer


def loss_normalizer(mask: Tensor, aggregation: str) -> float:
    """What `aggregate` divides by (at least 1): the action-token count (token-mean) or the count of
    sequences with at least one action token (the seq-mean modes). Sum it over the micro-batches (and
    workers) of a gradient-accumulation step and pass the sum as `normalizer`."""
    is_action = mask > 0
    count = is_action.sum() if aggregation == "token-mean" else is_action.any(-1).sum()
    return float(count)


def clipped_surrogate(ratio: Tensor, advantages: Tensor, config: PolicyLossConfig) -> tuple[Tensor, Tensor]:
    """PPO-clip per token with the asymmetric range [1 - eps_low, 1 + eps_high] and the dual clip c.

    Returns the per-token loss max(-A r, -A clip(r)), capped at -A c where A < 0, and the mask of tokens
    whose gradient a clip stopped.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual = torch.minimum(per_token, -advantages * config.dual_clip)
    stopped = (clipped > unclipped) | ((advantages < 0) & (dual < per_token))
    return torch.where(advantages < 0, dual, per_token), stopped


def entropy_bonus(
    entropy: Tensor | None, action_mask: Tensor, config: PolicyLossConfig, normalizer: float | None = None
) -> Tensor:
    """The entropy-bonus baseline's term, coef * aggregate(H), subtracted from the loss."""
    if entropy is None:
        raise ValueError(
            f"entropy_coef = {config.entropy_coef} > 0 needs the per-token `entropy` (with grad) passed to "
            "policy_loss"
        )
    return config.entropy_coef * aggregate(entropy, action_mask, config.aggregation, normalizer)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    config: PolicyLossConfig | None = None,
    *,
    token_weights: Tensor | None = None,
    importance_weights: Tensor | None = None,
    entropy: Tensor | None = None,
    normalizer: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate, STARE-weighted after clipping and before aggregation (paper Eq. 8).

    Returns the scalar loss and detached metrics. `token_weights` are STARE's (None = all ones);
    `importance_weights` (detached, e.g. truncated importance sampling) multiply the same way;
    `entropy` [B, T] with grad is needed only when `config.entropy_coef > 0`. Off the action tokens the
    log-ratio is 0 and on them it is clamped to [-20, 20] before `exp`, so masked or sentinel
    log-probs (e.g. -1e9, -inf) cannot produce NaN; an all-masked input gives a loss of exactly 0.
    """
    config = config or PolicyLossConfig()
    is_action = action_mask > 0
    advantages = torch.where(is_action, broadcast_advantages(advantages, logprobs).to(logprobs.dtype), 0.0)
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    log_ratio = torch.where(is_action, log_ratio, 0.0)
    ratio = torch.exp(log_ratio)

    per_token, stopped = clipped_surrogate(ratio, advantages, config)
    if config.cov_mode == "clip-cov":
        per_token = per_token * clip_cov_keep(advantages, logprobs, action_mask, stopped, config, generator)
    elif config.cov_mode == "kl-cov":
        per_token = kl_cov_per_token(advantages, logprobs, log_ratio, ratio, action_mask, config)
    if importance_weights is not None:
        per_token = per_token * importance_weights.detach()
    if token_weights is not None:
        per_token = per_token * token_weights  # STARE: after clipping, before aggregation, not renormalised

    loss = aggregate(per_token, action_mask, config.aggregation, normalizer)
    if config.entropy_coef:
        loss = loss - entropy_bonus(entropy, action_mask, config, normalizer)

    with torch.no_grad():
        mask = is_action.to(logprobs.dtype)
        metrics = {
            "policy/clipfrac": masked_mean(stopped.to(mask.dtype), mask),
            "policy/approx_kl": masked_mean((ratio - 1) - log_ratio, mask),  # k3 estimator of KL(old || new)
            "policy/ratio_mean": masked_mean(ratio, mask),
        }
        if token_weights is not None:
            num_actions = mask.sum().clamp(min=1.0)
            metrics["stare/mean_weight"] = torch.where(is_action, token_weights, 0.0).sum() / num_actions
            metrics["stare/frac_weighted"] = ((token_weights != 1) & is_action).sum() / num_actions
    return loss, metrics
