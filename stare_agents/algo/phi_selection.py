"""STARE's lever with the exact selection: L+ = the positive-advantage tokens whose entropy sensitivity Phi < 0.

STARE picks L+ by surprisal (the top P of T+) because a surprising token usually has Phi < 0, i.e. pushing it up
raises the entropy (stare_agents.algo.diagnostics). The causal test of that mechanism (issue 47, item 2;
`benchmarks/bench_causal_selection.py`) needs the selection the argument is about, exactly:

    L+ = {t in T+ : Phi_t < 0},   L- = {t in T- : Phi_t < 0}          (`phi_negative_selection`)

and its control, as many tokens of T+ (T-) drawn at random (`PhiNegativeRandom`). Both keep STARE's gate, W and M
(`PhiSelectionConfig` is STARE's settings; P is not used: the set's size is what Phi says). Phi is that of the
policy the step starts from, over the same positions, which the learner computes for its diagnostics: these
methods ask for it (`needs_phi`) and refuse a selection without it. L+/L- are taken over each micro-batch
(scope "micro-batch"; the step-wide scope gathers surprisal only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from stare_agents.algo.random_tokens import SeededDraws
from stare_agents.algo.stare import Stare, StareConfig, broadcast_advantages, stare_selection


@dataclass
class PhiSelectionConfig(StareConfig):
    """STARE's settings (the gate, W, M, the variant) for a selection by the sign of Phi; `top_ratio` unused."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scope != "micro-batch":
            raise ValueError(
                f"stare.scope={self.scope!r}: a selection by Phi is taken over each micro-batch (scope "
                "'micro-batch'), where the learner has Phi; the step-wide scope gathers the surprisal only"
            )


def phi_negative_selection(phi: Tensor, advantages: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Boolean masks (L+, L-): the action tokens with Phi < 0 of T+ (advantage > 0) and of T- (advantage < 0)."""
    if phi.shape != action_mask.shape:
        raise ValueError(f"phi {tuple(phi.shape)} and action_mask {tuple(action_mask.shape)} differ")
    advantages = broadcast_advantages(advantages.detach(), phi)
    raising = action_mask.bool() & (phi.detach() < 0)
    return raising & (advantages > 0), raising & (advantages < 0)


def _needs_phi(name: str, phi: Tensor | None) -> Tensor:
    if phi is None:
        raise ValueError(
            f"reweighting {name!r} selects by Phi and was given none: the learner passes Phi (the pre-update "
            "policy's, per position) to a method whose needs_phi is True; use it with a learner that does"
        )
    return phi


class PhiNegative(Stare):
    """STARE's gate and weights (W on L+, M on L- for C2) on the exact selection `phi_negative_selection`."""

    config_type = PhiSelectionConfig
    needs_phi: ClassVar[bool] = True  # the learner passes `phi` to `selection`

    def __init__(self, config: StareConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config or PhiSelectionConfig(), seed=seed)

    def selection(
        self, surprisal: Tensor, advantages: Tensor, action_mask: Tensor, *, phi: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(L+, L-) over exactly the tensors passed in; `surprisal` is not used, `phi` is required."""
        return phi_negative_selection(_needs_phi("phi-negative", phi), advantages, action_mask)


class PhiNegativeRandom(SeededDraws, PhiNegative):
    """The control: as many tokens of T+ as have Phi < 0 there (and of T-), drawn uniformly at random from T+ (T-),
    from a generator seeded with `seed` and saved with the gate's state."""

    drawn_by = "phi-negative-random"

    def __init__(self, config: StareConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(config, seed=seed)
        self.generator = torch.Generator().manual_seed(seed)

    def selection(
        self, surprisal: Tensor, advantages: Tensor, action_mask: Tensor, *, phi: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        exact = phi_negative_selection(_needs_phi("phi-negative-random", phi), advantages, action_mask)
        scores = torch.rand(phi.shape, generator=self.generator).to(phi.device)
        drawn = []
        for chosen, sign in zip(exact, (1, -1), strict=True):
            candidates = action_mask.bool() & (broadcast_advantages(advantages.detach(), phi) * sign > 0)
            k, n = int(chosen.sum()), int(candidates.sum())
            # the k highest of i.i.d. uniform scores over the candidates: a uniform random k-subset of them
            pick = (
                stare_selection(scores, advantages * sign, action_mask, top_ratio=k / n)[0] if k else chosen
            )
            drawn.append(pick)
        return drawn[0], drawn[1]
