"""The rollout/learner mismatch figures and the importance-sampling correction, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from stare_agents.algo.importance import (
    ImportanceConfig,
    importance_weights,
    mismatch_sums,
    mismatch_warning,
)

# two sequences; the second has an observation token (mask 0) and padding
MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.0, 0.0, -2.0, 0.0]])
# learner - rollout per action token: 0.1, -0.2, 1.0, -1.0 | 0.3, (obs), -0.6
LEARNER = ROLLOUT + torch.tensor([[0.1, -0.2, 1.0, -1.0], [0.3, 5.0, -0.6, 7.0]])
LOG_R = [0.1, -0.2, 1.0, -1.0, 0.3, -0.6]


def test_mismatch_sums_by_hand():
    sums = mismatch_sums(LEARNER, ROLLOUT, MASK)
    assert sums["abs_diff"] == pytest.approx(sum(abs(x) for x in LOG_R), rel=1e-6)
    assert sums["kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in LOG_R), rel=1e-6)
    assert sums["outside"] == sum(not 0.9 <= math.exp(x) <= 1.1 for x in LOG_R) == 6  # e^0.1 = 1.105 too
    assert sums["max_abs"] == pytest.approx(1.0)
    empty = mismatch_sums(LEARNER, ROLLOUT, torch.zeros_like(MASK))
    assert empty == {"abs_diff": 0.0, "kl": 0.0, "outside": 0.0, "max_abs": 0.0}


def test_truncated_and_masked_weights_per_token_by_hand():
    weights, capped, masked = importance_weights(LEARNER, ROLLOUT, MASK, ImportanceConfig(cap=2.0))
    expected = [min(math.exp(x), 2.0) for x in LOG_R]
    assert weights[MASK > 0].tolist() == pytest.approx(expected, rel=1e-6)
    assert weights[MASK == 0].tolist() == [1.0, 1.0]  # observation and padding: untouched
    assert capped[MASK > 0].tolist() == [False, False, True, False, False, False]
    assert not masked.any()

    weights, capped, masked = importance_weights(LEARNER, ROLLOUT, MASK, ImportanceConfig(mask=(0.5, 2.0)))
    keep = [0.5 <= math.exp(x) <= 2.0 for x in LOG_R]  # e^1 = 2.72 and e^-1 = 0.37 leave
    assert masked[MASK > 0].tolist() == [not k for k in keep]
    assert weights[MASK > 0].tolist() == pytest.approx(
        [math.exp(x) if k else 0.0 for x, k in zip(LOG_R, keep, strict=True)]
    )
    assert not capped.any()

    both, _, _ = importance_weights(LEARNER, ROLLOUT, MASK, ImportanceConfig(cap=1.2, mask=(0.5, 2.0)))
    assert both[MASK > 0].tolist() == pytest.approx(
        [min(math.exp(x), 1.2) if k else 0.0 for x, k in zip(LOG_R, keep, strict=True)]
    )


def test_sequence_level_uses_the_geometric_mean_of_the_sequences_ratios():
    first = sum(LOG_R[:4]) / 4  # -0.025; the second sequence: (0.3 - 0.6) / 2 = -0.15
    weights, _, masked = importance_weights(
        LEARNER, ROLLOUT, MASK, ImportanceConfig(cap=2.0, mask=(0.9, 1.1), level="sequence")
    )
    assert weights[0].tolist() == pytest.approx([math.exp(first)] * 4)
    # e^-0.15 = 0.86 < 0.9: the whole second sequence leaves the loss, its non-action positions keep 1
    assert masked[1].tolist() == [True, False, True, False]
    assert weights[1].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_equal_log_probs_give_weights_of_exactly_one_at_every_level():
    for config in (
        ImportanceConfig(cap=2.0),
        ImportanceConfig(mask=(0.5, 2.0)),
        ImportanceConfig(cap=1.5, mask=(0.8, 1.25), level="sequence"),
    ):
        weights, capped, masked = importance_weights(ROLLOUT, ROLLOUT, MASK, config)
        assert torch.equal(weights, torch.ones_like(weights)), config
        assert not capped.any() and not masked.any()


def test_hostile_log_probs_give_finite_weights():
    rollout = torch.tensor([[-1e9, float("-inf"), -1.0]])
    learner = torch.tensor([[-1.0, -1.0, float("-inf")]])
    mask = torch.ones_like(rollout)
    for config in (ImportanceConfig(cap=2.0), ImportanceConfig(mask=(0.5, 2.0), level="sequence")):
        weights, _, _ = importance_weights(learner, rollout, mask, config)
        assert torch.isfinite(weights).all()
    sums = mismatch_sums(learner, rollout, mask)
    assert all(math.isfinite(v) for v in sums.values()) and sums["max_abs"] == 20.0


@pytest.mark.parametrize(
    "bad",
    [
        {"cap": 0.0},
        {"cap": -1.0},
        {"mask": (1.2, 2.0)},
        {"mask": (0.5, 0.9)},
        {"mask": (0.5,)},
        {"level": "x"},
    ],
)
def test_bad_configs_are_refused(bad):
    with pytest.raises(ValueError, match="importance"):
        ImportanceConfig(**bad)


def test_the_warning_fires_on_a_forged_mismatch_and_names_the_remedies():
    quiet = {"mismatch/kl": 2e-4, "mismatch/ratio_outside": 0.002}
    assert mismatch_warning(quiet, corrected=False, fp32_head=False) is None
    assert mismatch_warning({"mismatch/kl": float("nan")}, corrected=False, fp32_head=False) is None
    healthy_bf16 = {"mismatch/kl": 2.7e-3, "mismatch/ratio_outside": 0.073}  # the largest of 35 measured steps
    assert mismatch_warning(healthy_bf16, corrected=False, fp32_head=False) is None
    assert mismatch_warning({"mismatch/kl": 0.0, "mismatch/ratio_outside": 0.11}, corrected=True, fp32_head=True)
    loud = {"mismatch/kl": 2.6e-2, "mismatch/ratio_outside": 0.09}  # an engine left on its first weights
    message = mismatch_warning(loud, corrected=False, fp32_head=False)
    assert "0.026" in message and "9.0%" in message and "warn above 0.005" in message
    assert "model.fp32_lm_head" in message and "importance.cap" in message
    fixed = mismatch_warning(loud, corrected=True, fp32_head=True)
    assert "fp32_lm_head" not in fixed and "importance.cap" not in fixed and "float32" in fixed
