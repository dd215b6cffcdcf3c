import pytest
import torch

from stare_agents.algo import (
    AlgorithmConfig,
    EntrocraftSwitch,
    compute_advantages,
    filter_zero_variance_groups,
    group_index,
    grpo_advantages,
    overlong_penalty,
)


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
    result = filter_zero_variance_groups(rewards, 2)
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


def test_group_ids_in_any_order_equal_contiguous_groups():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    contiguous = grpo_advantages(rewards, group_size=3)
    # the same groups, interleaved: a b a b a b with a = positions 0, 2, 4
    order = [0, 3, 1, 4, 2, 5]
    ids = ["a", "b", "a", "b", "a", "b"]
    result = compute_advantages(rewards[order], ids, AlgorithmConfig.preset("grpo"))
    assert torch.allclose(result.advantages, contiguous[order])
    assert group_index(ids, 6).tolist() == [0, 1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="one group id per sequence"):
        group_index(["a", "b"], 3)
    with pytest.raises(ValueError, match="one group id per sequence"):
        group_index("ab", 2)


def test_std_eps_and_normalize_std_are_read():
    rewards = torch.tensor([1.0, 0.0])  # unbiased std sqrt(0.5)
    config = AlgorithmConfig.preset("grpo")
    config.std_eps = 0.5
    result = compute_advantages(rewards, 2, config)
    assert result.advantages.tolist() == pytest.approx([0.5 / (0.5**0.5 + 0.5), -0.5 / (0.5**0.5 + 0.5)])
    config.normalize_std = False
    assert compute_advantages(rewards, 2, config).advantages.tolist() == pytest.approx([0.5, -0.5])
    # a one-member group (ids) has no signal: advantage 0, not NaN
    lone = compute_advantages(torch.tensor([1.0, 1.0, 0.0]), ["x", "y", "y"], AlgorithmConfig.preset("grpo"))
    assert lone.advantages[0].item() == 0.0


def test_dynamic_sampling_field_drops_groups_and_kept_selects_trajectories():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    ds = compute_advantages(rewards, 2, AlgorithmConfig.preset("grpo-ds"))
    assert ds.keep.tolist() == [False, False, True, True] and (ds.num_groups, ds.dropped_groups) == (2, 1)
    assert ds.kept(["t0", "t1", "t2", "t3"]) == ["t2", "t3"]
    plain = compute_advantages(rewards, 2, AlgorithmConfig.preset("grpo"))
    assert plain.keep.all() and plain.dropped_groups == 0
    assert plain.advantages[:2].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="items"):
        ds.kept(["t0"])


def test_overlong_fields_shape_the_rewards():
    config = AlgorithmConfig.preset("dapo")
    config.overlong_cache_length, config.overlong_factor = 20, 0.5
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    lengths = torch.tensor([50, 90, 50, 100])
    result = compute_advantages(rewards, 2, config, response_lengths=lengths, max_response_length=100)
    # soft zone 80..100: 90 -> -0.5 * 0.5 = -0.25; 100 -> -0.5
    assert result.rewards.tolist() == pytest.approx([1.0, 0.75, 0.0, -0.5])
    # dynamic sampling looks at the task rewards: both groups are all-equal there, so both are dropped
    assert result.dropped_groups == 2
    config.dynamic_sampling = False
    kept = compute_advantages(rewards, 2, config, response_lengths=lengths, max_response_length=100)
    assert kept.advantages[0] > 0 > kept.advantages[1]
    with pytest.raises(ValueError, match="response_lengths"):
        compute_advantages(rewards, 2, config)
    no_shaping = compute_advantages(rewards, 2, AlgorithmConfig.preset("grpo-ds"))
    assert torch.equal(no_shaping.rewards, rewards)


def test_compute_advantages_rejects_hostile_rewards():
    config = AlgorithmConfig.preset("grpo")
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(torch.tensor([1.0, float("nan")]), 2, config)
    with pytest.raises(ValueError, match="finite 1-D"):
        compute_advantages(torch.ones(2, 2), 2, config)
    with pytest.raises(ValueError, match="groups of 3"):
        compute_advantages(torch.ones(4), 3, config)
    with pytest.raises(ValueError, match="std_eps"):
        AlgorithmConfig(std_eps=0.0)


@pytest.mark.parametrize("dynamic_sampling", [True, False])
def test_one_member_groups_are_dropped_or_kept_with_advantage_r(dynamic_sampling):
    # a: two members (1, 0); b: two equal (1, 1); c: one member r = 1; d: one member r = 0
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    groups = ["a", "a", "b", "b", "c", "d"]
    pair = 0.5 / (0.5**0.5 + 1e-6)  # (r - 0.5) / (unbiased std sqrt(1/2) + eps)
    drop = AlgorithmConfig(dynamic_sampling=dynamic_sampling)
    keep = AlgorithmConfig(dynamic_sampling=dynamic_sampling, one_member_groups="keep")
    dropped, kept = compute_advantages(rewards, groups, drop), compute_advantages(rewards, groups, keep)
    # drop: a one-member group is its own baseline (advantage 0) and, without variance, dynamic sampling drops it
    assert torch.allclose(dropped.advantages, torch.tensor([pair, -pair, 0, 0, 0, 0]))
    # keep (official): baseline 0, std 1 -> r / (1 + eps); dynamic sampling keeps it (b is still dropped)
    assert torch.allclose(kept.advantages, torch.tensor([pair, -pair, 0, 0, 1 / (1 + 1e-6), 0]))
    if dynamic_sampling:
        assert (
            dropped.keep.tolist() == [True, True, False, False, False, False] and dropped.dropped_groups == 3
        )
        assert kept.keep.tolist() == [True, True, False, False, True, True] and kept.dropped_groups == 1
    else:
        assert dropped.keep.all() and kept.keep.all() and dropped.dropped_groups == kept.dropped_groups == 0
    centred = compute_advantages(
        rewards, groups, AlgorithmConfig(normalize_std=False, one_member_groups="keep")
    )
    assert centred.advantages[4] == 1.0  # Dr. GRPO centring: advantage r exactly
    with pytest.raises(ValueError, match="one_member_groups must be one of"):
        AlgorithmConfig(one_member_groups="zero")
