"""STARE: surprisal-guided token-level advantage reweighting with a closed-loop entropy gate.

stare = Stare(StareConfig())                                  # config + gate in one object
stare.update(entropy)                                         # once per step: the pre-update entropy
weights = stare.weights(surprisal, advantages, action_mask)   # all ones while the gate is off
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, fields
from typing import ClassVar, Literal, get_args

import torch
from torch import Tensor

Variant = Literal["O1", "C2"]  # "O1": w on L+; "C2": also m on L-
STARE_VARIANTS: tuple[str, ...] = get_args(Variant)
# what the gate reads: the trained (kept) batch's entropy (the official code), the entropy over every sampled
# trajectory of the step, or an exponential moving average of the latter
GateInput = Literal["trained", "all", "ema"]
GATE_INPUTS: tuple[str, ...] = get_args(GateInput)
Scope = Literal[
    "micro-batch", "batch"
]  # where L+/L- are taken: each optimiser micro-batch, or the step batch
STARE_SCOPES: tuple[str, ...] = get_args(Scope)


@dataclass
class GateConfig:
    """The entropy gate's settings (STARE's keys `target_entropy`, `w`, `m` and the adaptive schedule's),
    declared once for `StareConfig`, which they are keys of, and `EntropyGate`, which starts from them."""

    target_entropy: float = 0.3
    w: float = 1.1
    m: float = 0.9
    adaptive: bool = False  # adapt w / m by alpha * sign(H_tgt - H) each step
    alpha: float = 0.01
    w_max: float = 1.5
    m_min: float = 0.5


@dataclass
class StareConfig(GateConfig):
    """STARE token reweighting. Defaults are the official release's (O1, P = 10%, W = 1.1, M = 0.9, H_tgt = 0.3)."""

    variant: Variant = "O1"
    top_ratio: float = 0.1  # P: share of T+ (T-) taken into L+ (L-)
    gated: bool = True  # False: reweight every step (open loop)
    # the gate's state before its first update. The gate is updated before it is used in every step, so this
    # decides only a step whose entropy is unknown (non-finite, or no action tokens): the gate then keeps its
    # state. The official code starts on; the default here is off, so that STARE never reweights before it
    # has measured an entropy below the target (the contract "on iff entropy < target"), e.g. a first step
    # whose logits are already non-finite. Set True for the official behaviour (the paper recipes do).
    initial_on: bool = False
    # where L+/L- are taken: each optimiser micro-batch (the official code) or the whole step batch
    scope: Scope = "micro-batch"
    gate_input: GateInput = "trained"
    ema_decay: float = 0.8  # gate_input "ema": H_ema = decay * H_ema + (1 - decay) * H_all

    def __post_init__(self) -> None:
        if self.variant not in STARE_VARIANTS:
            raise ValueError(f"stare.variant must be one of {STARE_VARIANTS}, got {self.variant!r}")
        if self.scope not in STARE_SCOPES:
            raise ValueError(f"stare.scope must be one of {STARE_SCOPES}, got {self.scope!r}")
        if self.gate_input not in GATE_INPUTS:
            raise ValueError(f"stare.gate_input must be one of {GATE_INPUTS}, got {self.gate_input!r}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"stare.ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0 < self.top_ratio <= 1:
            raise ValueError(f"stare.top_ratio must be in (0, 1], got {self.top_ratio}")
        if not (self.w > 0 and self.m > 0 and self.w_max >= 1.0 and 0 < self.m_min <= 1.0):
            raise ValueError(
                f"need stare.w > 0, stare.m > 0, stare.w_max >= 1 and 0 < stare.m_min <= 1; got "
                f"w={self.w}, m={self.m}, w_max={self.w_max}, m_min={self.m_min}"
            )
        if not (math.isfinite(self.target_entropy) and self.alpha >= 0):
            raise ValueError(
                f"stare.target_entropy must be finite and stare.alpha >= 0; got "
                f"{self.target_entropy=}, {self.alpha=}"
            )

    @property
    def reads_all_sampled(self) -> bool:
        """Whether the gate reads the entropy over every sampled trajectory of the step (not only the trained)."""
        return self.gate_input != "trained"

    def check_given(self, keys: set[str], where: str = "stare.", base: StareConfig | None = None) -> None:
        """Refuse a value a config set that these settings never read: M weights L- under variant C2 alone, so an
        M of its own under O1 (e.g. a C2 recipe's `m` kept when only `rl.algorithm` was switched to a preset whose
        variant is O1) would train without the attenuation it asks for, silently. M at 1 or at the preset's value
        (`base`; what a run folder's resolved config.yaml holds) is no such request."""
        asks_nothing = {1.0, (base or type(self)()).m}
        if self.variant == "O1" and "m" in keys and self.m not in asks_nothing:
            raise ValueError(
                f"{where}m={self.m:g}: variant O1 weights L+ only, M acts under variant C2 alone; set "
                f"{where}variant=C2 (as the stare-c2 preset does) or leave {where}m out"
            )


def num_selected(num_candidates: int, top_ratio: float) -> int:
    """k = max(1, ceil(P * |T|)), or 0 when there is no candidate.

    The product is rounded to 9 decimals first so that e.g. 0.1 * 30 gives 3, not ceil(3.0000000000000004).
    """
    if num_candidates == 0:
        return 0
    return max(1, math.ceil(round(top_ratio * num_candidates, 9)))


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Per-sequence [B] advantages become [B, T]; per-token [B, T] pass through."""
    if advantages.shape == like.shape:
        return advantages
    if advantages.dim() == 1 and like.dim() == 2 and advantages.shape[0] == like.shape[0]:
        return advantages[:, None].expand_as(like)
    raise ValueError(
        f"advantages must be [B] or [B, T] matching surprisal {tuple(like.shape)}, got {tuple(advantages.shape)}"
    )


def _top_surprisal(surprisal: Tensor, candidates: Tensor, top_ratio: float) -> Tensor:
    """Boolean mask of the k = max(1, ceil(P |candidates|)) candidates with the highest surprisal."""
    index = torch.nonzero(candidates.reshape(-1)).squeeze(1)
    selected = torch.zeros_like(candidates)
    k = num_selected(index.numel(), top_ratio)
    if k:
        top = torch.topk(surprisal.reshape(-1)[index], k).indices  # ranks the candidates only
        selected.view(-1)[index[top]] = True
    return selected


def stare_selection(
    surprisal: Tensor, advantages: Tensor, action_mask: Tensor, *, top_ratio: float = 0.1
) -> tuple[Tensor, Tensor]:
    """Boolean masks (L+, L-): the max(1, ceil(P |T|)) highest-surprisal tokens of T+ and of T-.

    T+ / T- are the action tokens with advantage > 0 / < 0. The sets are taken over exactly the
    tensor passed in. Zero-advantage, prompt, padding and observation tokens are never selected.
    """
    if not 0.0 < top_ratio <= 1.0:
        raise ValueError(f"top_ratio must be in (0, 1], got {top_ratio}")
    if surprisal.shape != action_mask.shape:
        raise ValueError(
            f"surprisal {tuple(surprisal.shape)} and action_mask {tuple(action_mask.shape)} differ"
        )
    surprisal = surprisal.detach()
    advantages = broadcast_advantages(advantages.detach(), surprisal)
    is_action = action_mask.bool()
    top_pos = _top_surprisal(surprisal, is_action & (advantages > 0), top_ratio)
    top_neg = _top_surprisal(surprisal, is_action & (advantages < 0), top_ratio)
    return top_pos, top_neg


def weights_from_selection(
    top_pos: Tensor, top_neg: Tensor, *, variant: Variant = "O1", w: float = 1.1, m: float = 0.9
) -> Tensor:
    """Paper Eq. 7: 1 everywhere, `w` on L+, and (variant C2) `m` on L-; float32, shaped like the masks."""
    if variant not in STARE_VARIANTS:
        raise ValueError(
            f"unknown STARE variant {variant!r}; use 'O1' (amplify L+) or 'C2' (also attenuate L-)"
        )
    weights = torch.where(top_pos, w, 1.0).float()
    if variant == "C2":
        weights = torch.where(top_neg, m, weights)
    return weights


def stare_weights(
    surprisal: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    variant: Variant = "O1",
    top_ratio: float = 0.1,
    w: float = 1.1,
    m: float = 0.9,
) -> Tensor:
    """STARE token weights (arXiv 2606.19236, Eq. 7): 1 everywhere, `w` on L+, and `m` on L- (variant C2).

    See `stare_selection` for L+ / L-. The weights multiply the clipped per-token surrogate and are
    not renormalised.
    """
    top_pos, top_neg = stare_selection(surprisal, advantages, action_mask, top_ratio=top_ratio)
    return weights_from_selection(top_pos, top_neg, variant=variant, w=w, m=m)


@dataclass
class EntropyGate(GateConfig):
    """Closed-loop gate: STARE reweighting is on iff the batch mean entropy < target (strict).

    Evaluated once per training step from the pre-update policy's token-mean entropy over action
    tokens. With `adaptive=True` the weights also follow the entropy error each step:
    w += alpha * sign(H_tgt - H) clipped to [1, w_max], m -= alpha * sign(H_tgt - H) clipped to [m_min, 1].
    A non-finite entropy changes nothing (the gate keeps its state), warns and counts in `skipped_updates`.
    """

    active: bool = False
    skipped_updates: int = 0

    @classmethod
    def of(cls, config: GateConfig, *, active: bool = False) -> EntropyGate:
        """A gate starting from `config`'s settings (a StareConfig's)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(GateConfig)}, active=active)

    def update(self, batch_mean_entropy: float) -> bool:
        entropy = float(batch_mean_entropy)
        if not math.isfinite(entropy):
            self.skipped_updates += 1
            warnings.warn(
                f"entropy gate: batch mean entropy is {entropy}; the gate keeps its state "
                f"(active={self.active}, w={self.w}, m={self.m}); {self.skipped_updates} update(s) skipped "
                "so far. A non-finite entropy means the policy's logits are non-finite: check the learning "
                "rate and the loss",
                RuntimeWarning,
                stacklevel=2,
            )
            return self.active
        self.active = entropy < self.target_entropy
        if self.adaptive and entropy != self.target_entropy:
            direction = math.copysign(1.0, self.target_entropy - entropy)
            self.w = min(max(self.w + self.alpha * direction, 1.0), self.w_max)
            self.m = min(max(self.m - self.alpha * direction, self.m_min), 1.0)
        return self.active

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        known = set(asdict(self))
        if set(state) - known:
            raise ValueError(
                f"unknown entropy gate state keys {sorted(set(state) - known)}; known: {sorted(known)}"
            )
        for key, value in state.items():
            setattr(self, key, value)


class Stare:
    """STARE as one object: its config and its entropy gate (a `TokenReweighting`, see reweighting.py).

    `update(H)` once per training step with the pre-update entropy of the step's action tokens: it moves
    the gate (and, with `adaptive`, w and m) and returns whether this step is reweighted (the gate is on,
    or `gated=False`). `weights(s, A, mask)` then gives the step's token weights with the current w and m,
    all ones while the step is not reweighted.
    """

    config_type: type[StareConfig] = StareConfig
    needs_phi: ClassVar[bool] = False  # selects by surprisal; the Phi methods (phi_selection.py) set it

    def __init__(self, config: StareConfig | None = None, *, seed: int = 0) -> None:
        """`seed` is unused (STARE's selection is deterministic); the random-token control takes it."""
        self.config = config or StareConfig()
        c = self.config
        self.gate = EntropyGate.of(c, active=c.initial_on)
        # this step's decision: the gate's initial state; open loop reweights from the first step
        self.reweighting = c.initial_on or not c.gated
        self.ema: float | None = None  # gate_input "ema": the moving average so far
        self.last_input: float = math.nan  # what the gate read last

    def gate_entropy(self, trained: float, sampled: float | None = None) -> float:
        """What the gate reads this step (`config.gate_input`): the trained batch's entropy, or that of every
        sampled trajectory (`sampled`), or its moving average. Call once per step, before `update`."""
        if self.config.gate_input == "trained":
            value = trained
        elif sampled is None:
            raise ValueError(
                f"stare.gate_input={self.config.gate_input!r} needs the entropy over every sampled trajectory "
                "of the step; none was given"
            )
        elif self.config.gate_input == "all" or not math.isfinite(sampled):
            value = sampled
        else:
            decay = self.config.ema_decay
            self.ema = sampled if self.ema is None else decay * self.ema + (1 - decay) * sampled
            value = self.ema
        self.last_input = value
        return value

    @property
    def w(self) -> float:
        return self.gate.w

    @property
    def m(self) -> float:
        return self.gate.m

    def update(self, entropy: float) -> bool:
        gate_on = self.gate.update(entropy)
        self.reweighting = gate_on or not self.config.gated
        return self.reweighting

    def selection(self, surprisal: Tensor, advantages: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(L+, L-) over exactly the tensors passed in (see `stare_selection`)."""
        return stare_selection(surprisal, advantages, action_mask, top_ratio=self.config.top_ratio)

    def weights_from_selection(self, top_pos: Tensor, top_neg: Tensor) -> Tensor:
        if not self.reweighting:
            return torch.ones_like(top_pos, dtype=torch.float32)
        return weights_from_selection(top_pos, top_neg, variant=self.config.variant, w=self.w, m=self.m)

    def weights(self, surprisal: Tensor, advantages: Tensor, action_mask: Tensor) -> Tensor:
        return self.weights_from_selection(*self.selection(surprisal, advantages, action_mask))

    def figures(self) -> dict[str, float]:
        """What the learner logs of the gate after this step's update (stare_agents.algo.reweighting)."""
        return {
            "stare/gate_input": self.last_input,
            "stare/w": self.w,
            "stare/m": self.m,
            "stare/target_entropy": self.config.target_entropy,
            "stare/gate_skipped": float(self.gate.skipped_updates),
        }

    def state_dict(self) -> dict:
        return {"gate": self.gate.state_dict(), "reweighting": self.reweighting, "ema": self.ema}

    def load_state_dict(self, state: dict) -> None:
        self.gate.load_state_dict(state["gate"])
        self.reweighting = bool(state["reweighting"])
        self.ema = state.get("ema")  # checkpoints written before gate_input existed have none
