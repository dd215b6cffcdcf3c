"""A control for STARE: the same gate, P, W and M, but L+ / L- drawn at random from T+ / T-.

STARE's claim is that *which* tokens are reweighted matters (the high-surprisal ones, whose entropy
sensitivity Phi is negative). This control reweights as many tokens of the same advantage sign, chosen
uniformly at random, so that a difference between the two runs is the selection's and not the weights'.
Preset `stare-random` (`rl.algorithm=stare-random`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from stare_agents.algo.stare import Stare, StareConfig, stare_selection


@dataclass
class RandomTokensConfig(StareConfig):
    """The control's settings: STARE's own (P, W, M, the gate, the scope), so that the two runs differ in the
    selection alone. Its random generator is seeded from the learner's `seed`."""


class SeededDraws:
    """A reweighting that draws its tokens at random: its generator (`self.generator`, seeded by the method) is
    saved and restored with the gate's state, so a resumed run draws what the uninterrupted one would have."""

    drawn_by: ClassVar[str]  # the method's name, for the error a checkpoint without a generator gets
    generator: torch.Generator

    def state_dict(self) -> dict:
        return {**super().state_dict(), "generator": self.generator.get_state()}  # type: ignore[misc]

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)  # type: ignore[misc]
        if "generator" not in state:
            raise ValueError(
                f"the checkpoint's reweighting state has no random generator: it was not written by "
                f"{self.drawn_by} (resume with the method the checkpoint was trained with)"
            )
        self.generator.set_state(state["generator"])


class RandomTokens(SeededDraws, Stare):
    """STARE's gate and weights over a random selection: k = max(1, ceil(P |T+|)) tokens of T+ uniformly at
    random (and of T- for variant C2), from a generator seeded with `seed` and saved with the gate's state."""

    config_type = RandomTokensConfig
    drawn_by = "the random-token control"

    def __init__(self, config: StareConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config or RandomTokensConfig(), seed=seed)
        self.generator = torch.Generator().manual_seed(seed)

    def selection(self, surprisal: Tensor, advantages: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
        # the k highest of i.i.d. uniform scores over the candidates are a uniform random k-subset of them
        scores = torch.rand(surprisal.shape, generator=self.generator).to(surprisal.device)
        return stare_selection(scores, advantages, action_mask, top_ratio=self.config.top_ratio)
