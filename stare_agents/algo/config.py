"""Typed configuration of the RL algorithm, with named presets for STARE and the baselines."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from stare_agents.algo.advantages import EntrocraftSwitch
from stare_agents.algo.losses import PolicyLossConfig

STARE_VARIANTS = ("O1", "C2")
STARE_SCOPES = ("micro-batch", "batch")


@dataclass
class StareConfig:
    """STARE token reweighting. Defaults are the official release's (O1, P = 10%, W = 1.1, M = 0.9, H_tgt = 0.3)."""

    variant: str = "O1"
    top_ratio: float = 0.1
    w: float = 1.1
    m: float = 0.9
    target_entropy: float = 0.3
    gated: bool = True  # False: reweight every step (open loop)
    adaptive: bool = False  # adapt w / m by alpha * sign(H_tgt - H) each step
    alpha: float = 0.01
    w_max: float = 1.5
    m_min: float = 0.5
    # where L+/L- are taken: each micro-batch (the official code) or the whole step batch (the paper's reading)
    scope: str = "micro-batch"

    def __post_init__(self) -> None:
        if self.variant not in STARE_VARIANTS:
            raise ValueError(f"stare.variant must be one of {STARE_VARIANTS}, got {self.variant!r}")
        if self.scope not in STARE_SCOPES:
            raise ValueError(f"stare.scope must be one of {STARE_SCOPES}, got {self.scope!r}")
        if not 0 < self.top_ratio <= 1:
            raise ValueError(f"stare.top_ratio must be in (0, 1], got {self.top_ratio}")


@dataclass
class AlgorithmConfig:
    """Everything that distinguishes one RL algorithm from another in this toolkit.

    Build one with `AlgorithmConfig.preset("stare")` (or "grpo", "grpo-ds", "dapo", "stare-c2",
    "entropy-bonus", "clip-cov", "kl-cov", "entrocraft") and override fields as needed.
    """

    name: str = "stare"
    normalize_std: bool = True  # GRPO advantage divided by the group std (False: Dr. GRPO centring only)
    std_eps: float = 1e-6
    dynamic_sampling: bool = True  # drop groups whose rewards are all equal (DAPO)
    overlong_shaping: bool = False  # DAPO soft overlong punishment
    overlong_cache_length: int = 256
    overlong_factor: float = 1.0
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    stare: StareConfig | None = field(default_factory=StareConfig)
    entrocraft: EntrocraftSwitch | None = None

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


PRESETS = {
    "grpo": _grpo,
    "grpo-ds": _grpo_ds,
    "dapo": lambda: _with(_grpo_ds, "dapo", overlong_shaping=True),
    "stare": lambda: AlgorithmConfig(name="stare"),
    "stare-c2": lambda: AlgorithmConfig(name="stare-c2", stare=StareConfig(variant="C2")),
    "entropy-bonus": lambda: _with(_grpo_ds, "entropy-bonus", loss=PolicyLossConfig(entropy_coef=1e-3)),
    "clip-cov": lambda: _with(_grpo_ds, "clip-cov", loss=PolicyLossConfig(cov_mode="clip-cov")),
    "kl-cov": lambda: _with(_grpo_ds, "kl-cov", loss=PolicyLossConfig(cov_mode="kl-cov")),
    "entrocraft": lambda: _with(_grpo_ds, "entrocraft", entrocraft=EntrocraftSwitch()),
}
