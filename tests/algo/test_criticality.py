"""The critical W* of the tabular simulation (stare_agents.algo.criticality): hand-computed cases, the first-order
drift against a real gradient step, and the knobs' bounds."""

import json
import math
from dataclasses import asdict

import pytest
import torch

from stare_agents.algo.advantages import grpo_advantages
from stare_agents.algo.criticality import critical_w, drift_sums, expected_advantages
from stare_agents.algo.logits import token_logprobs
from stare_agents.algo.losses import PolicyLossConfig, policy_loss
from stare_agents.algo.simulation import SimulationConfig, initial_policy, sample_rollouts
from stare_agents.algo.stare import stare_selection, weights_from_selection


def test_two_token_vocabulary_by_hand():
    # p = (3/4, 1/4): Phi(0) = 2 p0 p1 (log p0 + H), Phi(1) = -2 p0^2 (log p0 + H) = -3 Phi(0)
    p0, p1 = 0.75, 0.25
    entropy = -(p0 * math.log(p0) + p1 * math.log(p1))
    phi0 = 2 * p0 * p1 * (math.log(p0) + entropy)
    logits = torch.tensor([math.log(p0), math.log(p1)]).expand(2, 1, 2)
    tokens = torch.tensor([[0], [1]])
    sums = drift_sums(logits, tokens, torch.tensor([-1.0, 1.0]), torch.ones(2, 1), top_ratio=0.1)
    # S0 = -Phi(0) + Phi(1) = -4 Phi(0); L+ is the one rewarded token: S1 = Phi(1) = -3 Phi(0)
    assert sums.s0 == pytest.approx(-4 * phi0, rel=1e-5)
    assert sums.s1 == pytest.approx(-3 * phi0, rel=1e-5)
    assert (sums.lplus, sums.lplus_negative_phi) == (1, 1)
    # the drift -(S0 + (W - 1) S1) = Phi(0) (1 + 3 W) turns at W* = -1/3
    assert 1 - sums.s0 / sums.s1 == pytest.approx(-1 / 3, rel=1e-5)


def test_masked_positions_count_nowhere():
    logits = torch.zeros(2, 2, 3)
    logits[:, 1] = torch.tensor([5.0, -5.0, 0.0])  # the masked position would have a large Phi
    tokens = torch.tensor([[0, 1], [1, 1]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    sums = drift_sums(logits, tokens, torch.tensor([1.0, -1.0]), mask, top_ratio=1.0)
    # uniform logits: Phi = 0 at every unmasked position
    assert (sums.s0, sums.s1, sums.lplus) == (pytest.approx(0.0, abs=1e-7), pytest.approx(0.0, abs=1e-7), 1)


def test_first_order_drift_matches_a_gradient_step():
    """dH over contexts = -lr / (N C) (S0 + (W - 1) S1) for one plain gradient step of the W-weighted loss."""
    config = SimulationConfig(num_contexts=5, vocab_size=6, seq_len=7, num_prompts=3, group_size=4, seed=3)
    logits, preferred, gen = initial_policy(config)
    logits = logits.double() / 3
    rollouts = sample_rollouts(logits, preferred, config, gen)
    advantages = grpo_advantages(rollouts.rewards, config.group_size)
    mask = torch.ones(rollouts.tokens.shape, dtype=torch.float64)
    sums = drift_sums(logits[rollouts.contexts], rollouts.tokens, advantages, mask, top_ratio=0.2)
    assert sums.lplus > 0
    w, lr = 3.0, 1e-4
    top_pos, top_neg = stare_selection(
        -token_logprobs(logits[rollouts.contexts], rollouts.tokens), advantages, mask, top_ratio=0.2
    )
    weights = weights_from_selection(top_pos, top_neg, w=w).double()
    table = logits.clone().requires_grad_(True)
    logprobs = token_logprobs(table[rollouts.contexts], rollouts.tokens)
    loss, _ = policy_loss(
        logprobs, logprobs.detach(), advantages, mask, PolicyLossConfig(), token_weights=weights
    )
    loss.backward()

    def mean_entropy(z):  # in float64 (token_entropy's float32 would round the change away)
        logp = torch.log_softmax(z, dim=-1)
        return float(-(logp.exp() * logp).sum(-1).mean())

    with torch.no_grad():
        change = mean_entropy(table - lr * table.grad) - mean_entropy(table)
    predicted = -lr / (mask.numel() * config.num_contexts) * (sums.s0 + (w - 1) * sums.s1)
    assert float(change) == pytest.approx(predicted, rel=1e-3)


def test_expected_advantages_of_a_pair_by_hand():
    # a group of two: (1, 0) gives +-a, a = 0.5 / (sqrt(0.5) + 1e-6); E[A_1] = a (q1 - q2)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = expected_advantages(torch.tensor([0.9, 0.3, 0.5, 0.5]), group_size=2)
    assert expected.tolist() == pytest.approx([0.6 * a, -0.6 * a, 0.0, 0.0], rel=1e-6)


def test_expected_advantages_of_certain_rewards_are_the_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    assert expected_advantages(rewards, group_size=4).tolist() == pytest.approx(
        grpo_advantages(rewards, 4).tolist(), abs=1e-6
    )


@pytest.mark.parametrize("group_size", [1, 17, 3])
def test_expected_advantages_refuse_what_they_cannot_enumerate(group_size):
    with pytest.raises(ValueError, match="group_size"):
        expected_advantages(torch.full((16,), 0.5), group_size=group_size)


@pytest.mark.parametrize(
    "changes", [{"credit": 0.0}, {"credit": 1.5}, {"credit": float("nan")}, {"seq_len": 0}]
)
def test_the_knobs_are_bounded(changes):
    with pytest.raises(ValueError, match="credit"):
        initial_policy(SimulationConfig(**changes))


def test_credit_sets_how_much_the_tokens_move_the_reward():
    for credit in (1.0, 0.25):
        config = SimulationConfig(seq_len=16, credit=credit)
        logits, preferred, gen = initial_policy(config)
        rollouts = sample_rollouts(logits, preferred, config, gen)
        hit_rate = (rollouts.tokens == preferred[rollouts.contexts]).double().mean(dim=1)
        assert rollouts.reward_probability.double().tolist() == pytest.approx(
            ((1 - credit) / 2 + credit * hit_rate).tolist(), abs=1e-6
        )


def test_critical_w_reports_strict_json():
    config = SimulationConfig(seq_len=8, num_contexts=8, vocab_size=5, num_prompts=2, group_size=4)
    point = critical_w(config, batches=6, bootstrap=50)
    record = json.loads(json.dumps(asdict(point), allow_nan=False))
    assert record["batches"] == 6 and record["seq_len"] == 8
    assert math.isfinite(record["policy_entropy"])
    assert all(record[k] is None or math.isfinite(record[k]) for k in ("w_star", "ci_low", "ci_high"))
    with pytest.raises(ValueError, match="batches"):
        critical_w(config, batches=1)
