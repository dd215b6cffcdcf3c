"""Sequence-level advantages: GRPO group normalisation, dynamic sampling, DAPO overlong shaping,
and the Entrocraft sign switch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [num_sequences], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of {group_size}: "
            "rollouts of one prompt must be contiguous and every group the same size"
        )
    return rewards.view(-1, group_size)


def grpo_advantages(
    rewards: Tensor, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO advantage A_i = (r_i - mean_g r) / (std_g r + eps), one value per sequence.

    `rewards` is [num_groups * group_size] with the rollouts of one prompt contiguous. With
    `normalize_std=False` the advantage is only mean-centred (Dr. GRPO). The std is the unbiased one.
    """
    grouped = _groups(rewards.float(), group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std:
        if group_size < 2:
            raise ValueError("std-normalised GRPO advantages need group_size >= 2")
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


@dataclass(frozen=True)
class GroupFilter:
    """Result of dynamic sampling: which sequences to keep and how many groups were dropped."""

    keep: Tensor  # bool [num_sequences]
    num_groups: int
    dropped_groups: int

    @property
    def kept_groups(self) -> int:
        return self.num_groups - self.dropped_groups


def filter_zero_variance_groups(rewards: Tensor, group_size: int, *, atol: float = 0.0) -> GroupFilter:
    """DAPO dynamic sampling: drop groups whose rewards are all equal (they carry no GRPO signal)."""
    grouped = _groups(rewards, group_size)
    spread = grouped.max(dim=1).values - grouped.min(dim=1).values
    keep_group = spread > atol
    return GroupFilter(
        keep=keep_group.repeat_interleave(group_size),
        num_groups=grouped.shape[0],
        dropped_groups=int((~keep_group).sum()),
    )


def overlong_penalty(
    response_lengths: Tensor, max_length: int, cache_length: int, *, factor: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment, added to the task reward.

    0 up to L_max - L_cache tokens, then falling linearly to -factor at L_max, and -factor beyond.
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length <= max_length, got {cache_length=} {max_length=}")
    lengths = response_lengths.float()
    soft_start = max_length - cache_length
    penalty = (soft_start - lengths) / cache_length
    penalty = torch.where(lengths <= soft_start, torch.zeros_like(penalty), penalty)
    return (penalty.clamp(min=-1.0) * factor).to(torch.float32)


@dataclass
class EntrocraftSwitch:
    """Entrocraft advantage switch: keep only positive advantages while entropy is above an upper
    bound (those sharpen the policy), only negative ones while it is below a lower bound (those
    flatten it), all of them in between. Bounds move linearly from their start to their end value
    over `total_steps`."""

    upper_start: float = 0.6
    upper_end: float = 0.4
    lower_start: float = 0.4
    lower_end: float = 0.2
    total_steps: int = 1000

    def bounds(self, step: int) -> tuple[float, float]:
        frac = min(max(step / max(self.total_steps, 1), 0.0), 1.0)
        lower = self.lower_start + frac * (self.lower_end - self.lower_start)
        upper = self.upper_start + frac * (self.upper_end - self.upper_start)
        return lower, upper

    def apply(self, advantages: Tensor, mean_entropy: float, step: int) -> Tensor:
        lower, upper = self.bounds(step)
        if mean_entropy > upper:
            return advantages.clamp(min=0.0)
        if mean_entropy < lower:
            return advantages.clamp(max=0.0)
        return advantages
