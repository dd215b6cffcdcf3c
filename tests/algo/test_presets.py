"""Every preset differs from GRPO-ds in exactly the fields it claims, and each of those fields changes
what the algorithm computes (the learner-level effect is in tests/train/test_learner_presets.py)."""

from dataclasses import fields, is_dataclass

import pytest
import torch

from stare_agents.algo import AlgorithmConfig, Stare, compute_advantages, policy_loss


def _flat(config, prefix=""):
    out = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if is_dataclass(value):
            out[prefix + f.name] = type(value).__name__
            out.update(_flat(value, prefix + f.name + "."))
        else:
            out[prefix + f.name] = value
    return out


CLAIMS = {
    "grpo": {"dynamic_sampling", "loss.clip_high", "loss.aggregation"},
    "grpo-ds": set(),
    "dapo": {"overlong_shaping"},
    "stare": {"stare"},
    "stare-c2": {"stare", "stare.variant"},
    "entropy-bonus": {"loss.entropy_coef"},
    "clip-cov": {"loss.cov_mode"},
    "kl-cov": {"loss.cov_mode"},
    "entrocraft": {"entrocraft"},
}


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_preset_differs_from_grpo_ds_in_exactly_its_claimed_fields(name):
    base, preset = _flat(AlgorithmConfig.preset("grpo-ds")), _flat(AlgorithmConfig.preset(name))
    differing = {k for k in base.keys() | preset.keys() if base.get(k) != preset.get(k)} - {"name"}
    top_level = {k.split(".")[0] for k in differing if k.split(".")[0] in ("stare", "entrocraft")}
    differing = {k for k in differing if k.split(".")[0] not in top_level} | top_level
    assert differing == CLAIMS[name] - {"stare.variant"} | ({"stare"} if "stare" in CLAIMS[name] else set())
    assert AlgorithmConfig.preset(name).name == name


def _loss(name, *, ratio, adv, mask, entropy=None, weights=None, old=None):
    config = AlgorithmConfig.preset(name)
    old = torch.zeros_like(ratio) if old is None else old
    new = (old + ratio.log()).requires_grad_(True)
    loss, _ = policy_loss(
        new,
        old,
        adv,
        mask,
        config.loss,
        token_weights=weights,
        entropy=entropy,
        generator=torch.Generator().manual_seed(0),
    )
    (grad,) = torch.autograd.grad(loss, new)
    return loss.item(), grad


def test_grpo_clips_symmetrically_and_averages_per_sequence():
    ratio = torch.tensor([[1.25, 1.0, 1.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, 1.0])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    grpo, _ = _loss("grpo", ratio=ratio, adv=adv, mask=mask)
    ds, _ = _loss("grpo-ds", ratio=ratio, adv=adv, mask=mask)
    # GRPO: clip at 1.2 and mean of per-sequence means: (-1.2 + -1) / 2; GRPO-ds: no clip at 1.25, token-mean
    assert grpo == pytest.approx(-1.1) and ds == pytest.approx((-1.25 - 3.0) / 4)


def test_dynamic_sampling_and_overlong_presets_change_the_advantages():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])
    lengths = torch.tensor([10, 4096, 10, 10])
    out = {
        name: compute_advantages(
            rewards, 2, AlgorithmConfig.preset(name), response_lengths=lengths, max_response_length=4096
        )
        for name in ("grpo", "grpo-ds", "dapo")
    }
    assert out["grpo"].keep.all() and out["grpo-ds"].keep.tolist() == [False, False, True, True]
    assert torch.equal(out["grpo-ds"].rewards, rewards) and out["dapo"].rewards[1].item() == 0.0  # 1 - 1


def test_stare_presets_reweight_l_plus_and_c2_also_l_minus():
    surprisal = torch.tensor([[0.1, 3.0], [2.0, 0.1]])
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    for name, expected in (("stare", [[1.0, 1.1], [1.0, 1.0]]), ("stare-c2", [[1.0, 1.1], [0.9, 1.0]])):
        stare = Stare(AlgorithmConfig.preset(name).stare)
        stare.update(0.1)  # below the target 0.3: on
        assert torch.allclose(stare.weights(surprisal, adv, mask), torch.tensor(expected))


def test_entropy_bonus_clip_cov_and_kl_cov_change_the_loss():
    gen = torch.Generator().manual_seed(0)
    ratio = torch.exp(torch.randn(4, 64, generator=gen) * 0.05)
    old = -torch.rand(4, 64, generator=gen) * 6  # log-probs spread enough for covariances in [1, 5]
    adv = torch.randn(4, 64, generator=gen) * 3
    mask = torch.ones(4, 64)
    entropy = torch.full((4, 64), 2.0)
    ds, ds_grad = _loss("grpo-ds", ratio=ratio, adv=adv, mask=mask, entropy=entropy, old=old)
    bonus, _ = _loss("entropy-bonus", ratio=ratio, adv=adv, mask=mask, entropy=entropy, old=old)
    assert bonus == pytest.approx(ds - 1e-3 * 2.0, abs=1e-6)
    _, clip_grad = _loss("clip-cov", ratio=ratio, adv=adv, mask=mask, old=old)
    zeroed = (clip_grad == 0) & (ds_grad != 0)
    assert int(zeroed.sum()) == 1  # max(1, int(2e-4 * 256)) in-band token loses its gradient
    kl, _ = _loss("kl-cov", ratio=ratio, adv=adv, mask=mask, old=old)
    assert kl != pytest.approx(ds, abs=1e-6)


def test_entrocraft_preset_switches_advantage_signs_by_entropy():
    switch = AlgorithmConfig.preset("entrocraft").entrocraft
    adv = torch.tensor([1.0, -1.0])
    assert switch.apply(adv, mean_entropy=0.9, step=0).tolist() == [1.0, 0.0]
    assert switch.apply(adv, mean_entropy=0.1, step=0).tolist() == [0.0, -1.0]
    assert AlgorithmConfig.preset("grpo-ds").entrocraft is None
