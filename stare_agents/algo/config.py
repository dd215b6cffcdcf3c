"""Typed configuration of the RL algorithm, with named presets for STARE and the baselines."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from stare_agents.algo.advantages import ONE_MEMBER_GROUPS, EntrocraftSwitch, OneMemberGroups
from stare_agents.algo.losses import PolicyLossConfig
from stare_agents.algo.reweighting import REWEIGHTINGS, ReweightingName
from stare_agents.algo.stare import StareConfig


@dataclass
class AlgorithmConfig:
    """Everything that distinguishes one RL algorithm from another in this toolkit.

    Build one with `AlgorithmConfig.preset("stare")` (or "grpo", "grpo-ds", "dapo", "stare-c2",
    "stare-random", "entropy-bonus", "clip-cov", "kl-cov", "entrocraft") and override fields as needed.

    Where each field takes effect: the advantage fields in `compute_advantages`; `loss` in `policy_loss`;
    `stare` (P, W, M and the gate) in the token reweighting that `reweighting` names
    (`stare_agents.algo.reweighting`; its `scope` in the learner, which takes L+/L- per micro-batch or per step);
    `entrocraft` in the learner, on the advantages, from the step's pre-update entropy.
    """

    name: str = "stare"
    normalize_std: bool = True  # GRPO advantage divided by the group std (False: Dr. GRPO centring only)
    std_eps: float = 1e-6
    dynamic_sampling: bool = True  # drop groups whose rewards are all equal (DAPO)
    # a group with one member (e.g. the others failed): "drop" (advantage 0, and dynamic sampling drops it as a
    # group without variance) or "keep" (the official code's: advantage r / (1 + std_eps), or r without
    # normalize_std, i.e. mean 0 and std 1, and dynamic sampling keeps it)
    one_member_groups: OneMemberGroups = "drop"
    overlong_shaping: bool = False  # DAPO soft overlong punishment
    overlong_cache_length: int = 256
    overlong_factor: float = 1.0
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    stare: StareConfig | None = field(default_factory=StareConfig)  # None: no reweighting
    # which tokens `stare`'s weights go to: "stare" (the highest surprisal) or "random-tokens" (a control)
    reweighting: ReweightingName = "stare"
    entrocraft: EntrocraftSwitch | None = None

    def __post_init__(self) -> None:
        if self.one_member_groups not in ONE_MEMBER_GROUPS:
            raise ValueError(
                f"one_member_groups must be one of {ONE_MEMBER_GROUPS}, got {self.one_member_groups!r}"
            )
        if self.reweighting not in REWEIGHTINGS:
            raise ValueError(f"reweighting must be one of {tuple(REWEIGHTINGS)}, got {self.reweighting!r}")
        if not (self.std_eps > 0 and self.overlong_cache_length > 0 and self.overlong_factor >= 0):
            raise ValueError(
                f"need std_eps > 0, overlong_cache_length > 0 and overlong_factor >= 0; got "
                f"{self.std_eps=}, {self.overlong_cache_length=}, {self.overlong_factor=}"
            )

    @classmethod
    def preset(cls, name: str) -> AlgorithmConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown algorithm preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name]()


def _grpo() -> AlgorithmConfig:
    """GRPO (DeepSeekMath): symmetric clip 0.2, sequence-mean of token means, no filtering."""
    return AlgorithmConfig(
        name="grpo",
        dynamic_sampling=False,
        loss=PolicyLossConfig(clip_high=0.2, aggregation="seq-mean-token-mean"),
        stare=None,
    )


def _grpo_ds() -> AlgorithmConfig:
    """GRPO with dynamic sampling, clip-higher (0.28) and token-mean aggregation."""
    return AlgorithmConfig(name="grpo-ds", stare=None)


def _with(base, name: str, **changes) -> AlgorithmConfig:
    return replace(base(), name=name, **changes)


AlgorithmName = Literal[
    "stare",
    "stare-c2",
    "stare-random",
    "grpo",
    "grpo-ds",
    "dapo",
    "entropy-bonus",
    "clip-cov",
    "kl-cov",
    "entrocraft",
]
ALGORITHMS: tuple[str, ...] = get_args(AlgorithmName)  # the presets' names (rl.algorithm, --compare)

PRESETS = {
    "grpo": _grpo,
    "grpo-ds": _grpo_ds,
    "dapo": lambda: _with(_grpo_ds, "dapo", overlong_shaping=True),
    "stare": lambda: AlgorithmConfig(name="stare"),
    "stare-c2": lambda: AlgorithmConfig(name="stare-c2", stare=StareConfig(variant="C2")),
    "stare-random": lambda: AlgorithmConfig(name="stare-random", reweighting="random-tokens"),
    "entropy-bonus": lambda: _with(_grpo_ds, "entropy-bonus", loss=PolicyLossConfig(entropy_coef=1e-3)),
    "clip-cov": lambda: _with(_grpo_ds, "clip-cov", loss=PolicyLossConfig(cov_mode="clip-cov")),
    "kl-cov": lambda: _with(_grpo_ds, "kl-cov", loss=PolicyLossConfig(cov_mode="kl-cov")),
    "entrocraft": lambda: _with(_grpo_ds, "entrocraft", entrocraft=EntrocraftSwitch()),
}
assert set(PRESETS) == set(ALGORITHMS), "AlgorithmName and PRESETS name the same presets"
