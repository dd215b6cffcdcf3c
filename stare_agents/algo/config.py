"""Typed configuration of the RL algorithm, with named presets for STARE and the baselines."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Literal, get_args

from stare_agents.algo.advantages import ONE_MEMBER_GROUPS, EntrocraftSwitch, OneMemberGroups
from stare_agents.algo.losses import PolicyLossConfig
from stare_agents.algo.reweighting import REWEIGHTINGS, reweighting_class
from stare_agents.algo.stare import StareConfig


@dataclass
class AlgorithmConfig:
    """Everything that distinguishes one RL algorithm from another in this toolkit.

    Build one with `AlgorithmConfig.preset("stare")` (or "grpo", "grpo-ds", "dapo", "stare-c2",
    "stare-random", "entropy-bonus", "clip-cov", "kl-cov", "entrocraft") and override fields as needed.

    Where each field takes effect: the advantage fields in `compute_advantages`; `loss` in `policy_loss`;
    `stare` (P, W, M, the gate, the scope: the settings of the method `reweighting` names, of its config type)
    in that token reweighting (`stare_agents.algo.reweighting`); `entrocraft` in the learner, on the
    advantages, from the step's pre-update entropy.
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
    # the reweighting's settings, of the config type of the method `reweighting` names; None: no reweighting
    stare: StareConfig | None = field(default_factory=StareConfig)
    # which tokens `stare`'s weights go to: a method of stare_agents.algo.reweighting.REWEIGHTINGS, "stare" (the
    # highest surprisal), "random-tokens" (a control), "phi-negative" (exactly the tokens with Phi < 0) or
    # "phi-negative-random" (its control)
    reweighting: str = "stare"
    entrocraft: EntrocraftSwitch | None = None

    def __post_init__(self) -> None:
        if self.one_member_groups not in ONE_MEMBER_GROUPS:
            raise ValueError(
                f"one_member_groups must be one of {ONE_MEMBER_GROUPS}, got {self.one_member_groups!r}"
            )
        config_type = reweighting_class(self.reweighting).config_type
        if self.stare is not None and type(self.stare) is not config_type:
            self.stare = _as_config(self.stare, config_type, self.reweighting)
        if not (self.std_eps > 0 and self.overlong_cache_length > 0 and self.overlong_factor >= 0):
            raise ValueError(
                f"need std_eps > 0, overlong_cache_length > 0 and overlong_factor >= 0; got "
                f"{self.std_eps=}, {self.overlong_cache_length=}, {self.overlong_factor=}"
            )

    @property
    def reads_all_sampled(self) -> bool:
        """Whether the reweighting's gate reads the entropy over every sampled trajectory of the step."""
        return self.stare is not None and self.stare.reads_all_sampled

    @classmethod
    def field_type(cls, name: str, data: dict[str, Any], base: AlgorithmConfig | None) -> type | None:
        """For the config loader: `stare` holds the settings of the method `reweighting` names (in `data`, else
        in the preset `base`), so it is built as that method's config type; None for the other fields."""
        if name != "stare":
            return None
        method = str(data.get("reweighting", base.reweighting if base is not None else cls.reweighting))
        return REWEIGHTINGS[method].config_type if method in REWEIGHTINGS else None

    @classmethod
    def presets_with(cls, name: str) -> list[str]:
        """The presets whose field `name` is set (not None), for an error that names them."""
        return [preset for preset, make in PRESETS.items() if getattr(make(), name, None) is not None]

    @classmethod
    def preset(cls, name: str) -> AlgorithmConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown algorithm preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name]()


def _as_config(config: Any, cls: type, method: str) -> Any:
    """`config` (another method's settings) as `cls`, the settings of `method`: the fields they share; a
    setting of `config` that `cls` lacks and that is not at its default is an error naming it."""
    own = {f.name for f in fields(cls)}
    for f in fields(config):
        if f.name not in own and f.default is not MISSING and getattr(config, f.name) != f.default:
            raise ValueError(
                f"stare.{f.name}={getattr(config, f.name)!r} is a setting of {type(config).__name__}, which "
                f"reweighting={method!r} does not take; allowed: {', '.join(sorted(own))}"
            )
    return cls(**{f.name: getattr(config, f.name) for f in fields(config) if f.name in own})


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
