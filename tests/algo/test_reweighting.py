"""The token-reweighting seam: the table, STARE's figures, and the random-token control (hand-checked sets)."""

import math
from pathlib import Path

import pytest
import torch

from stare_agents.algo import AlgorithmConfig, StareConfig, num_selected
from stare_agents.algo.random_tokens import RandomTokens, RandomTokensConfig
from stare_agents.algo.reweighting import (
    NO_REWEIGHTING,
    REWEIGHTING_FIGURES,
    REWEIGHTINGS,
    StepReweighting,
    build_reweighting,
)
from stare_agents.algo.stare import Stare

ROOT = Path(__file__).resolve().parents[2]

# one sequence of 10 response tokens: 6 action tokens with advantage > 0 (rows 0), and a second sequence
# with negative advantage; the last two tokens of each row are observation tokens (never selected)
SURPRISAL = torch.tensor(
    [[0.1, 5.0, 0.2, 4.0, 0.3, 3.0, 0.4, 2.0, 9.0, 9.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 9.0]]
)
MASK = torch.tensor([[1] * 8 + [0, 0], [1] * 8 + [0, 0]])
ADVANTAGES = torch.tensor([1.0, -1.0])


def test_the_table_builds_each_method_and_refuses_an_unknown_one():
    assert set(REWEIGHTINGS) == {"stare", "random-tokens", "phi-negative", "phi-negative-random"}
    assert isinstance(build_reweighting("stare", StareConfig()), Stare)
    assert isinstance(build_reweighting("random-tokens", StareConfig(), seed=3), RandomTokens)
    assert build_reweighting("stare", None) is None  # an algorithm without reweighting
    with pytest.raises(ValueError, match=r"reweighting='surprise'.*allowed: stare, random-tokens, phi-negative, "
                       r"phi-negative-random"):
        build_reweighting("surprise", StareConfig())
    with pytest.raises(ValueError, match=r"reweighting='random_tokens'.*did you mean 'random-tokens'\?"):
        AlgorithmConfig(reweighting="random_tokens")
    assert AlgorithmConfig.preset("stare-random").reweighting == "random-tokens"
    assert type(AlgorithmConfig.preset("stare-random").stare) is RandomTokensConfig  # each method its config type
    assert isinstance(StepReweighting(None).selector, Stare)  # baselines' diagnostics: what STARE would select


def test_figures_name_exactly_the_reweighting_figures():
    stare = Stare(StareConfig(target_entropy=0.5, w=1.2, m=0.8))
    stare.update(stare.gate_entropy(0.25))
    assert stare.figures() == {
        "stare/gate_input": 0.25,
        "stare/w": 1.2,
        "stare/m": 0.8,
        "stare/target_entropy": 0.5,
        "stare/gate_skipped": 0.0,
    }
    assert tuple(NO_REWEIGHTING) == REWEIGHTING_FIGURES == tuple(stare.figures())
    assert math.isnan(NO_REWEIGHTING["stare/gate_input"]) and NO_REWEIGHTING["stare/w"] == 1.0


def test_the_random_control_selects_as_many_candidates_as_stare_at_random():
    config = StareConfig(variant="C2", top_ratio=0.3, target_entropy=10.0)
    stare, control = Stare(config), RandomTokens(config, seed=0)
    s_pos, s_neg = stare.selection(SURPRISAL, ADVANTAGES, MASK)
    # by hand: T+ = row 0's 8 action tokens, k = ceil(0.3 * 8) = 3: surprisal 5.0, 4.0, 3.0 (columns 1, 3, 5)
    assert s_pos[0].nonzero().flatten().tolist() == [1, 3, 5] and not s_pos[1].any()
    assert s_neg[1].nonzero().flatten().tolist() == [5, 6, 7] and not s_neg[0].any()
    seen = set()
    for _ in range(40):
        pos, neg = control.selection(SURPRISAL, ADVANTAGES, MASK)
        assert int(pos.sum()) == int(neg.sum()) == num_selected(8, 0.3) == 3
        assert not (pos & ~MASK.bool()).any() and not (neg & ~MASK.bool()).any()  # never observation tokens
        assert not pos[1].any() and not neg[0].any()  # only tokens of the right advantage sign
        seen.add(tuple(pos[0].nonzero().flatten().tolist()))
    assert len(seen) > 10  # many different subsets of the 8 candidates (56 possible)
    control.update(control.gate_entropy(1.0))  # gate on: the weights are STARE's for the same selection
    pos, neg = control.selection(SURPRISAL, ADVANTAGES, MASK)
    stare.update(stare.gate_entropy(1.0))
    assert torch.equal(control.weights_from_selection(pos, neg), stare.weights_from_selection(pos, neg))


def test_the_random_control_is_seeded_and_resumes_where_it_stopped():
    config = StareConfig(top_ratio=0.5)
    a, b = RandomTokens(config, seed=7), RandomTokens(config, seed=7)
    assert torch.equal(
        a.selection(SURPRISAL, ADVANTAGES, MASK)[0], b.selection(SURPRISAL, ADVANTAGES, MASK)[0]
    )
    state = a.state_dict()
    expected = a.selection(SURPRISAL, ADVANTAGES, MASK)[0]
    resumed = RandomTokens(config, seed=123)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.selection(SURPRISAL, ADVANTAGES, MASK)[0], expected)
    with pytest.raises(ValueError, match="no random generator"):
        resumed.load_state_dict(Stare(config).state_dict())  # a STARE checkpoint is not the control's


def test_the_learner_holds_a_reweighting_and_never_names_stare():
    source = (ROOT / "train" / "learner.py").read_text()
    assert "Stare" not in source and "algo.stare" not in source
