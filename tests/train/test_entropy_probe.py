"""The entropy probe: its first-order prediction against a finite-difference step, its parts, the paper's
logit-space formula by hand."""

from __future__ import annotations

import math

import pytest
import torch
from learner_support import make_learner, peaked_model, step_inputs

from stare_agents.algo import AlgorithmConfig, StareConfig, entropy_sensitivity
from stare_agents.train.entropy_probe import AdamStep, EntropyProbe, PartWeights
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
    assert probe.predicted(PartWeights.stare("C2", 1.3, m_star + 1.0), lr) != pytest.approx(
        0.0, abs=1e-3 * scale
    )


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


# ---- the step training takes: AdamW from the optimiser's state (AdamStep) ----


def _flat(policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in policy.parameters() if p.requires_grad])


@pytest.mark.parametrize("name", ["grpo-ds", "stare-w3"])
def test_the_adam_step_is_the_step_the_learner_takes(name):
    """From a warmed-up optimiser (three learner steps), AdamStep on the probe's gradient moves the parameters
    exactly as the learner's own step on the same batch does (GRPO-ds; ungated STARE-O1 at W 3, L+ per micro-batch)."""
    algorithm = AlgorithmConfig.preset("grpo-ds")
    weights = PartWeights()
    if name == "stare-w3":
        algorithm = AlgorithmConfig(name="stare", stare=StareConfig(w=3.0, gated=False))
        weights = PartWeights.stare("O1", 3.0)
    learner = make_learner(algorithm, lr=1e-3, model=peaked_model(2), micro_batch_tokens=300)
    for seed in (1, 2, 3):
        _, warm, advantages = step_inputs(seed)
        learner.step(warm, advantages)
    _, batch, advantages = step_inputs(5)
    probe = EntropyProbe(
        learner.policy, batch, advantages, micro_batch_tokens=300, scope="micro-batch", quadrants=False
    )
    assert len(probe.plan) > 1 and probe.lplus.any()  # several micro-batches, each with its own L+
    adam = AdamStep(learner.optimizer, learner.policy, learner.config.optimizer.max_grad_norm)
    before = _flat(learner.policy)
    delta, norm = adam.delta(probe.direction(weights))
    assert torch.equal(_flat(learner.policy), before)  # computed, not taken
    learner.step(batch, advantages)
    change = _flat(learner.policy) - before
    # the two sum the gradient in other orders; Adam's division by sqrt(v) shows the rounding on tiny gradients
    assert norm > 0 and float((change - delta).abs().max()) < 1e-3 * float(delta.abs().max())


def test_adam_first_step_is_a_sign_step_and_its_prediction_holds_to_first_order():
    """A fresh AdamW's first step is -lr (g / (|g| + eps) + wd theta): about lr per parameter whatever the
    gradient's size; <grad H, delta> predicts the re-scored change for a small lr, not for a 100x larger one."""
    learner = make_learner("grpo-ds", lr=1e-5, model=peaked_model(2), micro_batch_tokens=300)
    _, batch, advantages = step_inputs(5)
    probe = EntropyProbe(learner.policy, batch, advantages, micro_batch_tokens=300, quadrants=False)
    gradient = probe.direction(PartWeights())
    optimizer = learner.config.optimizer
    adam = AdamStep(learner.optimizer, learner.policy, optimizer.max_grad_norm)
    delta, norm = adam.delta(gradient)
    scale = min(1.0, optimizer.max_grad_norm / (norm + 1e-6))  # clipping scales g; Adam all but undoes it
    clipped = gradient * scale
    theta = _flat(learner.policy)
    decay = {id(p): group["weight_decay"] for group in learner.optimizer.param_groups for p in group["params"]}
    wd = torch.cat([torch.full((p.numel(),), decay[id(p)]) for p in learner.policy.parameters()])  # norms: 0
    expected = -optimizer.lr * (clipped / (clipped.abs() + optimizer.eps) + wd * theta)
    ulp = 2.5e-7 * theta.abs()  # the change is read off float32 parameters: one rounding of theta + delta
    assert bool(((delta - expected).abs() <= 1e-4 * expected.abs() + ulp).all())
    predicted, measured = probe.predicted_step(delta), probe.measured_step(delta)
    assert abs(predicted) > 1e-6 and measured == pytest.approx(predicted, rel=0.05)
    big = 100 * delta
    assert abs(probe.measured_step(big) - probe.predicted_step(big)) > 10 * abs(measured - predicted)
    # without a gradient a fresh AdamW only decays the weights, and the state it keeps is put back
    state = {k: v for k, v in learner.optimizer.state_dict().items() if k != "state"}
    zero, _ = adam.delta(torch.zeros_like(gradient))
    assert bool(((zero + optimizer.lr * wd * theta).abs() <= ulp).all())
    assert (
        not learner.optimizer.state
        and {k: v for k, v in learner.optimizer.state_dict().items() if k != "state"} == state
    )


def test_adam_step_refuses_a_gradient_of_another_model_and_another_optimiser():
    learner = make_learner("grpo-ds", model=peaked_model(2))
    with pytest.raises(ValueError, match="entries"):
        AdamStep(learner.optimizer, learner.policy, 1.0).delta(torch.zeros(7))
    with pytest.raises(ValueError, match="AdamW"):
        AdamStep(torch.optim.SGD(learner.policy.parameters(), lr=0.1), learner.policy, 1.0)
    with pytest.raises(ValueError, match="not in the optimiser"):
        AdamStep(torch.optim.AdamW([next(learner.policy.parameters())]), learner.policy, 1.0)
