"""The refill budget (rl.sampling_rounds) at load, and the per-step tool-use figures with the collapse warning."""

from __future__ import annotations

import logging

import pytest

from stare_agents.rollout.summary import summarize_episodes
from stare_agents.train.config import load_config, recipe_names
from stare_agents.train.rl_loop import ToolUseWatch
from stare_agents.trajectory import Trajectory, TurnRecord


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("rl.sampling_rounds=0", "rl.sampling_rounds"),
        ("rl.sampling_rounds=-2", "rl.sampling_rounds"),
        ("rl.sampling_rounds=1.5", "rl.sampling_rounds"),
        ("rl.sampling_rounds=two", "rl.sampling_rounds"),
        ("rl.sampling_rounds=true", "rl.sampling_rounds"),
        ("rl.sampling_rounds=65", "rl.sampling_rounds"),
        ("rl.sampling_batch_factor=0", "rl.sampling_batch_factor"),
        ("rl.max_empty_steps=-1", "rl.max_empty_steps"),
    ],
)
def test_a_budget_that_is_not_a_positive_bounded_integer_is_refused_with_its_key(override, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        load_config(recipe="smollm2-arith", overrides=[override])


def test_every_recipe_with_dynamic_sampling_states_a_refill_budget():
    """A step trains on the batch it names: every recipe that drops groups without reward variance refills them
    (the paper recipes with the official 10 rounds of 3 x the batch)."""
    for name in recipe_names():
        config = load_config(recipe=name)
        if config.algorithm().dynamic_sampling:
            assert config.rl.sampling_rounds >= 4, name


def _episode(calls: int, statuses: list[str], reward: float = 0.0) -> Trajectory:
    turn = TurnRecord("x", 3, "eos", tool_calls=calls, tool_statuses=statuses)
    return Trajectory([0], [1, 2, 3], [1, 1, 1], [-0.5] * 3, reward=reward, turns=[turn])


def test_tool_use_and_tool_error_shares_count_responses_not_calls():
    batch = [
        _episode(2, ["ok", "error"]),  # calls, one failed
        _episode(1, ["ok"]),  # calls, all fine
        _episode(3, ["timeout", "ok", "ok"]),  # calls, one timed out
        _episode(0, []),  # answers without the tool
    ]
    summary = summarize_episodes(batch)
    assert summary["tool_use_share"] == 3 / 4
    assert summary["tool_error_share"] == 2 / 4
    assert summarize_episodes([])["tool_use_share"] == 0.0


def test_tool_use_collapse_warns_once_below_half_of_the_first_step(caplog):
    watch = ToolUseWatch()
    with caplog.at_level(logging.WARNING, logger="stare_agents.train"):
        assert watch.check({"step": 0, "rollout/tool_use_share": 0.8}) is None
        assert watch.check({"step": 1, "rollout/tool_use_share": 0.41}) is None  # above half: quiet
        said = watch.check({"step": 2, "rollout/tool_use_share": 0.39})
        assert said is not None and "rollout/tool_use_share" in said and "0.80" in said
        assert watch.check({"step": 3, "rollout/tool_use_share": 0.0}) is None  # once
    assert caplog.text.count("tool-use collapse") == 1


def test_a_run_that_never_called_the_tool_is_not_a_collapse_and_a_resume_keeps_the_first_step():
    cot = ToolUseWatch()
    assert all(cot.check({"step": s, "rollout/tool_use_share": 0.0}) is None for s in range(3))
    resumed = ToolUseWatch()
    resumed.resume(
        [{"kind": "rl", "step": 1, "rollout/tool_use_share": 0.1}, {"step": 0, "rollout/tool_use_share": 0.9}]
    )
    assert resumed.check({"step": 5, "rollout/tool_use_share": 0.4}) is not None


def test_the_compare_recipe_is_the_default_job_plus_its_mid_run_evaluation():
    """Both arms of `--recipe smollm2-arith-compare --compare grpo-ds` run the default job's settings (the same
    task suite, cold start, sampling and refill budget): only the names, the mid-run evaluation, the checkpoint
    cadence and the progress bar differ."""
    import dataclasses

    default, compare = load_config(recipe="smollm2-arith"), load_config(recipe="smollm2-arith-compare")
    a, b = dataclasses.asdict(default), dataclasses.asdict(compare)
    for config in (a, b):
        for key in ("name", "out_dir", "eval", "checkpoint"):
            config.pop(key)
        config["logging"].pop("progress")
    assert a == b
    assert compare.rl.sampling_rounds == default.rl.sampling_rounds >= 4
