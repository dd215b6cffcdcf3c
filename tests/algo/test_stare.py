import math

import pytest
import torch

from stare_agents.algo import EntropyGate, Stare, StareConfig, num_selected, stare_selection, stare_weights


def test_hand_computed_o1_and_c2():
    surprisal = torch.tensor([[0.1, 2.0, 0.5, 3.0], [1.0, 0.2, 4.0, 0.3]])
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    # T+ = row 0, action positions 0..2 (3 tokens): k = ceil(0.5 * 3) = 2 -> surprisal 2.0 and 0.5.
    # Position 3 has the highest surprisal of row 0 but is an observation token: never selected.
    # T- = row 1 (4 tokens): k = 2 -> surprisal 4.0 and 1.0.
    o1 = stare_weights(surprisal, advantages, mask, top_ratio=0.5, w=1.5, m=0.5)
    assert torch.equal(o1, torch.tensor([[1.0, 1.5, 1.5, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    c2 = stare_weights(surprisal, advantages, mask, variant="C2", top_ratio=0.5, w=1.5, m=0.5)
    assert torch.equal(c2, torch.tensor([[1.0, 1.5, 1.5, 1.0], [0.5, 1.0, 0.5, 1.0]]))


def test_c2_differs_from_o1_only_on_negative_tokens():
    gen = torch.Generator().manual_seed(0)
    surprisal = torch.rand(8, 32, generator=gen) * 5
    advantages = torch.randn(8, 32, generator=gen)
    mask = (torch.rand(8, 32, generator=gen) > 0.3).long()
    o1 = stare_weights(surprisal, advantages, mask, variant="O1")
    c2 = stare_weights(surprisal, advantages, mask, variant="C2")
    changed = o1 != c2
    assert changed.any()
    assert bool((advantages[changed] < 0).all()) and bool((mask[changed] == 1).all())
    assert torch.allclose(c2[changed], torch.tensor(0.9))


@pytest.mark.parametrize(
    ("count", "ratio", "expected"),
    [
        (0, 0.1, 0),
        (1, 0.1, 1),
        (9, 0.1, 1),
        (10, 0.1, 1),
        (11, 0.1, 2),
        (30, 0.1, 3),
        (70, 0.1, 7),
        (7, 1.0, 7),
    ],
)
def test_k_is_max_one_ceil(count, ratio, expected):
    assert num_selected(count, ratio) == expected


def test_selection_sizes_match_k_on_random_batches():
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        surprisal = torch.rand(5, 40, generator=gen)
        advantages = torch.randn(5, generator=gen)
        mask = (torch.rand(5, 40, generator=gen) > 0.5).long()
        top_pos, top_neg = stare_selection(surprisal, advantages, mask, top_ratio=0.1)
        adv = advantages[:, None].expand_as(surprisal)
        n_pos = int(((adv > 0) & mask.bool()).sum())
        n_neg = int(((adv < 0) & mask.bool()).sum())
        assert (
            int(top_pos.sum()) == num_selected(n_pos, 0.1) == (max(1, math.ceil(0.1 * n_pos)) if n_pos else 0)
        )
        assert int(top_neg.sum()) == num_selected(n_neg, 0.1)
        # every selected token beats every unselected candidate on surprisal
        cand = (adv > 0) & mask.bool()
        if top_pos.any() and (cand & ~top_pos).any():
            assert surprisal[top_pos].min() >= surprisal[cand & ~top_pos].max()


def test_zero_advantage_tokens_never_selected():
    surprisal = torch.tensor([[9.0, 8.0, 0.1], [7.0, 0.2, 0.3]])
    advantages = torch.tensor([[0.0, 0.0, 1.0], [0.0, -1.0, 1.0]])
    mask = torch.ones(2, 3)
    weights = stare_weights(surprisal, advantages, mask, variant="C2", top_ratio=1.0)
    assert torch.equal(weights, torch.tensor([[1.0, 1.0, 1.1], [1.0, 0.9, 1.1]]))
    empty = stare_weights(surprisal, torch.zeros(2), mask, variant="C2")
    assert bool((empty == 1).all())


def test_per_sequence_and_per_token_advantages_agree():
    gen = torch.Generator().manual_seed(2)
    surprisal = torch.rand(6, 20, generator=gen)
    adv = torch.randn(6, generator=gen)
    mask = torch.ones(6, 20)
    assert torch.equal(
        stare_weights(surprisal, adv, mask, variant="C2"),
        stare_weights(surprisal, adv[:, None].expand(6, 20).clone(), mask, variant="C2"),
    )


def test_masked_positions_do_not_influence_weights():
    gen = torch.Generator().manual_seed(3)
    surprisal = torch.rand(4, 50, generator=gen)
    advantages = torch.randn(4, 50, generator=gen)
    mask = (torch.rand(4, 50, generator=gen) > 0.4).long()
    reference = stare_weights(surprisal, advantages, mask, variant="C2", top_ratio=0.2)
    hidden = mask == 0
    surprisal2 = surprisal.clone()
    surprisal2[hidden] = 1e6  # observation tokens with huge surprisal
    advantages2 = advantages.clone()
    advantages2[hidden] = torch.randn(int(hidden.sum()), generator=gen) * 100
    other = stare_weights(surprisal2, advantages2, mask, variant="C2", top_ratio=0.2)
    assert torch.equal(reference[mask == 1], other[mask == 1])
    assert bool((other[hidden] == 1).all())


def test_invalid_arguments_are_reported():
    s, m = torch.rand(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="variant"):
        stare_weights(s, torch.ones(2), m, variant="X")
    with pytest.raises(ValueError, match="top_ratio"):
        stare_weights(s, torch.ones(2), m, top_ratio=0.0)
    with pytest.raises(ValueError, match="advantages"):
        stare_weights(s, torch.ones(3), m)


def test_entropy_gate_is_strict_and_per_step():
    gate = EntropyGate(target_entropy=0.3)
    assert gate.update(0.29) is True
    assert gate.update(0.3) is False  # strict <
    assert gate.update(0.31) is False
    assert gate.update(0.0) is True


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_entropy_skips_the_gate_update_with_a_warning_and_a_count(bad):
    gate = EntropyGate(target_entropy=0.3, adaptive=True, w=1.1, m=0.9)
    assert gate.update(0.1) is True  # on; w 1.11, m 0.89
    with pytest.warns(RuntimeWarning, match="keeps its state"):
        assert gate.update(bad) is True  # state kept: still on, w and m unchanged
    assert (gate.active, gate.w, gate.m, gate.skipped_updates) == (
        True,
        pytest.approx(1.11),
        pytest.approx(0.89),
        1,
    )
    with pytest.warns(RuntimeWarning, match="2 update"):
        gate.update(bad)
    assert gate.update(0.5) is False and gate.skipped_updates == 2


def test_adaptive_schedule_moves_and_clips():
    gate = EntropyGate(target_entropy=0.3, adaptive=True, w=1.1, m=0.9, alpha=0.01, w_max=1.12, m_min=0.89)
    gate.update(0.1)  # below target: strengthen
    assert gate.w == pytest.approx(1.11) and gate.m == pytest.approx(0.89)
    gate.update(0.1)
    assert gate.w == pytest.approx(1.12) and gate.m == pytest.approx(0.89)  # clipped at w_max / m_min
    for _ in range(50):
        gate.update(0.9)  # above target: relax to neutral, never below 1 / above 1
    assert gate.w == 1.0 and gate.m == 1.0
    restored = EntropyGate()
    restored.load_state_dict(gate.state_dict())
    assert restored == gate


@pytest.mark.parametrize("ties", [False, True])
def test_selection_takes_exactly_k_even_with_ties(ties):
    gen = torch.Generator().manual_seed(4)
    surprisal = torch.rand(16, 300, generator=gen)
    if ties:
        surprisal = (surprisal * 5).floor()  # five distinct values: heavy ties at the k-th
    advantages = torch.randn(16, generator=gen)
    mask = (torch.rand(16, 300, generator=gen) > 0.3).long()
    top_pos, top_neg = stare_selection(surprisal, advantages, mask, top_ratio=0.1)
    cand_pos = (advantages[:, None] > 0) & mask.bool()
    assert int(top_pos.sum()) == num_selected(int(cand_pos.sum()), 0.1)
    assert surprisal[top_pos].min() >= surprisal[cand_pos & ~top_pos].max()
    assert not bool((top_pos & ~cand_pos).any()) and not bool((top_neg & top_pos).any())


def test_stare_object_holds_config_and_gate():
    # row 0 (A > 0): surprisal 0.1, 2.0, 0.5 -> top 1 of 3 at P = 0.34 is k = ceil(1.02) = 2: 2.0 and 0.5
    surprisal = torch.tensor([[0.1, 2.0, 0.5], [1.0, 0.2, 4.0]])
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 3)
    stare = Stare(StareConfig(variant="C2", top_ratio=0.34, w=1.2, m=0.8, target_entropy=0.3))
    assert torch.equal(stare.weights(surprisal, advantages, mask), torch.ones(2, 3))  # gate closed at start
    assert stare.update(0.5) is False
    assert torch.equal(stare.weights(surprisal, advantages, mask), torch.ones(2, 3))
    assert stare.update(0.2) is True
    expected = torch.tensor([[1.0, 1.2, 1.2], [0.8, 1.0, 0.8]])
    assert torch.equal(stare.weights(surprisal, advantages, mask), expected)
    top_pos, top_neg = stare.selection(surprisal, advantages, mask)
    assert torch.equal(stare.weights_from_selection(top_pos, top_neg), expected)


def test_open_loop_reweights_every_step():
    stare = Stare(StareConfig(gated=False, top_ratio=1.0, w=1.5))
    weights = stare.weights(torch.rand(1, 2), torch.ones(1), torch.ones(1, 2))
    assert torch.equal(weights, torch.full((1, 2), 1.5))  # before any update too
    assert stare.update(5.0) is True and stare.gate.active is False  # entropy above target: still reweights


def test_adaptive_w_and_m_are_fed_back_into_the_weights():
    config = StareConfig(variant="C2", top_ratio=1.0, w=1.1, m=0.9, adaptive=True, alpha=0.05)
    stare = Stare(config)
    surprisal, advantages, mask = torch.rand(2, 1), torch.tensor([1.0, -1.0]), torch.ones(2, 1)
    stare.update(0.1)  # below target: w 1.15, m 0.85
    assert stare.weights(surprisal, advantages, mask).flatten().tolist() == pytest.approx([1.15, 0.85])
    stare.update(0.2)  # w 1.2, m 0.8
    assert stare.weights(surprisal, advantages, mask).flatten().tolist() == pytest.approx([1.2, 0.8])
    restored = Stare(config)
    restored.load_state_dict(stare.state_dict())
    assert restored.state_dict() == stare.state_dict()
    assert torch.equal(
        restored.weights(surprisal, advantages, mask), stare.weights(surprisal, advantages, mask)
    )
    with pytest.raises(ValueError, match="unknown entropy gate state"):
        restored.gate.load_state_dict({"bogus": 1})


def test_stare_config_rejects_bad_values():
    with pytest.raises(ValueError, match="scope"):
        StareConfig(scope="global")
    with pytest.raises(ValueError, match="top_ratio"):
        StareConfig(top_ratio=1.5)
    with pytest.raises(ValueError, match="w > 0"):
        StareConfig(w=0.0)
    with pytest.raises(ValueError, match="target_entropy"):
        StareConfig(target_entropy=float("nan"))


def test_initial_gate_state_decides_only_until_the_first_measured_entropy():
    surprisal, advantages, mask = torch.tensor([[0.1, 2.0]]), torch.tensor([1.0]), torch.ones(1, 2)
    off, on = (
        Stare(StareConfig(top_ratio=0.5, w=1.5)),
        Stare(StareConfig(top_ratio=0.5, w=1.5, initial_on=True)),
    )
    assert off.reweighting is False and off.gate.active is False  # the project's default: off
    assert torch.equal(off.weights(surprisal, advantages, mask), torch.ones(1, 2))
    assert on.reweighting is True and on.gate.active is True  # the official code's: on
    assert torch.equal(on.weights(surprisal, advantages, mask), torch.tensor([[1.0, 1.5]]))
    with pytest.warns(RuntimeWarning, match="keeps its state"):
        assert on.update(float("nan")) is True and off.update(float("nan")) is False  # unknown: kept
    assert on.update(0.5) is False and off.update(0.2) is True  # the first measured entropy decides


def test_the_gate_reads_the_trained_batch_every_sampled_trajectory_or_their_moving_average():
    trained, sampled = 0.4, 0.2
    assert Stare(StareConfig(gate_input="trained")).gate_entropy(trained, sampled) == 0.4
    assert Stare(StareConfig(gate_input="all")).gate_entropy(trained, sampled) == 0.2
    ema = Stare(StareConfig(gate_input="ema", ema_decay=0.5))
    assert [ema.gate_entropy(trained, h) for h in (0.4, 0.2, 0.0)] == pytest.approx([0.4, 0.3, 0.15])
    assert ema.last_input == pytest.approx(0.15)
    restored = Stare(StareConfig(gate_input="ema", ema_decay=0.5))
    restored.load_state_dict(ema.state_dict())
    assert restored.gate_entropy(trained, 0.15) == pytest.approx(0.15)  # 0.5 * 0.15 + 0.5 * 0.15
    old = ema.state_dict()
    del old["ema"]  # a checkpoint from before gate_input: no moving average yet
    Stare(StareConfig(gate_input="ema")).load_state_dict(old)
    with pytest.raises(ValueError, match="every sampled trajectory"):
        Stare(StareConfig(gate_input="all")).gate_entropy(trained, None)
    with pytest.raises(ValueError, match="gate_input"):
        StareConfig(gate_input="kept")
    with pytest.raises(ValueError, match="ema_decay"):
        StareConfig(ema_decay=1.0)
