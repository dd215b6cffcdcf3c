"""Entropy diagnostics of STARE's analysis (arXiv 2606.19236, Sec. 3).

A policy-gradient step on the logits of one position, dz = eta * A * (onehot(a) - p), changes the
entropy by -eta * A * Phi(p, a) to first order, with

    Phi(p, a) = p_a (log p_a + H) - sum_k p_k^2 (log p_k + H).

Phi > 0 for confident tokens (surprisal below s*) and < 0 for surprising ones (above s*), where s*
solves e^{-s} (H - s) = sum_k p_k^2 (log p_k + H). So positive advantages on surprising tokens raise
the entropy, and on confident tokens they lower it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from stare_agents.algo.logits import token_statistics
from stare_agents.algo.stare import broadcast_advantages
from stare_agents.algo.sums import Sums, figure


def entropy_sensitivity(logits: Tensor, tokens: Tensor, *, chunk_size: int = 1024) -> Tensor:
    """Phi(p, a) for every position of logits [..., V] and tokens [...]."""
    stats = token_statistics(logits, tokens, chunk_size=chunk_size)
    return sensitivity_from_statistics(stats)


def sensitivity_from_statistics(stats: dict[str, Tensor]) -> Tensor:
    """Phi from the output of `token_statistics` (reuses its single pass over the logits)."""
    p_a = stats["logprob"].exp()
    return p_a * (stats["logprob"] + stats["entropy"]) - stats["collision"]


def critical_surprisal(logits: Tensor, *, iterations: int = 60, chunk_size: int = 1024) -> Tensor:
    """s* per position: the surprisal at which Phi changes sign.

    f(s) = e^{-s} (H - s) falls monotonically from H at s = 0 to 0 at s = H, and C = sum p^2 (log p + H)
    lies in [0, H], so the root is unique in [0, H]; it is found by bisection.
    """
    dummy_tokens = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    stats = token_statistics(logits, dummy_tokens, chunk_size=chunk_size)
    entropy, collision = stats["entropy"].double(), stats["collision"].double()
    low, high = torch.zeros_like(entropy), entropy.clone()
    for _ in range(iterations):
        mid = (low + high) / 2
        above = torch.exp(-mid) * (entropy - mid) > collision  # f(mid) > C: root lies to the right
        low = torch.where(above, mid, low)
        high = torch.where(above, high, mid)
    return ((low + high) / 2).float()


QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")  # sign of A, and Phi < 0 (high) or >= 0 (low)


def quadrant_masks(advantages: Tensor, sensitivity: Tensor, action_mask: Tensor) -> dict[str, Tensor]:
    """The action tokens of each quadrant (QUADRANTS), as boolean masks shaped like `sensitivity`."""
    advantages = broadcast_advantages(advantages, sensitivity)
    is_action = action_mask.bool()
    high = sensitivity < 0
    pos, neg = is_action & (advantages > 0), is_action & (advantages < 0)
    return {"pos_high": pos & high, "pos_low": pos & ~high, "neg_high": neg & high, "neg_low": neg & ~high}


def quadrant_counts(advantages: Tensor, sensitivity: Tensor, action_mask: Tensor) -> dict[str, int]:
    """Action tokens by advantage sign and entropy effect.

    "high" surprisal means Phi < 0 (surprisal above s*), "low" means Phi >= 0. Positive-high and
    negative-low tokens raise the entropy under a gradient step; positive-low and negative-high lower it.
    """
    return {
        key: int(mask.sum()) for key, mask in quadrant_masks(advantages, sensitivity, action_mask).items()
    }


@dataclass
class PhiSums(Sums):
    """A step's action tokens by their entropy sensitivity Phi (of the pre-update policy), summed over
    micro-batches and workers: the four quadrants' token counts and Phi masses (the sum of Phi over a
    quadrant's tokens: a tail token's Phi can be 40x a top token's, so counts alone mislead), and the share of
    T+ and of T- tokens with Phi < 0 in successful (reward > 0) and failed trajectories."""

    pos_high: float = figure("quadrant/pos_high", needs="phi")
    pos_low: float = figure("quadrant/pos_low", needs="phi")
    neg_high: float = figure("quadrant/neg_high", needs="phi")
    neg_low: float = figure("quadrant/neg_low", needs="phi")
    pos_high_mass: float = figure("phi_mass/pos_high", needs="phi")
    pos_low_mass: float = figure("phi_mass/pos_low", needs="phi")
    neg_high_mass: float = figure("phi_mass/neg_high", needs="phi")
    neg_low_mass: float = figure("phi_mass/neg_low", needs="phi")
    pos_success: float = 0.0  # T+ tokens of successful trajectories
    pos_success_high: float = figure("phi_neg_share/pos_success", per="pos_success", needs="phi")
    pos_failed: float = 0.0
    pos_failed_high: float = figure("phi_neg_share/pos_failed", per="pos_failed", needs="phi")
    neg_success: float = 0.0
    neg_success_high: float = figure("phi_neg_share/neg_success", per="neg_success", needs="phi")
    neg_failed: float = 0.0
    neg_failed_high: float = figure("phi_neg_share/neg_failed", per="neg_failed", needs="phi")


def phi_sums(advantages: Tensor, sensitivity: Tensor, action_mask: Tensor, rewards: Tensor) -> PhiSums:
    """`PhiSums` of one batch: advantages [B] or [B, T], Phi and the action mask [B, T], rewards [B]."""
    q = quadrant_masks(advantages, sensitivity, action_mask)
    success = (rewards > 0)[:, None].expand_as(sensitivity)
    pos, neg = q["pos_high"] | q["pos_low"], q["neg_high"] | q["neg_low"]
    high = sensitivity < 0

    def count(mask: Tensor) -> float:
        return float(mask.sum())

    def mass(mask: Tensor) -> float:
        return float(sensitivity[mask].double().sum())

    return PhiSums(
        *(count(q[key]) for key in QUADRANTS),
        *(mass(q[key]) for key in QUADRANTS),
        count(pos & success),
        count(pos & success & high),
        count(pos & ~success),
        count(pos & ~success & high),
        count(neg & success),
        count(neg & success & high),
        count(neg & ~success),
        count(neg & ~success & high),
    )


def negative_sensitivity_fraction(selected: Tensor, sensitivity: Tensor) -> float:
    """Fraction of the selected tokens (e.g. STARE's L+) whose Phi < 0; NaN when none is selected.

    The paper reports this rising from ~60% to ~95% over training for L+.
    """
    count = int(selected.sum())
    if count == 0:
        return float("nan")
    return float((sensitivity[selected.bool()] < 0).sum()) / count
