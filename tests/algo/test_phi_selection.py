"""The exact Phi < 0 selection and its same-count random control (stare_agents.algo.phi_selection)."""

import math

import pytest
import torch

from stare_agents.algo.diagnostics import entropy_sensitivity
from stare_agents.algo.phi_selection import (
    PhiNegative,
    PhiNegativeRandom,
    PhiSelectionConfig,
    phi_negative_selection,
)

PHI = torch.tensor([[-0.1, 0.2, -0.3, -0.4], [0.1, -0.2, 0.0, -0.5]])
ADVANTAGES = torch.tensor([1.0, -1.0])
MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])


def test_the_exact_selection_by_hand():
    lplus, lminus = phi_negative_selection(PHI, ADVANTAGES, MASK)
    # row 0 (A > 0): Phi < 0 at 0, 2 (masked: an observation token) and 3 -> 0 and 3
    assert lplus.tolist() == [[True, False, False, True], [False] * 4]
    # row 1 (A < 0): Phi < 0 at 1 and 3 (masked); Phi = 0 at 2 does not raise the entropy
    assert lminus.tolist() == [[False] * 4, [False, True, False, False]]
    # per-token advantages select the same; zero advantages never
    per_token = ADVANTAGES[:, None].expand(2, 4).clone()
    assert [m.tolist() for m in phi_negative_selection(PHI, per_token, MASK)] == [
        lplus.tolist(),
        lminus.tolist(),
    ]
    assert not any(m.any() for m in phi_negative_selection(PHI, torch.zeros(2), MASK))


def test_it_is_the_sign_of_phi_of_the_logits():
    torch.manual_seed(0)
    logits, tokens = torch.randn(3, 7, 11) * 3, torch.randint(0, 11, (3, 7))
    phi = entropy_sensitivity(logits, tokens)
    lplus, lminus = phi_negative_selection(phi, torch.tensor([1.0, -1.0, 1.0]), torch.ones(3, 7))
    assert torch.equal(lplus | lminus, phi < 0) and not lplus[1].any() and not lminus[[0, 2]].any()


def test_the_method_weights_its_selection_and_needs_phi():
    method = PhiNegative(PhiSelectionConfig(w=3.0, gated=False))
    method.update(0.5)
    lplus, lminus = method.selection(-PHI, ADVANTAGES, MASK, phi=PHI)  # the surprisal is not what selects
    assert method.weights_from_selection(lplus, lminus).tolist() == [[3.0, 1.0, 1.0, 3.0], [1.0] * 4]
    with pytest.raises(ValueError, match="'phi-negative' selects by Phi and was given none"):
        method.selection(-PHI, ADVANTAGES, MASK)
    with pytest.raises(ValueError, match=r"stare\.scope='batch'"):
        PhiSelectionConfig(scope="batch")
    assert PhiNegative.needs_phi and PhiNegative.config_type is PhiSelectionConfig


def test_the_random_control_draws_as_many_tokens_of_the_same_sign():
    torch.manual_seed(1)
    phi = torch.randn(6, 40)
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0, 1.0])
    mask = (torch.rand(6, 40) > 0.2).long()
    exact = phi_negative_selection(phi, advantages, mask)
    control = PhiNegativeRandom(PhiSelectionConfig(variant="C2", w=3.0, m=0.5, gated=False), seed=7)
    drawn = control.selection(phi, advantages, mask, phi=phi)
    for chosen, got, sign in zip(exact, drawn, (1, -1), strict=True):
        assert int(got.sum()) == int(chosen.sum()) > 0
        assert bool((advantages[:, None] * sign > 0).expand_as(got)[got].all()) and bool(
            mask.bool()[got].all()
        )
    assert not torch.equal(drawn[0], exact[0])  # drawn at random, not by Phi
    # seeded, and its generator travels with the gate's state
    state = control.state_dict()
    again = PhiNegativeRandom(PhiSelectionConfig(variant="C2", gated=False), seed=0)
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(again.selection(phi, advantages, mask, phi=phi),
                                                     control.selection(phi, advantages, mask, phi=phi), strict=True))  # fmt: skip
    with pytest.raises(ValueError, match="no random generator"):
        again.load_state_dict(PhiNegative(PhiSelectionConfig()).state_dict())


def test_no_phi_negative_token_selects_nothing():
    phi = torch.full((2, 3), 0.5)
    control = PhiNegativeRandom(PhiSelectionConfig(), seed=0)
    assert not any(m.any() for m in control.selection(phi, ADVANTAGES, torch.ones(2, 3), phi=phi))
    assert math.isclose(
        float(
            control.weights_from_selection(*phi_negative_selection(phi, ADVANTAGES, torch.ones(2, 3))).sum()
        ),
        6.0,
    )
