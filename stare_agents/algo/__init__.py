"""The RL algorithm: advantages, STARE weights and entropy gate, policy losses, entropy diagnostics.

Depends on torch only.
"""

from stare_agents.algo.advantages import (
    Advantages,
    EntrocraftSwitch,
    GroupFilter,
    compute_advantages,
    filter_zero_variance_groups,
    group_index,
    grpo_advantages,
    overlong_penalty,
)
from stare_agents.algo.baselines import centred_covariance, clip_cov_keep, kl_cov_per_token
from stare_agents.algo.config import PRESETS, AlgorithmConfig
from stare_agents.algo.diagnostics import (
    critical_surprisal,
    entropy_sensitivity,
    negative_sensitivity_fraction,
    quadrant_counts,
    sensitivity_from_statistics,
)
from stare_agents.algo.logits import masked_mean, token_entropy, token_logprobs, token_statistics
from stare_agents.algo.losses import (
    LOG_RATIO_LIMIT,
    PolicyLossConfig,
    aggregate,
    clipped_surrogate,
    entropy_bonus,
    loss_normalizer,
    policy_loss,
)
from stare_agents.algo.stare import (
    EntropyGate,
    Stare,
    StareConfig,
    num_selected,
    stare_selection,
    stare_weights,
    weights_from_selection,
)

__all__ = [
    "LOG_RATIO_LIMIT",
    "PRESETS",
    "Advantages",
    "AlgorithmConfig",
    "EntrocraftSwitch",
    "EntropyGate",
    "GroupFilter",
    "PolicyLossConfig",
    "Stare",
    "StareConfig",
    "aggregate",
    "centred_covariance",
    "clip_cov_keep",
    "clipped_surrogate",
    "compute_advantages",
    "critical_surprisal",
    "entropy_bonus",
    "entropy_sensitivity",
    "filter_zero_variance_groups",
    "group_index",
    "grpo_advantages",
    "kl_cov_per_token",
    "loss_normalizer",
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
    "weights_from_selection",
]
