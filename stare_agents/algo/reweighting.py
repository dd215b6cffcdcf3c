"""The learner's token-reweighting seam: everything STARE-shaped a training step asks, and the table of methods.

    reweighting = StepReweighting.build(algorithm, seed=0, diagnostics=True)  # a method of REWEIGHTINGS, or none
    reweighting.reads_all_sampled                        # does the gate read every sampled trajectory's entropy?
    on = reweighting.gate(trained_entropy, all_entropy, measured=True)           # once per step
    selections = reweighting.step_selection(surprisal, advantages, masks, collective, device)  # scope "batch"
    top_pos, top_neg, weights = reweighting.select(surprisal, advantages, action_mask, selection)  # a micro-batch
    sums = reweighting.sums(top_pos, top_neg, ...)       # L+/L-, their mismatch, the Phi quadrants (ReweightingSums)
    metrics.update(reweighting.figures())                # stare/gate_on and the method's gate figures

A method (`TokenReweighting`) is a class with a config type of its own (`config_type`: its knobs are the keys
under `rl.stare`); a new one is a file in this folder, a line in `REWEIGHTINGS` and, if wanted, a preset in
`config.py` (see `random_tokens.py`; `tests/train/test_new_reweighting.py` adds one with a knob of its own and trains
with it without touching `train/`). Its figures keep the `stare/` names (`REWEIGHTING_FIGURES`), so every
method's runs read alike in metrics.jsonl, the plots and the viewer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from stare_agents.algo.diagnostics import PhiSums, phi_sums
from stare_agents.algo.phi_selection import PhiNegative, PhiNegativeRandom
from stare_agents.algo.random_tokens import RandomTokens
from stare_agents.algo.stare import Scope, Stare, StareConfig
from stare_agents.algo.sums import Sums, figure

# the figures a method gives each step (StepReweighting adds stare/gate_on; the L+/L- shares are sums)
REWEIGHTING_FIGURES = ("stare/gate_input", "stare/w", "stare/m", "stare/target_entropy", "stare/gate_skipped")
# what a step without a reweighting reports: weights of 1 and no gate
NO_REWEIGHTING = {
    "stare/gate_input": math.nan,
    "stare/w": 1.0,
    "stare/m": 1.0,
    "stare/target_entropy": math.nan,
    "stare/gate_skipped": 0.0,
}


class ReweightingConfig(Protocol):
    """What the learner reads of a method's config (its other knobs are the method's own)."""

    scope: Scope  # L+/L- over each micro-batch or over the step batch

    @property
    def reads_all_sampled(self) -> bool:
        """Whether the gate reads the entropy over every sampled trajectory of the step."""
        ...


class TokenReweighting(Protocol):
    """Token weights that multiply the clipped surrogate, switched by a gate on the policy's entropy."""

    config_type: ClassVar[
        type
    ]  # the method's settings (`rl.stare`): a dataclass with ReweightingConfig's members
    config: Any
    reweighting: bool  # whether the current step is reweighted (after this step's `update`)
    # a method that selects by the entropy sensitivity Phi sets this: the learner then computes Phi every step and
    # passes it to `selection` as `phi=` (stare_agents.algo.phi_selection)
    needs_phi: ClassVar[bool]

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


# the methods `rl.reweighting` names (an open table, as Gymnasium's registry: a new method is a line here)
REWEIGHTINGS: dict[str, type[TokenReweighting]] = {
    "stare": Stare,  # the highest-surprisal tokens of T+ (and T-)
    "random-tokens": RandomTokens,  # control: as many tokens of T+ (and T-), drawn at random
    "phi-negative": PhiNegative,  # exactly the tokens of T+ (and T-) with Phi < 0 (the causal test's selection)
    "phi-negative-random": PhiNegativeRandom,  # control: as many tokens of T+ (and T-) as that, drawn at random
}


def reweighting_class(name: str) -> type[TokenReweighting]:
    """The method `name` names, or a ValueError naming the allowed ones and the nearest."""
    if name not in REWEIGHTINGS:
        import difflib

        near = difflib.get_close_matches(str(name), list(REWEIGHTINGS), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"reweighting={name!r}: allowed: {', '.join(REWEIGHTINGS)}{hint}")
    return REWEIGHTINGS[name]


def build_reweighting(name: str, config: Any, *, seed: int = 0) -> TokenReweighting | None:
    """The reweighting `name` with `config` (its config type's settings), or None when `config` is None."""
    cls = reweighting_class(name)
    return None if config is None else cls(config, seed=seed)


class Gather(Protocol):
    """The learner's collective, as far as a step-wide selection needs it."""

    rank: int

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """1-D tensors of any length from every worker, in rank order."""
        ...


@dataclass
class SelectionSums(Sums):
    """L+ and L- of a step, summed over micro-batches and workers: their sizes, how many L+ tokens have Phi < 0
    (the paper reports this share rising from ~60% to ~95%), and the rollout/learner mismatch on each (the
    highest-surprisal tokens are where a bf16 mismatch concentrates: compare with mismatch/logprob_abs_diff)."""

    lplus: float = figure("stare/lplus_share", per="action_tokens", needs="selection")
    lminus: float = figure("stare/lminus_share", per="action_tokens", needs="selection")
    lplus_negative_phi: float = figure("stare/lplus_negative_phi", per="lplus", needs="phi")
    lplus_abs_diff: float = figure("mismatch/lplus_abs_diff", per="lplus", needs="selection")
    lminus_abs_diff: float = figure("mismatch/lminus_abs_diff", per="lminus", needs="selection")


@dataclass
class ReweightingSums(Sums):
    """What a micro-batch adds to a step's STARE figures: its selection and its Phi quadrants."""

    selection: SelectionSums = field(default_factory=SelectionSums)
    phi: PhiSums = field(default_factory=PhiSums)


class StepReweighting:
    """Everything STARE-shaped a learner's step asks, for any method or none (see the module docstring).

    Without a method the step is never reweighted, and L+/L- (for the diagnostics, `diagnostics=True`) are
    the tokens STARE's defaults would take."""

    def __init__(self, method: TokenReweighting | None, *, diagnostics: bool = True) -> None:
        self.method = method
        self.selector: TokenReweighting = method if method is not None else Stare(StareConfig())
        self.diagnostics = diagnostics
        self.on = False  # whether the current step is reweighted

    @classmethod
    def build(cls, algorithm: Any, *, seed: int = 0, diagnostics: bool = True) -> StepReweighting:
        """From an AlgorithmConfig: the method `algorithm.reweighting` names with `algorithm.stare`."""
        return cls(
            build_reweighting(algorithm.reweighting, algorithm.stare, seed=seed), diagnostics=diagnostics
        )

    @property
    def reads_all_sampled(self) -> bool:
        return self.method is not None and self.method.config.reads_all_sampled

    @property
    def scope(self) -> Scope:
        return self.method.config.scope if self.method is not None else "micro-batch"

    @property
    def needs_phi(self) -> bool:
        """Whether `select` needs the pre-update policy's Phi (the method selects by it)."""
        return bool(getattr(self.selector, "needs_phi", False))

    @property
    def gate_on(self) -> bool | None:
        """Whether the last step was reweighted (None without a method)."""
        return self.method.reweighting if self.method is not None else None

    @property
    def measured(self) -> set[str]:
        """What this step's sums measure: "selection" (L+/L-: reweighted or diagnostics), "phi" (diagnostics, or a
        method that selects by Phi, for which the learner computes it anyway)."""
        measured = {"selection", "phi"} if self.diagnostics else {"selection"} if self.on else set()
        return measured | {"phi"} if self.needs_phi else measured

    def gate(self, trained: float, sampled: float, *, measured: bool) -> bool:
        """Once per step, before its updates: the gate reads `trained` (the pre-update entropy of the trained
        batch, aggregated like the loss) or `sampled` (the token mean over every sampled trajectory), as the
        method's config says, and moves; a step whose entropy was not `measured` (no action tokens) keeps the
        gate's state. Returns whether the step is reweighted."""
        if self.method is None:
            self.on = False
            return False
        value = self.method.gate_entropy(trained, sampled if self.reads_all_sampled else None)
        self.on = self.method.update(value) if measured else self.method.reweighting
        return self.on

    def step_selection(
        self,
        surprisal: list[Tensor],
        advantages: list[Tensor],
        masks: list[Tensor],
        collective: Gather,
        device: torch.device,
    ) -> list[tuple[Tensor, Tensor]] | None:
        """Scope "batch": L+/L- of each micro-batch, chosen over the whole step batch (every worker's micro-batches,
        gathered through `collective`) from the pre-update surprisal; None for scope "micro-batch"."""
        if self.scope != "batch":
            return None
        local_s = [s[m] for s, m in zip(surprisal, masks, strict=True)]
        local_a = [
            (a[:, None].expand_as(m) if a.dim() == 1 else a)[m]
            for a, m in zip(advantages, masks, strict=True)
        ]
        empty = torch.zeros(0, device=device)
        all_s = collective.all_gather(torch.cat(local_s) if local_s else empty)
        all_a = collective.all_gather(torch.cat(local_a) if local_a else empty)
        offset = sum(t.numel() for t in all_s[: collective.rank])
        everything = torch.cat(all_s)[None]
        top_pos, top_neg = self.selector.selection(
            everything, torch.cat(all_a)[None], torch.ones_like(everything)
        )
        out = []
        for m in masks:
            n = int(m.sum())
            pos, neg = torch.zeros_like(m), torch.zeros_like(m)
            pos[m], neg[m] = top_pos[0, offset : offset + n], top_neg[0, offset : offset + n]
            out.append((pos, neg))
            offset += n
        return out

    def select(
        self,
        surprisal: Tensor,
        advantages: Tensor,
        action_mask: Tensor,
        selection: tuple[Tensor, Tensor] | None = None,
        *,
        phi: Tensor | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """(L+, L-, weights) of one micro-batch: the step-wide `selection` when there is one, else taken over the
        micro-batch from `surprisal` (the current policy's), or from `phi` (the pre-update policy's) for a method
        that `needs_phi`, when the step is reweighted or diagnosed (None otherwise); weights None while the step
        is not reweighted."""
        top_pos = top_neg = None
        if selection is not None:
            top_pos, top_neg = selection
        elif self.on or self.diagnostics:
            if self.needs_phi:  # the method refuses phi=None with a message naming it
                top_pos, top_neg = self.selector.selection(surprisal, advantages, action_mask, phi=phi)
            else:
                top_pos, top_neg = self.selector.selection(surprisal, advantages, action_mask)
        weights = self.method.weights_from_selection(top_pos, top_neg) if self.on and self.method else None
        return top_pos, top_neg, weights

    def sums(
        self,
        top_pos: Tensor | None,
        top_neg: Tensor | None,
        *,
        advantages: Tensor,
        action_mask: Tensor,
        rewards: Tensor,
        phi: Tensor | None,
        abs_log_ratio: Tensor,
    ) -> ReweightingSums:
        """One micro-batch's ReweightingSums: L+/L- sizes and mismatch (`abs_log_ratio`: |log pi_old - log
        pi_rollout| per token), and with `phi` (the pre-update policy's Phi; None without diagnostics) the L+
        tokens with Phi < 0 and the Phi quadrants."""
        out = ReweightingSums()
        if phi is not None:
            out.phi = phi_sums(advantages, phi, action_mask, rewards)
        if top_pos is not None and top_neg is not None:
            s = out.selection
            s.lplus, s.lminus = float(top_pos.sum()), float(top_neg.sum())
            s.lplus_abs_diff = float(abs_log_ratio[top_pos].double().sum())
            s.lminus_abs_diff = float(abs_log_ratio[top_neg].double().sum())
            if phi is not None:
                s.lplus_negative_phi = float((top_pos & (phi < 0)).sum())
        return out

    def figures(self) -> dict[str, float]:
        """stare/gate_on and the method's REWEIGHTING_FIGURES (NO_REWEIGHTING's without one), after this step's gate."""
        gate = self.method.figures() if self.method is not None else NO_REWEIGHTING
        return {"stare/gate_on": float(self.on), **gate}

    def state_dict(self) -> dict | None:
        return self.method.state_dict() if self.method is not None else None

    def load_state_dict(self, state: dict | None, *, algorithm: str) -> None:
        if (state is None) != (self.method is None):
            uses = "uses" if self.method is not None else "does not use"
            raise ValueError(
                f"checkpoint {'has no' if state is None else 'has a'} STARE gate state (a token reweighting's) but "
                f"the algorithm {algorithm!r} {uses} a token reweighting: resume with the algorithm the checkpoint "
                "was trained with"
            )
        if self.method is not None and state is not None:
            self.method.load_state_dict(state)
