import pytest
import torch

from stare_agents.algo import (
    AlgorithmConfig,
    PolicyLossConfig,
    aggregate,
    clipped_surrogate,
    loss_normalizer,
    policy_loss,
    stare_weights,
)


def _batch(seed=0, b=4, t=12):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen) * 3
    new = (old + torch.randn(b, t, generator=gen) * 0.3).requires_grad_(True)
    adv = torch.randn(b, generator=gen)
    mask = (torch.rand(b, t, generator=gen) > 0.3).float()
    return new, old, adv, mask


def test_clipped_surrogate_hand_computed():
    # one token each: ratio 1.5 with A = +1 (clipped at 1.28), ratio 0.5 with A = -1 (clipped at 0.8),
    # ratio 20 with A = -1 (dual clip: loss capped at c * |A| = 10), ratio 1.1 with A = +2 (unclipped).
    ratios = torch.tensor([[1.5, 0.5, 20.0, 1.1]])
    old = torch.zeros(1, 4)
    new = ratios.log()
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    mask = torch.ones(1, 4)
    loss, metrics = policy_loss(new, old, adv, mask)
    per_token = torch.tensor([-1.28, 0.8, 10.0, -2.2])
    assert loss.item() == pytest.approx(per_token.mean().item(), rel=1e-6)
    assert metrics["policy/clipfrac"].item() == pytest.approx(0.75)  # tokens 0, 1 and 2 carry no gradient


def test_gate_off_or_unit_weights_equal_grpo_exactly():
    new, old, adv, mask = _batch()
    base, _ = policy_loss(new, old, adv, mask)
    (grad_base,) = torch.autograd.grad(base, new)
    ones = stare_weights(-old, adv, mask, w=1.0, m=1.0, variant="C2")
    same, _ = policy_loss(new, old, adv, mask, token_weights=ones)
    (grad_same,) = torch.autograd.grad(same, new)
    assert torch.equal(base, same) and torch.equal(grad_base, grad_same)
    weighted, metrics = policy_loss(new, old, adv, mask, token_weights=stare_weights(-old, adv, mask))
    assert not torch.equal(base, weighted)
    assert 0 < metrics["stare/frac_weighted"].item() < 0.5


def test_weights_multiply_after_clipping():
    ratios = torch.tensor([[2.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0]])
    weights = torch.tensor([[1.1, 1.0]])
    loss, _ = policy_loss(ratios.log(), torch.zeros(1, 2), adv, torch.ones(1, 2), token_weights=weights)
    # token 0: clipped to 1.28 first, then weighted: -1.28 * 1.1; token 1: -1.0
    assert loss.item() == pytest.approx((-1.28 * 1.1 - 1.0) / 2, rel=1e-6)


def test_aggregations_hand_computed():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "token-mean", normalizer=8).item() == pytest.approx(10 / 8)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(per_token, mask, "sum")


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("cov_mode", ["none", "clip-cov", "kl-cov"])
def test_masked_positions_change_neither_loss_nor_gradient(aggregation, cov_mode):
    new, old, adv, mask = _batch(seed=5)
    adv_tok = adv[:, None].expand_as(old).clone()
    config = PolicyLossConfig(aggregation=aggregation, cov_mode=cov_mode, clip_cov_low=-10, clip_cov_high=10)

    def run(new_lp, old_lp, advantages):
        weights = stare_weights(-old_lp, advantages, mask, variant="C2")
        loss, _ = policy_loss(
            new_lp,
            old_lp,
            advantages,
            mask,
            config,
            token_weights=weights,
            generator=torch.Generator().manual_seed(0),
        )
        (grad,) = torch.autograd.grad(loss, new_lp)
        return loss, grad

    loss_a, grad_a = run(new, old, adv_tok)
    hidden = mask == 0
    old2, adv2 = old.clone(), adv_tok.clone()
    old2[hidden] = -50.0  # huge surprisal on observation tokens
    adv2[hidden] = 1e3
    new2 = new.detach().clone()
    new2[hidden] = 5.0
    new2.requires_grad_(True)
    loss_b, grad_b = run(new2, old2, adv2)
    assert loss_a.item() == pytest.approx(loss_b.item(), rel=1e-6, abs=1e-7)
    assert torch.allclose(grad_a[mask == 1], grad_b[mask == 1])
    assert bool((grad_b[hidden] == 0).all())


def test_entropy_bonus_needs_entropy_and_lowers_loss():
    new, old, adv, mask = _batch()
    config = PolicyLossConfig(entropy_coef=0.01)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(new, old, adv, mask, config)
    entropy = torch.full_like(old, 2.0)
    plain, _ = policy_loss(new, old, adv, mask)
    bonus, _ = policy_loss(new, old, adv, mask, config, entropy=entropy)
    assert bonus.item() == pytest.approx(plain.item() - 0.02, rel=1e-5)


def test_clip_cov_zeroes_exactly_k_tokens_in_band():
    b, t = 8, 500
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(b, t, generator=gen)
    new = old.clone().requires_grad_(True)  # ratio 1: nothing clipped by the ratio
    adv = torch.randn(b, t, generator=gen) * 3
    mask = torch.ones(b, t)
    config = PolicyLossConfig(cov_mode="clip-cov", clip_cov_ratio=0.01, clip_cov_low=-1e9, clip_cov_high=1e9)
    loss, _ = policy_loss(new, old, adv, mask, config, generator=torch.Generator().manual_seed(1))
    (grad,) = torch.autograd.grad(loss, new)
    assert int((grad == 0).sum()) == int(0.01 * b * t)  # 40 tokens excluded
    # an empty band excludes nothing
    none = PolicyLossConfig(cov_mode="clip-cov", clip_cov_low=1e8, clip_cov_high=1e9)
    loss2, _ = policy_loss(new, old, adv, mask, none)
    (grad2,) = torch.autograd.grad(loss2, new)
    assert int((grad2 == 0).sum()) == 0


def test_kl_cov_penalises_top_covariance_tokens():
    logp_old = torch.tensor([[-1.0, -2.0, -3.0, -0.5]])
    new = (logp_old + torch.tensor([[0.1, 0.1, 0.1, 0.1]])).requires_grad_(True)
    adv = torch.tensor([[2.0, 0.0, -1.0, 1.0]])
    mask = torch.ones(1, 4)
    config = PolicyLossConfig(cov_mode="kl-cov", kl_cov_ratio=0.25, kl_cov_coef=1.0)
    loss, _ = policy_loss(new, logp_old, adv, mask, config)
    # cov_t = (A - 0.5)(logp - mean logp); largest at token 3: (0.5)(1.275) vs token 0: 1.5 * 0.775 = 1.16
    ratio = torch.exp(torch.tensor(0.1))
    expected = (-2 * ratio + 0 + ratio - ratio + 0.1) / 4  # token 0 gets +|0.1|; no ratio clipping in kl-cov
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_presets_are_complete_and_validated():
    for name in (
        "grpo",
        "grpo-ds",
        "dapo",
        "stare",
        "stare-c2",
        "entropy-bonus",
        "clip-cov",
        "kl-cov",
        "entrocraft",
    ):
        assert AlgorithmConfig.preset(name).name == name
    assert AlgorithmConfig.preset("stare").stare.w == 1.1
    assert AlgorithmConfig.preset("grpo").loss.clip_high == 0.2
    assert AlgorithmConfig.preset("stare-c2").stare.variant == "C2"
    with pytest.raises(ValueError, match="preset"):
        AlgorithmConfig.preset("ppo-magic")
    with pytest.raises(ValueError, match="cov_mode"):
        PolicyLossConfig(cov_mode="cov")


@pytest.mark.parametrize("sentinel", [-1e9, float("-inf")])
def test_sentinel_old_logprobs_give_finite_loss_and_gradient(sentinel):
    # old log-prob -1e9 / -inf on action tokens: the log-ratio is clamped to 20 before exp, so the ratio
    # is e^20 and the clip stops the gradient instead of producing inf * 0 = NaN
    new = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[sentinel, sentinel, -0.5]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, metrics = policy_loss(new, old, adv, torch.ones(1, 3))
    (grad,) = torch.autograd.grad(loss, new)
    # token 0: A > 0, ratio clipped at 1.28 -> -1.28; token 1: A < 0, dual clip -> c * |A| = 10; token 2: -2
    assert loss.item() == pytest.approx((-1.28 + 10.0 - 2.0) / 3, rel=1e-6)
    assert torch.equal(grad, torch.tensor([[0.0, 0.0, -2.0 / 3]]))
    assert all(torch.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("cov_mode", ["none", "clip-cov", "kl-cov"])
def test_all_masked_input_contributes_exactly_nothing(aggregation, cov_mode):
    new = torch.tensor([[float("nan"), -1.0], [-2.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1e9, float("nan")], [float("inf"), -3.0]])
    adv = torch.tensor([[float("inf"), 1.0], [-1.0, float("nan")]])
    entropy = torch.tensor([[float("nan"), 1.0], [2.0, 3.0]], requires_grad=True)
    config = PolicyLossConfig(aggregation=aggregation, cov_mode=cov_mode, entropy_coef=0.01)
    loss, metrics = policy_loss(
        new,
        old,
        adv,
        torch.zeros(2, 2),
        config,
        token_weights=torch.full((2, 2), 1.1),
        entropy=entropy,
        normalizer=7.0,
    )
    grad_new, grad_entropy = torch.autograd.grad(loss, (new, entropy))
    assert loss.item() == 0.0
    assert torch.equal(grad_new, torch.zeros(2, 2)) and torch.equal(grad_entropy, torch.zeros(2, 2))
    assert all(torch.isfinite(v) for v in metrics.values())


def test_non_finite_values_at_masked_positions_never_reach_the_loss():
    new, old, adv, mask = _batch(seed=7)
    adv_tok = adv[:, None].expand_as(old).clone()
    entropy = torch.rand_like(old).requires_grad_(True)
    config = PolicyLossConfig(entropy_coef=0.1)
    loss_a, _ = policy_loss(new, old, adv_tok, mask, config, entropy=entropy)
    hidden = mask == 0
    new2, old2, adv2, ent2 = new.detach().clone(), old.clone(), adv_tok.clone(), entropy.detach().clone()
    new2[hidden], old2[hidden], adv2[hidden], ent2[hidden] = (
        float("nan"),
        float("-inf"),
        float("inf"),
        float("nan"),
    )
    new2.requires_grad_(True)
    ent2.requires_grad_(True)
    loss_b, _ = policy_loss(new2, old2, adv2, mask, config, entropy=ent2)
    assert loss_a.item() == pytest.approx(loss_b.item(), rel=1e-6)
    grad_b = torch.autograd.grad(loss_b, (new2, ent2))
    assert all(bool(torch.isfinite(g).all()) and bool((g[hidden] == 0).all()) for g in grad_b)


def test_importance_weights_multiply_the_clipped_surrogate_and_are_detached():
    ratios = torch.tensor([[2.0, 1.0]])
    new = ratios.log().requires_grad_(True)
    is_weights = torch.tensor([[0.5, 2.0]], requires_grad=True)
    loss, _ = policy_loss(
        new, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), importance_weights=is_weights
    )
    assert loss.item() == pytest.approx((-1.28 * 0.5 - 1.0 * 2.0) / 2, rel=1e-6)
    assert torch.autograd.grad(loss, is_weights, allow_unused=True)[0] is None


def test_loss_normalizer_counts_tokens_or_sequences_with_tokens():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert loss_normalizer(mask, "token-mean") == 3.0
    assert loss_normalizer(mask, "seq-mean-token-sum") == 2.0
    assert loss_normalizer(mask, "seq-mean-token-mean") == 2.0
    assert loss_normalizer(torch.zeros(2, 2), "token-mean") == 0.0  # aggregate divides by at least 1
    # micro-batches normalised by the step's count sum to the whole batch's loss
    per_token = torch.tensor([[1.0, 2.0, 9.0], [5.0, 5.0, 5.0], [4.0, 9.0, 9.0]])
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        whole = aggregate(per_token, mask, agg)
        total = loss_normalizer(mask, agg)
        parts = aggregate(per_token[:2], mask[:2], agg, total) + aggregate(
            per_token[2:], mask[2:], agg, total
        )
        assert parts.item() == pytest.approx(whole.item())


def test_clipped_surrogate_alone_hand_computed():
    config = PolicyLossConfig()
    ratio = torch.tensor([1.5, 0.5, 20.0, 1.1, 0.7])
    adv = torch.tensor([1.0, -1.0, -1.0, 2.0, 1.0])
    per_token, stopped = clipped_surrogate(ratio, adv, config)
    # ratio 0.7 with A > 0: max(-0.7, -0.8) = -0.7 (the clip never raises a lower objective): not stopped
    assert per_token.tolist() == pytest.approx([-1.28, 0.8, 10.0, -2.2, -0.7])
    assert stopped.tolist() == [True, True, True, False, False]
