"""The entropy-control baselines' per-token terms that change the clipped surrogate: Clip-Cov and KL-Cov
(Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models").

Both look at the centred covariance cov_t = (A_t - mean A)(log pi_t - mean log pi) over the action tokens
of the tensor passed in (a micro-batch in the learner). Clip-Cov drops the gradient of a few random
tokens whose covariance lies in a band; KL-Cov replaces the surrogate of the top-covariance tokens by the
unclipped surrogate plus a |log-ratio| penalty. The entropy bonus is `losses.entropy_bonus`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from stare_agents.algo.logits import masked_mean

if TYPE_CHECKING:
    from stare_agents.algo.losses import PolicyLossConfig


def centred_covariance(advantages: Tensor, logprobs: Tensor, action_mask: Tensor) -> Tensor:
    """cov_t = (A_t - mean A)(log pi_t - mean log pi), means over action tokens; detached."""
    mask = (action_mask > 0).to(logprobs.dtype)
    adv, logp = advantages.detach(), torch.where(action_mask > 0, logprobs.detach(), 0.0)
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


def clip_cov_keep(
    advantages: Tensor,
    logprobs: Tensor,
    action_mask: Tensor,
    already_stopped: Tensor,
    config: PolicyLossConfig,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Clip-Cov: 0 on max(1, int(r N)) random action tokens with low < cov < high, 1 elsewhere.

    Tokens the ratio clip already stopped are not candidates (their gradient is zero anyway).
    """
    cov = centred_covariance(advantages, logprobs, action_mask)
    keep = torch.ones_like(cov)
    in_band = (cov > config.clip_cov_low) & (cov < config.clip_cov_high)
    candidates = torch.nonzero((action_mask > 0) & in_band & ~already_stopped)
    if len(candidates):
        count = max(1, int(config.clip_cov_ratio * int((action_mask > 0).sum())))
        order = torch.randperm(len(candidates), generator=generator, device="cpu")[:count].to(cov.device)
        keep[tuple(candidates[order].T)] = 0.0
    return keep


def kl_cov_per_token(
    advantages: Tensor,
    logprobs: Tensor,
    log_ratio: Tensor,
    ratio: Tensor,
    action_mask: Tensor,
    config: PolicyLossConfig,
) -> Tensor:
    """KL-Cov: the unclipped surrogate -A r, plus coef * |log-ratio| on the max(1, int(k N)) action tokens
    with the largest covariance."""
    unclipped = -advantages * ratio
    num_actions = int((action_mask > 0).sum())
    if num_actions == 0:
        return unclipped
    cov = centred_covariance(advantages, logprobs, action_mask)
    count = min(max(1, int(config.kl_cov_ratio * num_actions)), num_actions)
    scores = cov.masked_fill(action_mask == 0, float("-inf")).reshape(-1)
    selected = torch.zeros_like(cov, dtype=torch.bool)
    selected.view(-1)[torch.topk(scores, count).indices] = True
    return torch.where(selected, unclipped + config.kl_cov_coef * log_ratio.abs(), unclipped)
