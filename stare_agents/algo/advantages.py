"""Sequence-level advantages: GRPO group normalisation, dynamic sampling, DAPO overlong shaping,
and the Entrocraft sign switch. `compute_advantages` is the trainer's advantage stage: it reads every
advantage field of an `AlgorithmConfig`."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar, get_args

import torch
from torch import Tensor

if TYPE_CHECKING:
    from stare_agents.algo.config import AlgorithmConfig

T = TypeVar("T")
OneMemberGroups = Literal["drop", "keep"]  # AlgorithmConfig.one_member_groups
ONE_MEMBER_GROUPS: tuple[str, ...] = get_args(OneMemberGroups)


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [num_sequences], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of {group_size}: "
            "rollouts of one prompt must be contiguous and every group the same size"
        )
    return rewards.view(-1, group_size)


def group_index(groups: int | Sequence[Hashable], num_sequences: int) -> Tensor:
    """Group number per sequence, numbered in order of first appearance.

    `groups` is a group size (the rollouts of one prompt contiguous, every group that size) or one group
    id per sequence (e.g. `Trajectory.group_id`; any order, any group sizes).
    """
    if isinstance(groups, int):
        if groups < 1 or num_sequences % groups != 0:
            raise ValueError(
                f"{num_sequences} rewards cannot be split into groups of {groups}: "
                "rollouts of one prompt must be contiguous and every group the same size"
            )
        return torch.arange(num_sequences) // groups
    if isinstance(groups, str) or len(groups) != num_sequences:
        raise ValueError(
            f"pass one group id per sequence ({num_sequences}) or an int group size; got {groups!r:.200}"
        )
    numbers: dict[Hashable, int] = {}
    return torch.tensor([numbers.setdefault(g, len(numbers)) for g in groups], dtype=torch.long)


def _group_normalised(rewards: Tensor, index: Tensor, *, normalize_std: bool, eps: float) -> Tensor:
    """(r_i - mean_g r) / (std_g r + eps) with the unbiased std; a one-member group gets 0."""
    num_groups = int(index.max()) + 1 if index.numel() else 0
    counts = torch.bincount(index, minlength=num_groups).to(rewards.dtype)
    mean = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, index, rewards) / counts
    centred = rewards - mean[index]
    if not normalize_std:
        return centred
    squares = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, index, centred * centred)
    std = (squares / (counts - 1).clamp(min=1.0)).sqrt()
    return centred / (std[index] + eps)


def grpo_advantages(
    rewards: Tensor, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO advantage A_i = (r_i - mean_g r) / (std_g r + eps), one value per sequence.

    `rewards` is [num_groups * group_size] with the rollouts of one prompt contiguous. With
    `normalize_std=False` the advantage is only mean-centred (Dr. GRPO). The std is the unbiased one.
    """
    grouped = _groups(rewards.float(), group_size)
    if normalize_std and group_size < 2:
        raise ValueError("std-normalised GRPO advantages need group_size >= 2")
    index = group_index(group_size, grouped.numel())
    return _group_normalised(grouped.reshape(-1), index, normalize_std=normalize_std, eps=eps)


@dataclass(frozen=True)
class GroupFilter:
    """Result of dynamic sampling: which sequences to keep and how many groups were dropped."""

    keep: Tensor  # bool [num_sequences]
    num_groups: int
    dropped_groups: int

    @property
    def kept_groups(self) -> int:
        return self.num_groups - self.dropped_groups


def filter_zero_variance_groups(
    rewards: Tensor, groups: int | Sequence[Hashable], *, atol: float = 0.0
) -> GroupFilter:
    """DAPO dynamic sampling: drop groups whose rewards are all equal (they carry no GRPO signal).

    `groups`: a group size (contiguous groups) or one group id per sequence (see `group_index`).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [num_sequences], got shape {tuple(rewards.shape)}")
    index = group_index(groups, rewards.numel())
    num_groups = int(index.max()) + 1 if index.numel() else 0
    low = torch.full((num_groups,), float("inf")).scatter_reduce(0, index, rewards.float(), "amin")
    high = torch.full((num_groups,), float("-inf")).scatter_reduce(0, index, rewards.float(), "amax")
    keep_group = (high - low) > atol
    return GroupFilter(keep=keep_group[index], num_groups=num_groups, dropped_groups=int((~keep_group).sum()))


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


@dataclass(frozen=True)
class Advantages:
    """The advantage stage's result (see `compute_advantages`)."""

    advantages: Tensor  # [N] float32 per sequence; 0 on the sequences of dropped groups
    rewards: Tensor  # [N] the rewards the advantages came from (after overlong shaping)
    keep: Tensor  # bool [N]: False on the sequences of groups dynamic sampling dropped
    num_groups: int
    dropped_groups: int

    def kept(self, items: Sequence[T]) -> list[T]:
        """The items (e.g. trajectories) of the kept sequences, in order: what the learner trains on."""
        if len(items) != self.keep.numel():
            raise ValueError(f"got {len(items)} items for {self.keep.numel()} sequences")
        return [item for item, keep in zip(items, self.keep.tolist(), strict=True) if keep]


def compute_advantages(
    rewards: Tensor,
    groups: int | Sequence[Hashable],
    config: AlgorithmConfig,
    *,
    response_lengths: Tensor | None = None,
    max_response_length: int | None = None,
) -> Advantages:
    """Rewards -> per-sequence advantages, as `config` says.

    1. `overlong_shaping`: add the DAPO soft overlong penalty (`overlong_cache_length`, `overlong_factor`)
       for `response_lengths` against `max_response_length`.
    2. Group-normalise within each group (`normalize_std`, `std_eps`): GRPO, or Dr. GRPO centring only.
    3. `dynamic_sampling`: mark the groups whose task rewards (before shaping) are all equal as dropped;
       their advantages are 0 and `keep` is False. Train on `result.kept(trajectories)` so they leave the
       loss normaliser too (that is what distinguishes DAPO dynamic sampling from zero advantages).

    A group of one member has no baseline: with `one_member_groups="drop"` its advantage is 0 (r minus its
    own mean) and step 3 drops it; with "keep" (the official code's) its baseline is 0 and its std 1, so
    its advantage is the shaped reward r / (1 + std_eps) (r without `normalize_std`) and step 3 keeps it.

    `groups` is a group size (contiguous groups of equal size) or one group id per sequence.
    """
    rewards = rewards.detach().float()
    if rewards.dim() != 1 or not bool(torch.isfinite(rewards).all()):
        raise ValueError(f"rewards must be a finite 1-D tensor, got shape {tuple(rewards.shape)}: {rewards}")
    index = group_index(groups, rewards.numel())
    shaped = rewards
    if config.overlong_shaping:
        if response_lengths is None or max_response_length is None:
            raise ValueError(
                f"algorithm {config.name!r} has overlong_shaping=True: pass response_lengths and "
                "max_response_length to compute_advantages (or set overlong_shaping=False)"
            )
        penalty = overlong_penalty(
            response_lengths,
            max_response_length,
            min(config.overlong_cache_length, max_response_length),
            factor=config.overlong_factor,
        )
        shaped = rewards + penalty
    advantages = _group_normalised(shaped, index, normalize_std=config.normalize_std, eps=config.std_eps)
    num_groups = int(index.max()) + 1 if index.numel() else 0
    alone = torch.bincount(index, minlength=num_groups)[index] == 1 if num_groups else index.bool()
    if config.one_member_groups == "keep":
        baseline_free = shaped / (1.0 + config.std_eps) if config.normalize_std else shaped
        advantages = torch.where(alone, baseline_free, advantages)
    keep, dropped = torch.ones_like(rewards, dtype=torch.bool), 0
    if config.dynamic_sampling:
        group_filter = filter_zero_variance_groups(rewards, index.tolist())
        keep, dropped = group_filter.keep, group_filter.dropped_groups
        if config.one_member_groups == "keep":
            dropped -= int((alone & ~keep).sum())  # one row per such group
            keep = keep | alone
        advantages = torch.where(keep, advantages, 0.0)
    return Advantages(advantages, shaped, keep, num_groups, dropped)
