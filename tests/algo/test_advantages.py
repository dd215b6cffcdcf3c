import pytest
import torch

from stare_agents.algo import EntrocraftSwitch, filter_zero_variance_groups, grpo_advantages, overlong_penalty


def test_grpo_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    adv = grpo_advantages(rewards, group_size=3)
    # group 1: mean 1/3, unbiased std sqrt(1/3); group 2: all equal -> 0
    std = (1 / 3) ** 0.5
    expected = torch.tensor(
        [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 0, 0, 0]
    )
    assert torch.allclose(adv, expected)
    centred = grpo_advantages(rewards, group_size=3, normalize_std=False)
    assert torch.allclose(centred, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0]))


def test_grpo_rejects_ragged_groups():
    with pytest.raises(ValueError, match="groups of 4"):
        grpo_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="group_size >= 2"):
        grpo_advantages(torch.zeros(3), group_size=1)


def test_dynamic_sampling_drops_zero_variance_groups_and_reports_count():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    result = filter_zero_variance_groups(rewards, group_size=2)
    assert result.keep.tolist() == [False, False, True, True, False, False, False, False]
    assert (result.num_groups, result.dropped_groups, result.kept_groups) == (4, 3, 1)


def test_overlong_penalty_piecewise():
    lengths = torch.tensor([10, 80, 90, 100, 150])
    penalty = overlong_penalty(lengths, max_length=100, cache_length=20)
    assert torch.allclose(penalty, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError):
        overlong_penalty(lengths, max_length=10, cache_length=20)


def test_entrocraft_switch_keeps_one_sign_outside_bounds():
    switch = EntrocraftSwitch(upper_start=0.6, upper_end=0.4, lower_start=0.4, lower_end=0.2, total_steps=100)
    assert switch.bounds(0) == pytest.approx((0.4, 0.6))
    assert switch.bounds(50) == pytest.approx((0.3, 0.5))
    assert switch.bounds(1000) == pytest.approx((0.2, 0.4))
    adv = torch.tensor([1.0, -2.0, 0.5])
    assert switch.apply(adv, mean_entropy=0.7, step=0).tolist() == [1.0, 0.0, 0.5]
    assert switch.apply(adv, mean_entropy=0.1, step=0).tolist() == [0.0, -2.0, 0.0]
    assert switch.apply(adv, mean_entropy=0.5, step=0).tolist() == [1.0, -2.0, 0.5]
