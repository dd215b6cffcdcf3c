"""STARE: surprisal-guided token-level advantage reweighting with a closed-loop entropy gate."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from torch import Tensor

Variant = Literal["O1", "C2"]


def num_selected(num_candidates: int, top_ratio: float) -> int:
    """k = max(1, ceil(P * |T|)), or 0 when there is no candidate.

    The product is rounded to 9 decimals first so that e.g. 0.1 * 30 gives 3, not ceil(3.0000000000000004).
    """
    if num_candidates == 0:
        return 0
    return max(1, math.ceil(round(top_ratio * num_candidates, 9)))


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Per-sequence [B] advantages become [B, T]; per-token [B, T] pass through."""
    if advantages.shape == like.shape:
        return advantages
    if advantages.dim() == 1 and like.dim() == 2 and advantages.shape[0] == like.shape[0]:
        return advantages[:, None].expand_as(like)
    raise ValueError(
        f"advantages must be [B] or [B, T] matching surprisal {tuple(like.shape)}, got {tuple(advantages.shape)}"
    )


def _top_surprisal(surprisal: Tensor, candidates: Tensor, top_ratio: float) -> Tensor:
    """Boolean mask of the k = max(1, ceil(P |candidates|)) highest-surprisal candidates."""
    k = num_selected(int(candidates.sum()), top_ratio)
    if k == 0:
        return torch.zeros_like(candidates)
    # non-candidates score -inf, so with k <= |candidates| the top k are all candidates
    scores = torch.where(candidates, surprisal, float("-inf")).reshape(-1)
    return _top_k_mask(scores, k).view_as(candidates)


def _top_k_mask(scores: Tensor, k: int) -> Tensor:
    """Mask of exactly k largest scores (ties at the k-th value broken by position)."""
    threshold, at_or_above = _kth_largest(scores, k)
    selected = scores >= threshold
    if at_or_above > k:
        tied = torch.nonzero(scores == threshold).squeeze(1)
        selected[tied[: at_or_above - k]] = False
    return selected


def _kth_largest(scores: Tensor, k: int, stride: int = 16) -> tuple[Tensor, int]:
    """The k-th largest value and how many scores are >= it, without a full top-k on large inputs.

    A strided sample gives a rough threshold that about 2k scores exceed; when at least k really do,
    the k-th largest lies in that short list and top-k runs on it alone. Otherwise, on everything.
    """
    n = scores.numel()
    if n >= 64 * stride and 4 * k <= n:
        sample = scores[::stride]
        rough = torch.topk(sample, min(sample.numel(), 2 * k // stride + 1), sorted=False).values.min()
        shortlist = scores[scores >= rough]
        if shortlist.numel() >= k:
            kth = torch.topk(shortlist, k, sorted=False).values.min()
            return kth, int((shortlist >= kth).sum())
    kth = torch.topk(scores, k, sorted=False).values.min()
    return kth, int((scores >= kth).sum())


def _validated(
    surprisal: Tensor, advantages: Tensor, action_mask: Tensor, top_ratio: float
) -> tuple[Tensor, Tensor, Tensor]:
    if not 0.0 < top_ratio <= 1.0:
        raise ValueError(f"top_ratio must be in (0, 1], got {top_ratio}")
    if surprisal.shape != action_mask.shape:
        raise ValueError(
            f"surprisal {tuple(surprisal.shape)} and action_mask {tuple(action_mask.shape)} differ"
        )
    surprisal = surprisal.detach().float()
    advantages = advantages.detach()
    if advantages.dim() == 1 and surprisal.dim() == 2 and advantages.shape[0] == surprisal.shape[0]:
        advantages = advantages[:, None]  # per-sequence: compare [B] once, broadcast the comparison
    else:
        advantages = broadcast_advantages(advantages, surprisal)
    return surprisal, advantages, action_mask.bool()


def stare_selection(
    surprisal: Tensor, advantages: Tensor, action_mask: Tensor, *, top_ratio: float = 0.1
) -> tuple[Tensor, Tensor]:
    """Boolean masks (L+, L-): the max(1, ceil(P |T|)) highest-surprisal tokens of T+ and of T-.

    T+ / T- are the action tokens with advantage > 0 / < 0. The sets are taken over exactly the
    tensor passed in. Zero-advantage, prompt, padding and observation tokens are never selected.
    """
    surprisal, advantages, is_action = _validated(surprisal, advantages, action_mask, top_ratio)
    top_pos = _top_surprisal(surprisal, is_action & (advantages > 0), top_ratio)
    top_neg = _top_surprisal(surprisal, is_action & (advantages < 0), top_ratio)
    return top_pos, top_neg


def stare_weights(
    surprisal: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    variant: Variant = "O1",
    top_ratio: float = 0.1,
    w: float = 1.1,
    m: float = 0.9,
) -> Tensor:
    """STARE token weights (arXiv 2606.19236, Eq. 7): 1 everywhere, `w` on L+, and `m` on L- (variant C2).

    See `stare_selection` for L+ / L-. The weights multiply the clipped per-token surrogate and are
    not renormalised.
    """
    if variant not in ("O1", "C2"):
        raise ValueError(
            f"unknown STARE variant {variant!r}; use 'O1' (amplify L+) or 'C2' (also attenuate L-)"
        )
    surprisal, advantages, is_action = _validated(surprisal, advantages, action_mask, top_ratio)
    signs = ((1, w), (-1, m)) if variant == "C2" else ((1, w),)
    weights = torch.ones_like(surprisal)
    if advantages.shape[-1] == 1 and surprisal.dim() == 2:
        # per-sequence advantages: T+ (T-) lies in the rows with A > 0 (< 0); rank only those rows
        for sign, value in signs:
            rows = torch.nonzero(advantages[:, 0] * sign > 0).squeeze(1)
            if rows.numel():
                top = _top_surprisal(
                    surprisal.index_select(0, rows), is_action.index_select(0, rows), top_ratio
                )
                weights.index_copy_(0, rows, torch.where(top, value, 1.0))
        return weights
    for sign, value in signs:
        weights = torch.where(
            _top_surprisal(surprisal, is_action & (advantages * sign > 0), top_ratio), value, weights
        )
    return weights


@dataclass
class EntropyGate:
    """Closed-loop gate: STARE reweighting is on iff the batch mean entropy < target (strict).

    Evaluated once per training step from the pre-update policy's token-mean entropy over action
    tokens. With `adaptive=True` the weights also follow the entropy error each step:
    w += alpha * sign(H_tgt - H) clipped to [1, w_max], m -= alpha * sign(H_tgt - H) clipped to [m_min, 1].
    """

    target_entropy: float = 0.3
    w: float = 1.1
    m: float = 0.9
    adaptive: bool = False
    alpha: float = 0.01
    w_max: float = 1.5
    m_min: float = 0.5
    active: bool = False

    def update(self, batch_mean_entropy: float) -> bool:
        entropy = float(batch_mean_entropy)
        if not math.isfinite(entropy):
            raise ValueError(f"batch mean entropy must be finite, got {entropy}")
        self.active = entropy < self.target_entropy
        if self.adaptive:
            direction = (
                math.copysign(1.0, self.target_entropy - entropy) if entropy != self.target_entropy else 0.0
            )
            self.w = min(max(self.w + self.alpha * direction, 1.0), self.w_max)
            self.m = min(max(self.m - self.alpha * direction, self.m_min), 1.0)
        return self.active

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)
