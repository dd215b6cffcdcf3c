"""The learner's token-reweighting seam: what a method such as STARE is asked for, and the table of methods.

    reweighting = build_reweighting(algorithm.reweighting, algorithm.stare, seed=0)   # None: no reweighting
    on = reweighting.update(reweighting.gate_entropy(trained_entropy, sampled_entropy))  # once per step
    top_pos, top_neg = reweighting.selection(surprisal, advantages, action_mask)       # per micro-batch
    weights = reweighting.weights_from_selection(top_pos, top_neg)                     # all ones while off
    metrics.update(reweighting.figures())

The learner holds a `TokenReweighting` and never names a method. A new method is a file in this folder with a
class that has these members, a line in `REWEIGHTINGS` and a preset in `config.py` (see `random_tokens.py`).
Its figures keep the `stare/` names (`REWEIGHTING_FIGURES`) so that every method's runs read alike in
metrics.jsonl, the plots and the viewer.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol, get_args

from torch import Tensor

from stare_agents.algo.random_tokens import RandomTokens
from stare_agents.algo.stare import Stare, StareConfig

# the figures a reweighting gives each step (the learner adds stare/gate_on and the L+/L- shares)
REWEIGHTING_FIGURES = ("stare/gate_input", "stare/w", "stare/m", "stare/target_entropy", "stare/gate_skipped")
# what a step without a reweighting reports: weights of 1 and no gate
NO_REWEIGHTING = {
    "stare/gate_input": math.nan,
    "stare/w": 1.0,
    "stare/m": 1.0,
    "stare/target_entropy": math.nan,
    "stare/gate_skipped": 0.0,
}


class TokenReweighting(Protocol):
    """Token weights that multiply the clipped surrogate, switched by a gate on the policy's entropy."""

    config: StareConfig
    reweighting: bool  # whether the current step is reweighted (after this step's `update`)

    def gate_entropy(self, trained: float, sampled: float | None = None) -> float:
        """What the gate reads this step (the trained batch's entropy, every sampled trajectory's, ...)."""
        ...

    def update(self, entropy: float) -> bool:
        """Move the gate once per step; returns whether this step is reweighted."""
        ...

    def selection(self, surprisal: Tensor, advantages: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Boolean masks (L+, L-) of the tokens to up- and down-weight, over exactly the tensors passed in."""
        ...

    def weights_from_selection(self, top_pos: Tensor, top_neg: Tensor) -> Tensor:
        """The token weights for a selection (all ones while the step is not reweighted)."""
        ...

    def figures(self) -> dict[str, float]:
        """REWEIGHTING_FIGURES, as they stand after this step's update."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


ReweightingName = Literal["stare", "random-tokens"]
REWEIGHTINGS = {
    "stare": Stare,  # the highest-surprisal tokens of T+ (and T-)
    "random-tokens": RandomTokens,  # control: as many tokens of T+ (and T-), drawn at random
}
assert set(REWEIGHTINGS) == set(get_args(ReweightingName)), "ReweightingName and REWEIGHTINGS name the same"


def build_reweighting(name: str, config: StareConfig | None, *, seed: int = 0) -> TokenReweighting | None:
    """The reweighting `name` with `config` (P, W, M, the gate), or None when `config` is None."""
    if name not in REWEIGHTINGS:
        raise ValueError(f"reweighting={name!r}: allowed: {', '.join(REWEIGHTINGS)}")
    if config is None:
        return None
    return REWEIGHTINGS[name](config, seed=seed)


def diagnostic_selector(reweighting: TokenReweighting | None) -> TokenReweighting:
    """What selects L+/L- for the diagnostics: the run's reweighting, or (algorithms without one) the tokens
    STARE's defaults would take."""
    return reweighting if reweighting is not None else Stare(StareConfig())
