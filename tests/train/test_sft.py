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


def _same_history(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert {k: v for k, v in x.items() if k not in ("time_s", "tokens_per_s")} == pytest.approx(
            {k: v for k, v in y.items() if k not in ("time_s", "tokens_per_s")}, rel=1e-6, nan_ok=True
        )


def test_a_fit_cut_into_pieces_or_resumed_from_a_checkpoint_takes_the_same_steps(tmp_path):
    """max_steps stops a fit mid-epoch and the next call goes on; a checkpoint taken there and read into a new
    trainer (a new process after a crash) goes on the same way: same per-epoch figures, same steps, same
    weights as one uninterrupted fit (all in this process: a comparison of equal computations)."""
    from stare_agents.train.checkpoint import load_checkpoint

    trajectories = rollouts(13, groups=3, group_size=3)  # 9 traces, batch 4: 3 steps an epoch, the last short
    config = {"batch_size": 4, "epochs": 3, "seed": 2}
    whole = _trainer(**config)
    whole_steps: list = []
    whole_history = whole.fit(trajectories, on_step=whole_steps.append)
    assert not whole.fitting and whole.steps_done == 9

    pieces = _trainer(**config)
    steps: list = []
    history = []
    for _ in range(4):  # 2 + 2 + 2 + 2 steps: stops mid-epoch twice and at an epoch's end once
        history += pieces.fit(trajectories, on_step=steps.append, max_steps=2)
        assert pieces.fitting
    assert [h["epoch"] for h in history] == [1.0, 2.0] and pieces.steps_done == 8
    pieces.save_checkpoint({"traces": "x"}, tmp_path / "ckpt", tokenizer_dir=None)
    history += pieces.fit(trajectories, on_step=steps.append, max_steps=2)  # only 1 step was left
    assert not pieces.fitting and pieces.steps_done == 9
    _same_history(history, whole_history)
    assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in whole_steps], rel=1e-6)
    assert max_param_diff(pieces.model, whole.model) == 0.0

    fresh = _trainer(**config)  # as after a crash: the checkpoint of step 8 into a new trainer
    state = load_checkpoint(tmp_path / "ckpt")
    assert state["traces"] == "x"
    fresh.resume(tmp_path / "ckpt", state)
    assert fresh.fitting and fresh.steps_done == 8 and fresh.epochs_done == 2
    last = fresh.fit(trajectories)
    _same_history(last, whole_history[2:])
    assert max_param_diff(fresh.model, whole.model) == 0.0
    assert not fresh.fitting
    again = fresh.fit(trajectories, max_steps=1)  # a new fit of config.epochs starts after the last one ended
    assert again == [] and fresh.fitting and fresh.steps_done == 10


def test_fit_refuses_a_step_budget_below_one():
    trainer = _trainer()
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        trainer.fit(rollouts(1, groups=1, group_size=2), max_steps=0)


def test_the_traces_fingerprint_changes_with_any_token_or_mask_and_with_order():
    from stare_agents.train.sft import traces_fingerprint

    traces = rollouts(3, groups=2, group_size=2)
    base = traces_fingerprint(traces)
    assert traces_fingerprint(list(traces)) == base
    assert traces_fingerprint(traces[::-1]) != base
    flipped = Trajectory(
        prompt_ids=traces[0].prompt_ids,
        response_ids=traces[0].response_ids,
        action_mask=[0, *traces[0].action_mask[1:]],
        rollout_logprobs=[0.0, *traces[0].rollout_logprobs[1:]],
    )
    assert flipped.action_mask != traces[0].action_mask
    assert traces_fingerprint([flipped, *traces[1:]]) != base
    # [1, 23] then [4] is not [12, 3] then [4]: lengths are part of the digest
    a = Trajectory(prompt_ids=[1], response_ids=[23, 4], action_mask=[1, 1], rollout_logprobs=[0.0, 0.0])
    b = Trajectory(prompt_ids=[1, 23], response_ids=[4], action_mask=[1], rollout_logprobs=[0.0])
    assert traces_fingerprint([a]) != traces_fingerprint([b])
