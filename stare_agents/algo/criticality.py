"""The critical W* of STARE-O1 on the tabular simulation: the W at which the expected entropy drift turns sign.

    point = critical_w(SimulationConfig(seq_len=256, credit=1.0), batches=2000)
    point.w_star, point.ci_low, point.ci_high        # W* and its 95% bootstrap interval over batches

One plain gradient step of size lr on the logits, on the token-mean surrogate of a batch of N action tokens with
token weights w, changes the mean entropy over the C contexts (each visited alike) by, to first order,

    dH = -lr / (N C) * sum_t w_t A_t Phi_t        (DESIGN: dz = eta A (e_a - p) changes H by -eta A Phi)

With W on L+ and 1 elsewhere (STARE-O1, ungated) the sum is S0 + (W - 1) S1, where S0 = sum of A Phi over every
action token and S1 = sum of A Phi over L+. The expected drift is zero at

    W* = 1 - E[S0] / E[S1]

GRPO (W = 1) lowers the entropy when E[S0] > 0; L+ (the most surprising positive-advantage tokens) mostly has
Phi < 0, E[S1] < 0, so W* > 1. The paper's near-criticality (W* = 1 + O(1/T)) says E[S0] / |E[S1]| is small when
one token's credit for the outcome is weak; here that credit is `credit / seq_len` (`SimulationConfig`), and
both are knobs. The policy is the simulation's initial one (`initial_policy`), held fixed: the batches are
independent draws from it.

S0 is measured with E[A | tokens] in place of A (exact: the group's 2^G reward patterns enumerated from each
sequence's reward probability), which has the same expectation, since Phi depends on the tokens alone, and far
less noise: the realised A multiplies a sum of T zero-mean Phi's whose spread grows as sqrt(T), while the
drift's mean does not. S1 needs the realised rewards (L+ is taken from the realised T+).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from stare_agents.algo.advantages import grpo_advantages
from stare_agents.algo.diagnostics import sensitivity_from_statistics
from stare_agents.algo.logits import token_entropy, token_statistics
from stare_agents.algo.simulation import SimulationConfig, initial_policy, sample_rollouts
from stare_agents.algo.stare import broadcast_advantages, stare_selection


@dataclass(frozen=True)
class DriftSums:
    """One batch's terms of the first-order entropy drift (module docstring)."""

    s0: float  # sum of A * Phi over every action token
    s1: float  # sum of A * Phi over L+
    lplus: int  # |L+|
    lplus_negative_phi: int  # L+ tokens with Phi < 0


def expected_advantages(reward_probability: Tensor, group_size: int) -> Tensor:
    """E[A_i] of GRPO's std-normalised advantages [B] when sequence i's binary reward is drawn with probability
    `reward_probability[i]`, independently: the sum over the group's 2^G reward patterns of their probability
    times their advantages (G <= 16)."""
    if not 2 <= group_size <= 16 or reward_probability.numel() % group_size:
        raise ValueError(
            f"expected_advantages enumerates 2^group_size reward patterns: need 2 <= group_size <= 16 and "
            f"{reward_probability.numel()} sequences in whole groups; got group_size={group_size}"
        )
    bits = torch.arange(group_size)
    patterns = ((torch.arange(2**group_size)[:, None] >> bits) & 1).double()  # [2^G, G]
    advantages = grpo_advantages(patterns.reshape(-1), group_size).view_as(patterns).double()
    q = reward_probability.double().view(-1, 1, group_size)  # [groups, 1, G]
    pattern_probability = torch.where(patterns.bool(), q, 1.0 - q).prod(dim=-1)  # [groups, 2^G]
    return (pattern_probability @ advantages).reshape(-1)


def drift_sums(
    logits: Tensor,
    tokens: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    top_ratio: float,
    s0_advantages: Tensor | None = None,
) -> DriftSums:
    """S0 and S1 of one batch: `logits` [B, T, V] at each position, `tokens` and `action_mask` [B, T], advantages
    [B] or [B, T]; L+ as STARE takes it (the max(1, ceil(P |T+|)) highest-surprisal T+ tokens of the batch).
    S0 is taken with `s0_advantages` where given (e.g. `expected_advantages`), else with `advantages`."""
    stats = token_statistics(logits.detach(), tokens)
    phi = sensitivity_from_statistics(stats).double() * action_mask.double()
    top_pos, _ = stare_selection(-stats["logprob"], advantages, action_mask, top_ratio=top_ratio)
    a_phi = broadcast_advantages(advantages.detach(), phi).double() * phi
    s0_a = s0_advantages if s0_advantages is not None else advantages
    return DriftSums(
        s0=float((broadcast_advantages(s0_a.detach(), phi).double() * phi).sum()),
        s1=float(a_phi[top_pos].sum()),
        lplus=int(top_pos.sum()),
        lplus_negative_phi=int((top_pos & (phi < 0)).sum()),
    )


@dataclass(frozen=True)
class CriticalW:
    """W* of one setting, measured over `batches` independent batches from one fixed policy."""

    seq_len: int
    credit: float
    seed: int
    batches: int
    # 1 - mean(S0) / mean(S1), and its 95% percentile-bootstrap interval over batches; None where not finite
    # (mean(S1) = 0 in the data or in a resample: no W turns the drift, or the batches cannot say where)
    w_star: float | None
    ci_low: float | None
    ci_high: float | None
    s0_mean: float
    s0_sd: float
    s1_mean: float
    s1_sd: float
    lplus_negative_phi: float | None  # share of all L+ tokens with Phi < 0 (None: L+ was always empty)
    policy_entropy: float  # mean entropy over contexts of the fixed policy

    @property
    def per_token_credit(self) -> float:
        return self.credit / self.seq_len


def ratio_interval(
    numerator: Tensor, denominator: Tensor, *, bootstrap: int, seed: int
) -> tuple[float, float]:
    """95% percentile-bootstrap interval of mean(numerator) / mean(denominator), pairs resampled together."""
    gen = torch.Generator().manual_seed(seed)
    index = torch.randint(0, len(numerator), (bootstrap, len(numerator)), generator=gen)
    ratios = numerator[index].mean(dim=1) / denominator[index].mean(dim=1)  # +-inf where a mean is 0
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=ratios.dtype)).tolist()
    return float(low), float(high)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def critical_w(
    config: SimulationConfig,
    *,
    batches: int,
    bootstrap: int = 2000,
    progress: Callable[[int], None] | None = None,
) -> CriticalW:
    """W* of STARE-O1 (P = `config.top_ratio`) at the simulation's initial policy for `config` (its seq_len,
    credit and seed), from `batches` batches; `progress(i)` after each batch."""
    if batches < 2 or bootstrap < 1:
        raise ValueError(
            f"need batches >= 2 and bootstrap >= 1; got batches={batches}, bootstrap={bootstrap}"
        )
    logits, preferred, gen = initial_policy(config)
    s0, s1 = torch.zeros(batches, dtype=torch.float64), torch.zeros(batches, dtype=torch.float64)
    lplus = lplus_negative = 0
    for i in range(batches):
        rollouts = sample_rollouts(logits, preferred, config, gen)
        advantages = grpo_advantages(rollouts.rewards, config.group_size)
        sums = drift_sums(
            logits[rollouts.contexts],
            rollouts.tokens,
            advantages,
            torch.ones_like(rollouts.tokens, dtype=torch.float32),
            top_ratio=config.top_ratio,
            s0_advantages=expected_advantages(rollouts.reward_probability, config.group_size),
        )
        s0[i], s1[i] = sums.s0, sums.s1
        lplus, lplus_negative = lplus + sums.lplus, lplus_negative + sums.lplus_negative_phi
        if progress is not None:
            progress(i)
    ratio_low, ratio_high = ratio_interval(s0, s1, bootstrap=bootstrap, seed=config.seed)
    return CriticalW(
        seq_len=config.seq_len,
        credit=config.credit,
        seed=config.seed,
        batches=batches,
        w_star=_finite(float(1.0 - s0.mean() / s1.mean())) if float(s1.mean()) else None,
        ci_low=_finite(1.0 - ratio_high),
        ci_high=_finite(1.0 - ratio_low),
        s0_mean=float(s0.mean()),
        s0_sd=float(s0.std()),  # unbiased
        s1_mean=float(s1.mean()),
        s1_sd=float(s1.std()),
        lplus_negative_phi=lplus_negative / lplus if lplus else None,
        policy_entropy=float(token_entropy(logits).mean()),
    )
