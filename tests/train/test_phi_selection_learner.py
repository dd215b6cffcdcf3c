"""The causal test's arms in the learner (issue 47, item 2): `rl.reweighting=phi-negative` weights exactly the
positive-advantage tokens whose Phi (the pre-update policy's) is < 0, and `phi-negative-random` as many tokens of
T+ drawn at random; the learner computes Phi for them with its diagnostics off, and a scope they cannot serve
is refused at load."""

from __future__ import annotations

import pytest
import torch
from learner_support import make_learner, step_inputs

from stare_agents.algo.reweighting import REWEIGHTINGS, StepReweighting
from stare_agents.train.config import load_config


def _step(method: str, *, diagnostics: bool):
    _, batch, advantages = step_inputs(3)
    algorithm = load_config(
        recipe="tiny", overrides=[f"rl.reweighting={method}", "rl.stare.w=3.0", "rl.stare.gated=false"]
    ).algorithm()
    learner = make_learner(algorithm, diagnostics=diagnostics)  # T+ holds tokens of both signs of Phi here
    return learner.step(batch, advantages, record_tokens=True), batch, advantages


def _tokens(result, batch, advantages):
    """(advantage, Phi, weight, selection) of every trained action token."""
    out = []
    for row, record in result.token_records.items():
        mask = batch.action_mask[row].tolist()
        for j, m in enumerate(mask[: len(record.phi)]):
            if m:
                out.append((float(advantages[row]), record.phi[j], record.stare_weights[j], record.selection[j]))
    return out


@pytest.mark.parametrize("diagnostics", [True, False])
def test_phi_negative_weights_exactly_the_entropy_raising_tokens_of_t_plus(diagnostics):
    result, batch, advantages = _step("phi-negative", diagnostics=diagnostics)
    tokens = _tokens(result, batch, advantages)
    assert tokens and all(phi == phi for _, phi, _, _ in tokens)  # Phi was computed for every action token
    lplus = [(a, phi, w) for a, phi, w, s in tokens if s == 1]
    expected = [(a, phi) for a, phi, _, _ in tokens if a > 0 and phi < 0]
    assert lplus and sorted((a, phi) for a, phi, _ in lplus) == sorted(expected)
    assert any(a > 0 and phi >= 0 for a, phi, _, _ in tokens)  # and some of T+ is left out
    assert all(w == pytest.approx(3.0) for *_, w in lplus)
    # no token outside L+/L- is reweighted; an L- token has Phi < 0 and a negative advantage (C2's M: 1 here)
    assert all(w == pytest.approx(1.0) for _, _, w, s in tokens if s == 0)
    assert all(a < 0 and phi < 0 for a, phi, _, s in tokens if s == -1)
    assert result["stare/lplus_negative_phi"] == pytest.approx(1.0)  # the share of L+ with Phi < 0


def test_the_random_control_takes_as_many_tokens_of_t_plus_and_not_the_same_ones():
    exact, batch, advantages = _step("phi-negative", diagnostics=False)
    drawn, _, _ = _step("phi-negative-random", diagnostics=False)
    a, b = _tokens(exact, batch, advantages), _tokens(drawn, batch, advantages)
    count = [sum(1 for *_, s in t if s == 1) for t in (a, b)]
    assert count[0] == count[1] > 0
    assert all(adv > 0 for adv, _, _, s in b if s == 1)
    positions = [[i for i, (*_, s) in enumerate(t) if s == 1] for t in (a, b)]
    assert positions[0] != positions[1]
    # drawn from all of T+, so its L+ holds Phi >= 0 tokens where most of T+ has Phi >= 0
    assert any(phi >= 0 for _, phi, _, s in b if s == 1)


def test_the_phi_methods_are_registered_and_refuse_what_they_cannot_serve():
    assert {"phi-negative", "phi-negative-random"} <= set(REWEIGHTINGS)
    with pytest.raises(ValueError, match=r"stare\.scope='batch'"):
        load_config(recipe="tiny", overrides=["rl.reweighting=phi-negative", "rl.stare.scope=batch"])
    config = load_config(recipe="tiny", overrides=["rl.reweighting=phi-negative"])
    reweighting = StepReweighting.build(config.algorithm(), diagnostics=False)
    assert reweighting.needs_phi and not StepReweighting.build(load_config(recipe="tiny").algorithm()).needs_phi
    reweighting.gate(0.5, 0.5, measured=True)
    mask = torch.ones(1, 3)
    with pytest.raises(ValueError, match="'phi-negative' selects by Phi and was given none"):
        reweighting.select(torch.zeros(1, 3), torch.ones(1), mask)  # a learner that forgot Phi is told so
