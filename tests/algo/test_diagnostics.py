import torch

from stare_agents.algo import (
    critical_surprisal,
    entropy_sensitivity,
    negative_sensitivity_fraction,
    quadrant_counts,
    token_entropy,
    token_logprobs,
    token_statistics,
)


def _entropy(z: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(z, -1)
    return -(logp.exp() * logp).sum(-1)


def test_phi_predicts_the_exact_entropy_change_of_a_small_step():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 50, generator=gen, dtype=torch.float64) * 3
    tokens = torch.randint(0, 50, (200,), generator=gen)
    advantages = torch.randn(200, generator=gen, dtype=torch.float64)
    eta = 1e-4
    p = torch.softmax(logits, -1)
    step = eta * advantages[:, None] * (torch.nn.functional.one_hot(tokens, 50) - p)
    exact = _entropy(logits + step) - _entropy(logits)
    predicted = -eta * advantages * entropy_sensitivity(logits, tokens).double()
    assert torch.allclose(exact, predicted, rtol=1e-3, atol=1e-9)


def test_phi_changes_sign_once_at_critical_surprisal():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(30, 40, generator=gen, dtype=torch.float64) * 2.5
    s_star = critical_surprisal(logits).double()
    entropy = _entropy(logits)
    assert bool(((s_star >= 0) & (s_star <= entropy + 1e-6)).all())
    for row in range(30):
        # every token of the vocabulary, sorted by surprisal
        tokens = torch.arange(40)
        phi = entropy_sensitivity(logits[row].expand(40, 40), tokens).double()
        surprisal = -torch.log_softmax(logits[row], -1)
        order = surprisal.argsort()
        signs = (phi[order] > 0).int()
        assert int((signs[1:] != signs[:-1]).sum()) <= 1  # positive then negative, one change
        assert bool((phi[surprisal < s_star[row] - 1e-4] > 0).all())
        assert bool((phi[surprisal > s_star[row] + 1e-4] < 0).all())


def test_uniform_distribution_has_zero_phi_and_zero_critical_point():
    logits = torch.zeros(1, 8)
    assert torch.allclose(entropy_sensitivity(logits, torch.tensor([3])), torch.zeros(1), atol=1e-6)


def test_chunked_statistics_match_direct_computation():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 37, 101, generator=gen)
    tokens = torch.randint(0, 101, (3, 37), generator=gen)
    stats = token_statistics(logits, tokens, chunk_size=16)
    logp_full = torch.log_softmax(logits, -1)
    assert torch.allclose(stats["logprob"], logp_full.gather(-1, tokens[..., None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(stats["entropy"], _entropy(logits), atol=1e-5)
    assert torch.allclose(token_entropy(logits, chunk_size=7), _entropy(logits), atol=1e-5)
    assert torch.allclose(token_logprobs(logits, tokens), stats["logprob"], atol=1e-5)


def test_entropy_with_grad_matches_autograd_of_direct_formula():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 9, 17, generator=gen, requires_grad=True)
    (g_chunked,) = torch.autograd.grad(token_entropy(logits, chunk_size=4, grad=True).sum(), logits)
    (g_direct,) = torch.autograd.grad(_entropy(logits).sum(), logits)
    assert torch.allclose(g_chunked, g_direct, atol=1e-6)
    assert not token_entropy(logits).requires_grad


def test_quadrants_and_negative_fraction():
    advantages = torch.tensor([1.0, -1.0])
    phi = torch.tensor([[0.5, -0.2, -0.1, 0.3], [0.1, -0.4, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    counts = quadrant_counts(advantages, phi, mask)
    assert counts == {"pos_high": 2, "pos_low": 1, "neg_high": 1, "neg_low": 3}
    selected = torch.tensor([[False, True, True, False], [False, False, False, False]])
    assert negative_sensitivity_fraction(selected, phi) == 1.0
    selected[0, 0] = True
    assert abs(negative_sensitivity_fraction(selected, phi) - 2 / 3) < 1e-9
    assert negative_sensitivity_fraction(torch.zeros_like(selected), phi) != negative_sensitivity_fraction(
        torch.zeros_like(selected), phi
    )  # NaN when nothing is selected
