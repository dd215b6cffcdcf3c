"""The entropy probe: its first-order prediction against a finite-difference step, its parts, the paper's
logit-space formula by hand."""

from __future__ import annotations

import math

import pytest
import torch
from learner_support import peaked_model, step_inputs

from stare_agents.algo import entropy_sensitivity
from stare_agents.train.entropy_probe import EntropyProbe, PartWeights
from stare_agents.train.policy import PolicyModel


@pytest.fixture(scope="module")
def probe():
    torch.manual_seed(0)
    _, batch, advantages = step_inputs(5)
    policy = PolicyModel(peaked_model(2), temperature=0.7)
    return EntropyProbe(policy, batch, advantages, top_ratio=0.2, micro_batch_tokens=300)


@pytest.mark.parametrize(
    "weights", [PartWeights(), PartWeights.stare("O1", 1.5), PartWeights.stare("C2", 2.0, 0.5)]
)
def test_the_first_order_prediction_agrees_with_a_small_finite_step(probe, weights):
    lr = 2e-5
    predicted, measured = probe.predicted(weights, lr), probe.measured(weights, lr)
    assert abs(predicted) > 1e-7  # the step moves the entropy at all
    assert measured == pytest.approx(predicted, rel=0.05)
    # and the second-order term shows at a large step: the prediction is first order only
    big = 100 * lr
    assert abs(probe.measured(weights, big) - probe.predicted(weights, big)) > 10 * abs(measured - predicted)


def test_the_parts_add_up_and_each_part_is_its_own_step(probe):
    weights, lr = PartWeights.stare("C2", 1.3, 0.7), 1e-4
    names = list(probe.parts)
    assert sum(probe.predicted(weights, lr, [n]) for n in names) == pytest.approx(
        probe.predicted(weights, lr)
    )
    counts = probe.quadrant_counts()
    assert sum(counts.values()) == int((probe.advantages[probe.mask] != 0).sum())
    for name in names:
        if probe.parts[name].any():
            assert probe.measured(weights, lr, [name]) == pytest.approx(
                probe.predicted(weights, lr, [name]), rel=0.1, abs=1e-9
            )
    # the drift is linear in W: at the critical W the first-order change vanishes
    w_star = probe.critical_w()
    if math.isfinite(w_star) and w_star > 0:
        assert probe.predicted(PartWeights.stare("O1", w_star), lr) == pytest.approx(0.0, abs=1e-12)
    # and linear in C2's M: at the critical M (whatever its sign) the first-order change of C2 at that W vanishes
    m_star = probe.critical_m(w=1.3)
    assert math.isfinite(m_star)  # this batch has L- tokens that move the entropy
    scale = abs(probe.predicted(PartWeights.stare("C2", 1.3, 1.0), lr))
    assert scale > 0
    assert probe.predicted(PartWeights.stare("C2", 1.3, m_star), lr) == pytest.approx(0.0, abs=1e-9 * scale)
    assert probe.predicted(PartWeights.stare("C2", 1.3, m_star + 1.0), lr) != pytest.approx(0.0, abs=1e-3 * scale)


def test_the_logit_space_formula_by_hand(probe):
    """-(1/N) sum_t A_t w_t Phi_t with Phi from the tempered logits of the same policy."""
    batch, policy = probe.batch, probe.policy
    with torch.no_grad():
        hidden = policy.decoder(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).last_hidden_state
        p, r = batch.prompt_length, batch.response_length
        logits = policy.head(hidden[:, p - 1 : p - 1 + r]) / 0.7
    phi = entropy_sensitivity(logits, batch.response_ids)
    weights = PartWeights.stare("C2", 1.4, 0.6)
    w = probe.token_weights(weights)
    mask = probe.mask & (probe.advantages != 0)
    expected = -float((probe.advantages * w * phi)[mask].sum()) / probe.count
    assert probe.logit_space(weights) == pytest.approx(expected, rel=1e-4)
    # STARE's weights: w on L+, m on L-, 1 elsewhere
    assert torch.allclose(w[probe.lplus], torch.tensor(1.4)) and torch.allclose(
        w[probe.lminus], torch.tensor(0.6)
    )
