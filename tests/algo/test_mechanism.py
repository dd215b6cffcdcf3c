"""The per-step mechanism figures (issue 47, item 4), on tensors small enough to count by hand: the Phi < 0
share of T+ and T- in successful and failed trajectories, the Phi mass of each quadrant, and the rollout/learner
mismatch on L+ and L-; and the typed sums they are carried in."""

import math
from dataclasses import dataclass, field

import pytest
import torch

from stare_agents.algo.diagnostics import PhiSums, phi_sums
from stare_agents.algo.reweighting import ReweightingSums, SelectionSums, StepReweighting
from stare_agents.algo.stare import Stare, StareConfig
from stare_agents.algo.sums import Sums, figure

# three trajectories of four response tokens: a success with A > 0, a failure with A < 0, and a failure with
# A > 0 (partial credit from its group); masked positions carry a Phi that must never count
PHI = torch.tensor(
    [
        [-0.5, 0.2, -0.1, 9.0],  # T+, success: Phi < 0 at columns 0 and 2; column 3 masked
        [0.3, -0.2, 0.0, -1.0],  # T-, failure: Phi < 0 at columns 1 and 3 (0.0 is "low": Phi >= 0)
        [-2.0, 0.1, -9.0, -9.0],  # T+, failure: Phi < 0 at column 0; columns 2-3 masked
    ]
)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
ADVANTAGES = torch.tensor([1.0, -1.0, 0.5])
REWARDS = torch.tensor([1.0, 0.0, 0.0])


def test_phi_sums_count_the_quadrants_their_mass_and_the_negative_share_by_outcome():
    s = phi_sums(ADVANTAGES, PHI, MASK, REWARDS)
    # quadrants: T+ high = (0,0) (0,2) (2,0); T+ low = (0,1) (2,1); T- high = (1,1) (1,3); T- low = (1,0) (1,2)
    assert (s.pos_high, s.pos_low, s.neg_high, s.neg_low) == (3, 2, 2, 2)
    assert s.pos_high_mass == pytest.approx(-0.5 - 0.1 - 2.0)
    assert s.pos_low_mass == pytest.approx(0.2 + 0.1)
    assert s.neg_high_mass == pytest.approx(-0.2 - 1.0)
    assert s.neg_low_mass == pytest.approx(0.3 + 0.0)
    figures = s.figures(measured={"phi"})
    assert figures["phi_neg_share/pos_success"] == pytest.approx(2 / 3)  # row 0: 2 of its 3 T+ tokens
    assert figures["phi_neg_share/pos_failed"] == pytest.approx(1 / 2)  # row 2: 1 of 2
    assert figures["phi_neg_share/neg_failed"] == pytest.approx(2 / 4)  # row 1: 2 of 4
    assert math.isnan(figures["phi_neg_share/neg_success"])  # no T- token in a success: not measurable
    assert figures["quadrant/pos_high"] == 3 and figures["phi_mass/neg_high"] == pytest.approx(-1.2)
    # per-token advantages: the sign is each token's own
    per_token = torch.tensor([[1.0, -1.0, 1.0, 1.0], [-1.0] * 4, [0.5, 0.0, 0.5, 0.5]])
    t = phi_sums(per_token, PHI, MASK, REWARDS)
    assert (t.pos_high, t.pos_low, t.neg_high, t.neg_low) == (3, 0, 2, 3)  # (0,1) is T- now; (2,1) neither
    assert t.neg_success == 1 and t.neg_success_high == 0


def test_without_diagnostics_the_phi_figures_are_absent_not_zero():
    figures = phi_sums(ADVANTAGES, PHI, MASK, REWARDS).figures(measured=set())
    assert set(figures) == set(PhiSums.names()) and all(math.isnan(v) for v in figures.values())


def test_selection_sums_count_l_plus_l_minus_their_phi_and_their_mismatch():
    top_pos = torch.zeros_like(MASK, dtype=torch.bool)
    top_neg = torch.zeros_like(MASK, dtype=torch.bool)
    top_pos[0, 0] = top_pos[2, 1] = True  # Phi -0.5 and 0.1: one of two below 0
    top_neg[1, 3] = True
    abs_log_ratio = torch.tensor([[0.1, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.05], [0.0, 0.3, 0.0, 0.0]])
    reweighting = StepReweighting(None)  # a baseline: diagnostics on, L+/L- are STARE's defaults'
    sums = reweighting.sums(
        top_pos,
        top_neg,
        advantages=ADVANTAGES,
        action_mask=MASK,
        rewards=REWARDS,
        phi=PHI,
        abs_log_ratio=abs_log_ratio,
    )
    figures = sums.figures({"action_tokens": 9.0}, reweighting.measured)
    assert figures["stare/lplus_share"] == pytest.approx(2 / 9) and figures[
        "stare/lminus_share"
    ] == pytest.approx(1 / 9)
    assert figures["stare/lplus_negative_phi"] == pytest.approx(1 / 2)
    assert figures["mismatch/lplus_abs_diff"] == pytest.approx((0.1 + 0.3) / 2)
    assert figures["mismatch/lminus_abs_diff"] == pytest.approx(0.05)
    assert figures["quadrant/pos_high"] == 3  # the Phi sums come with it
    # an empty L- (no T- token): its shares are 0 and its mismatch absent, never NaN in JSON (RunLog drops NaN)
    empty = reweighting.sums(
        top_pos, torch.zeros_like(top_neg), advantages=ADVANTAGES, action_mask=MASK, rewards=REWARDS,
        phi=PHI, abs_log_ratio=abs_log_ratio,
    )  # fmt: skip
    figures = empty.figures({"action_tokens": 9.0}, reweighting.measured)
    assert figures["stare/lminus_share"] == 0.0 and math.isnan(figures["mismatch/lminus_abs_diff"])


def test_what_a_step_measures_decides_which_figures_exist():
    quiet = StepReweighting(None, diagnostics=False)
    assert quiet.measured == set()
    stare = StepReweighting(Stare(StareConfig(target_entropy=10.0)), diagnostics=False)
    stare.gate(1.0, math.nan, measured=True)  # entropy under the target: on
    assert stare.on and stare.measured == {"selection"}
    sums = SelectionSums(
        lplus=2.0, lminus=1.0, lplus_negative_phi=2.0, lplus_abs_diff=0.2, lminus_abs_diff=0.1
    )
    figures = sums.figures({"action_tokens": 10.0}, stare.measured)
    assert figures["stare/lplus_share"] == 0.2 and math.isnan(figures["stare/lplus_negative_phi"])  # no Phi
    assert all(math.isnan(v) for v in sums.figures({"action_tokens": 10.0}, quiet.measured).values())


@dataclass
class Inner(Sums):
    tokens: float = 0.0  # a divisor only
    hits: float = figure("test/hit_share", per="tokens")


@dataclass
class Outer(Sums):
    loss: float = figure("test/loss", per="updates")
    inner: Inner = field(default_factory=Inner)


def test_sums_add_flatten_and_name_their_figures_nested_ones_included():
    a, b = Outer(1.0, Inner(4.0, 1.0)), Outer(2.0, Inner(6.0, 4.0))
    total = a + b
    assert total == Outer(3.0, Inner(10.0, 5.0))
    assert (
        total.values() == [3.0, 10.0, 5.0] and Outer.of(total.vector()) == total
    )  # an all-reduce's round trip
    assert Outer.names() == ("test/loss", "test/hit_share")
    assert total.figures({"updates": 2.0}) == {"test/loss": 1.5, "test/hit_share": 0.5}
    assert math.isnan(Outer().figures({"updates": 0.0})["test/loss"])  # nothing to divide by: absent
    assert ReweightingSums.names() == SelectionSums.names() + PhiSums.names()
