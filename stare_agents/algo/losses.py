"""Clipped policy-gradient loss shared by GRPO, GRPO-ds, STARE and the entropy-control baselines.

All inputs are [B, T] over response positions; `action_mask` is 1 on policy-generated tokens and 0 on
prompt padding and observation tokens, which never enter the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from stare_agents.algo.logits import masked_mean
from stare_agents.algo.stare import broadcast_advantages

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
COV_MODES = ("none", "clip-cov", "kl-cov")


@dataclass
class PolicyLossConfig:
    clip_low: float = 0.2  # ratio floor 1 - eps_low
    clip_high: float = 0.28  # ratio ceiling 1 + eps_high (DAPO clip-higher)
    dual_clip: float = 10.0  # c: per-token loss of a negative-advantage token is at most -A * c
    aggregation: str = "token-mean"
    entropy_coef: float = 0.0  # entropy bonus: loss -= coef * aggregate(H)
    cov_mode: str = "none"  # "clip-cov" / "kl-cov" (Cui et al. 2025)
    clip_cov_ratio: float = 2e-4
    clip_cov_low: float = 1.0
    clip_cov_high: float = 5.0
    kl_cov_ratio: float = 2e-3
    kl_cov_coef: float = 1.0

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.cov_mode not in COV_MODES:
            raise ValueError(f"cov_mode must be one of {COV_MODES}, got {self.cov_mode!r}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0 and self.dual_clip > 1):
            raise ValueError(
                f"need 0 <= clip_low < 1, clip_high >= 0, dual_clip > 1; got "
                f"{self.clip_low=}, {self.clip_high=}, {self.dual_clip=}"
            )


def aggregate(per_token: Tensor, mask: Tensor, aggregation: str, normalizer: float | None = None) -> Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    token-mean: sum over all action tokens / their count. seq-mean-token-sum: mean over sequences of
    the per-sequence sum. seq-mean-token-mean: mean over sequences of the per-sequence mean.
    `normalizer` replaces the local token (or sequence) count, e.g. the whole step's count when a
    batch is split into gradient-accumulation micro-batches.
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if aggregation == "token-mean":
        return masked.sum() / (normalizer if normalizer is not None else mask.sum().clamp(min=1.0))
    has_tokens = (mask.sum(-1) > 0).to(per_token.dtype)
    num_seqs = normalizer if normalizer is not None else has_tokens.sum().clamp(min=1.0)
    if aggregation == "seq-mean-token-sum":
        return masked.sum(-1).sum() / num_seqs
    if aggregation == "seq-mean-token-mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / num_seqs
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def _centred_covariance(advantages: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """cov_t = (A_t - mean A)(log pi_t - mean log pi), means over action tokens; detached."""
    adv, logp = advantages.detach(), logprobs.detach()
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


def _clip_cov_keep(
    cov: Tensor, mask: Tensor, already_clipped: Tensor, config: PolicyLossConfig, generator
) -> Tensor:
    """0 on max(1, int(r N)) random action tokens with low < cov < high, 1 elsewhere.

    Tokens the ratio clip already stopped are not candidates (their gradient is zero anyway).
    """
    keep = torch.ones_like(cov)
    in_band = (cov > config.clip_cov_low) & (cov < config.clip_cov_high)
    candidates = torch.nonzero((mask > 0) & in_band & ~already_clipped)
    if len(candidates):
        count = max(1, int(config.clip_cov_ratio * int(mask.sum())))
        order = torch.randperm(len(candidates), generator=generator, device="cpu")[:count].to(cov.device)
        chosen = candidates[order]
        keep[tuple(chosen.T)] = 0.0
    return keep


def _kl_cov_selected(cov: Tensor, mask: Tensor, config: PolicyLossConfig) -> Tensor:
    """True on the max(1, int(k N)) action tokens with the largest covariance."""
    count = max(1, int(config.kl_cov_ratio * int(mask.sum())))
    scores = cov.masked_fill(mask == 0, float("-inf")).reshape(-1)
    selected = torch.zeros_like(mask, dtype=torch.bool)
    if int(mask.sum()):
        selected.view(-1)[torch.topk(scores, min(count, int(mask.sum()))).indices] = True
    return selected


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    config: PolicyLossConfig | None = None,
    *,
    token_weights: Tensor | None = None,
    entropy: Tensor | None = None,
    normalizer: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate, STARE-weighted after clipping and before aggregation (paper Eq. 8).

    Returns the scalar loss and detached metrics. `token_weights` are STARE's (None = all ones);
    `entropy` [B, T] with grad is needed only when `config.entropy_coef > 0`.
    """
    config = config or PolicyLossConfig()
    mask = action_mask.to(logprobs.dtype)
    advantages = broadcast_advantages(advantages, logprobs).to(logprobs.dtype)

    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    surrogate = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    per_token = torch.maximum(surrogate, clipped)  # PPO clip with asymmetric range
    dual = torch.minimum(per_token, -advantages * config.dual_clip)
    per_token = torch.where(advantages < 0, dual, per_token)  # dual clip bounds negative-advantage tokens

    if config.cov_mode == "clip-cov":
        cov = _centred_covariance(advantages, logprobs, mask)
        per_token = per_token * _clip_cov_keep(cov, mask, clipped > surrogate, config, generator)
    elif config.cov_mode == "kl-cov":  # Cui et al.: unclipped surrogate plus |log-ratio| on top-cov tokens
        cov = _centred_covariance(advantages, logprobs, mask)
        kl_selected = _kl_cov_selected(cov, mask, config)
        per_token = torch.where(kl_selected, surrogate + config.kl_cov_coef * log_ratio.abs(), surrogate)

    if token_weights is not None:
        per_token = per_token * token_weights  # STARE: after clipping, before aggregation, not renormalised

    loss = aggregate(per_token, mask, config.aggregation, normalizer)
    if config.entropy_coef:
        if entropy is None:
            raise ValueError(
                "entropy_coef > 0 needs the per-token `entropy` (with grad) passed to policy_loss"
            )
        loss = loss - config.entropy_coef * aggregate(entropy, mask, config.aggregation, normalizer)

    with torch.no_grad():
        is_clipped = (clipped > surrogate) | ((advantages < 0) & (dual < torch.maximum(surrogate, clipped)))
        metrics = {
            "policy/clipfrac": masked_mean(is_clipped.to(mask.dtype), mask),
            "policy/approx_kl": masked_mean((ratio - 1) - log_ratio, mask),  # k3 estimator of KL(old || new)
            "policy/ratio_mean": masked_mean(ratio, mask),
        }
        if token_weights is not None:
            num_actions = mask.sum().clamp(min=1.0)
            metrics["stare/mean_weight"] = (token_weights * mask).sum() / num_actions
            metrics["stare/frac_weighted"] = ((token_weights != 1) & (mask > 0)).sum() / num_actions
    return loss, metrics
