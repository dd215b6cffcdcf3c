"""SFT on tool-interleaved traces: the loss is the NLL of the action tokens only."""

import math

import pytest
import torch
from learner_support import max_param_diff, rollouts, tiny_model

from stare_agents.train.policy import OptimizerConfig
from stare_agents.train.sft import SFT_METRICS, SFTConfig, SFTTrainer
from stare_agents.trajectory import Trajectory, collate


def _trainer(seed=0, **config):
    config.setdefault("optimizer", OptimizerConfig(lr=3e-3, eps=1e-5))
    return SFTTrainer(tiny_model(seed), SFTConfig(**config), pad_token_id=0)


def _with_observation_tail(trajectories, tail_ids):
    return [
        Trajectory(
            prompt_ids=t.prompt_ids,
            response_ids=[*t.response_ids, *tail_ids],
            action_mask=[*t.action_mask, *[0] * len(tail_ids)],
            rollout_logprobs=[*t.rollout_logprobs, *[0.0] * len(tail_ids)],
        )
        for t in trajectories
    ]


def test_sft_loss_is_the_action_token_nll_and_ignores_observation_tokens():
    trajectories = rollouts(11, groups=2, group_size=3)
    trainer = _trainer(micro_batch_tokens=80)
    batch = collate(trajectories, 0)
    with torch.no_grad():
        logits = trainer.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits
    p, r = batch.prompt_length, batch.response_length
    logp = torch.log_softmax(logits[:, p - 1 : p - 1 + r], -1).gather(-1, batch.response_ids[..., None])[
        ..., 0
    ]
    mask = batch.action_mask > 0
    expected = float(-logp[mask].mean())  # hand formula: mean NLL over action tokens only
    out = trainer.step(trajectories)
    assert out["loss"] == pytest.approx(expected, rel=1e-5)
    assert out["action_tokens"] == float(mask.sum())

    # observation tokens (here a tail after the last action token, with any ids) change nothing
    a = _trainer(micro_batch_tokens=80)
    b = _trainer(micro_batch_tokens=80)
    out_a = a.step(_with_observation_tail(trajectories, [3, 4, 5]))
    out_b = b.step(_with_observation_tail(trajectories, [400, 401, 402]))
    for key in ("loss", "entropy", "action_tokens", "grad_norm"):
        assert out_a[key] == pytest.approx(out_b[key], rel=1e-6)
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True))


def test_sft_micro_batches_equal_one_batch_and_epochs_lower_the_loss():
    trajectories = rollouts(12, groups=2, group_size=4)
    one = _trainer(micro_batch_tokens=10_000, batch_size=8, shuffle=False)
    many = _trainer(micro_batch_tokens=60, batch_size=8, shuffle=False)
    out_one, out_many = one.step(trajectories), many.step(trajectories)
    assert out_one["loss"] == pytest.approx(out_many["loss"], rel=1e-5)
    assert max_param_diff(one.model, many.model) < 1e-6
    trainer = _trainer(batch_size=4, epochs=4, seed=1)
    history = trainer.fit(trajectories)
    assert [tuple(h) for h in history] == [SFT_METRICS] * 4
    assert [h["epoch"] for h in history] == [1.0, 2.0, 3.0, 4.0] and history[0]["steps"] == 2.0
    assert history[-1]["loss"] < history[0]["loss"] - 0.5  # it learns the traces
    assert trainer.evaluate(trajectories) < history[0]["loss"]
    assert all(math.isfinite(h["grad_norm"]) for h in history)


def test_sft_refuses_empty_data_and_skips_traces_without_action_tokens():
    trainer = _trainer()
    with pytest.raises(ValueError, match="at least one"):
        trainer.fit([])
    blank = Trajectory(
        prompt_ids=[1, 2], response_ids=[3, 4], action_mask=[0, 0], rollout_logprobs=[0.0, 0.0]
    )
    out = trainer.step([blank])
    assert math.isnan(out["loss"]) and out["action_tokens"] == 0.0 and out["grad_norm"] == 0.0
    with pytest.raises(ValueError, match="batch_size"):
        SFTConfig(batch_size=0)
