"""The RL algorithm: advantages, STARE weights and entropy gate, policy losses, entropy diagnostics.

Depends on torch only.
"""

from stare_agents.algo.advantages import (
    EntrocraftSwitch,
    GroupFilter,
    filter_zero_variance_groups,
    grpo_advantages,
    overlong_penalty,
)
from stare_agents.algo.config import PRESETS, AlgorithmConfig, StareConfig
from stare_agents.algo.diagnostics import (
    critical_surprisal,
    entropy_sensitivity,
    negative_sensitivity_fraction,
    quadrant_counts,
    sensitivity_from_statistics,
)
from stare_agents.algo.logits import masked_mean, token_entropy, token_logprobs, token_statistics
from stare_agents.algo.losses import PolicyLossConfig, aggregate, policy_loss
from stare_agents.algo.stare import EntropyGate, num_selected, stare_selection, stare_weights

__all__ = [
    "PRESETS",
    "AlgorithmConfig",
    "EntrocraftSwitch",
    "EntropyGate",
    "GroupFilter",
    "PolicyLossConfig",
    "StareConfig",
    "aggregate",
    "critical_surprisal",
    "entropy_sensitivity",
    "filter_zero_variance_groups",
    "grpo_advantages",
    "masked_mean",
    "negative_sensitivity_fraction",
    "num_selected",
    "overlong_penalty",
    "policy_loss",
    "quadrant_counts",
    "sensitivity_from_statistics",
    "stare_selection",
    "stare_weights",
    "token_entropy",
    "token_logprobs",
    "token_statistics",
]
