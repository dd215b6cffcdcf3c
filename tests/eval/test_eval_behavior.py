"""Reflection-word counts and tool-use statistics against hand-counted values."""

from __future__ import annotations

import pytest

from stare_agents.eval.behavior import (
    REFLECTION_CATEGORIES,
    SUMMARY_KEYS,
    ResponseStats,
    behavior_summary,
    reflection_counts,
    response_stats,
    summarize_responses,
)
from stare_agents.trajectory import Trajectory, TurnRecord


def counts(**nonzero: int) -> dict[str, int]:
    return {category: nonzero.get(category, 0) for category in REFLECTION_CATEGORIES}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", counts()),
        ("The answer is 12.", counts()),
        ("Wait, let me re-check that. But 3*4 = 12.", counts(hesitation=1, contrast=1, revision=1)),
        ("WAIT. wait! Hmmm... hold on", counts(hesitation=4)),
        ("However, although x, though y, but z", counts(contrast=4)),
        ("Alternatively, instead use another approach. On second thought, no.", counts(alternative=4)),
        (
            "Let me double-check; verify; verification; I checked; check; confirm; make sure",
            counts(verification=7),
        ),
        (
            "Let me recompute. Let's reconsider. I should re-evaluate. A mistake! I was wrong.",
            counts(revision=5),
        ),
        # whole words only: none of these are reflection words
        ("butter, awaits, checkers, rechecking? no: rechecking is", counts(revision=2)),
        ("abut waiting unverified", counts()),
        # phrases count once, in one category
        ("double-check", counts(verification=1)),
        ("let me re-check", counts(revision=1)),
        ("re-check", counts(revision=1)),
    ],
)
def test_reflection_counts(text: str, expected: dict[str, int]) -> None:
    assert reflection_counts(text) == expected


def test_reflection_counts_hostile_input() -> None:
    with pytest.raises(TypeError, match="str"):
        reflection_counts(None)  # type: ignore[arg-type]
    long = "wait " * 20000 + "\x00\ud800 ünïcödé but"
    assert reflection_counts(long) == counts(hesitation=20000, contrast=1)


def trajectory(
    turn_texts: list[str],
    statuses: list[list[str]],
    *,
    tokens: int = 10,
    correct: bool = False,
    stop_reason: str = "answered",
    void_turns: int = 0,
    group: str = "g",
) -> Trajectory:
    turns = [
        TurnRecord(text=text, num_tokens=tokens, finish_reason="stop", tool_calls=len(st), tool_statuses=st)
        for text, st in zip(turn_texts, statuses, strict=True)
    ]
    n = tokens * len(turns) + 3  # 3 observation tokens
    mask = [1] * (tokens * len(turns)) + [0] * 3
    return Trajectory(
        prompt_ids=[1, 2],
        response_ids=list(range(n)),
        action_mask=mask,
        rollout_logprobs=[-0.5 if m else 0.0 for m in mask],
        reward=float(correct),
        num_turns=len(turns),
        stop_reason=stop_reason,
        turns=turns,
        info={"void_turns": void_turns, "tool_calls": 99},
        group_id=group,
        correct=correct,
    )


def test_response_stats_counts_turn_statuses() -> None:
    t = trajectory(["Let me check.\n```python\nprint(1)\n```", "Wait, but \\boxed{1}"], [["ok", "error"], []])
    stats = response_stats(t)
    assert stats == ResponseStats(
        response_tokens=20,
        response_chars=len("Let me check.\n```python\nprint(1)\n```") + 1 + len("Wait, but \\boxed{1}"),
        turns=2,
        tool_calls=2,  # from the turn records, not info's 99
        tool_errors=1,
        tool_timeouts=0,
        void_turns=0,
        correct=False,
        failed=False,
        stop_reason="answered",
        reflection=counts(hesitation=1, contrast=1, verification=1),
    )
    assert ResponseStats.from_dict(stats.to_dict()) == stats


def test_behavior_summary_hand_computed() -> None:
    trajectories = [
        # 2 turns, 2 calls (1 error, 1 timeout), correct, 20 tokens; reflection: wait
        trajectory(["wait ```python\n1\n```", "\\boxed{2}"], [["error", "timeout"], []], correct=True),
        # 1 turn, no call, a void turn, 10 tokens, wrong; reflection: but, check
        trajectory(["but check"], [[]], void_turns=1),
        # 3 turns, 1 ok call per turn for the first two, wrong, 5 tokens each (15)
        trajectory(["a", "b", "c"], [["ok"], ["ok"], []], tokens=5, stop_reason="turn_limit"),
        # a failed rollout: counted, left out of every mean
        trajectory(["wait wait wait"], [["ok"]], tokens=50, stop_reason="engine_error"),
    ]
    summary = behavior_summary(trajectories)
    assert tuple(summary) == SUMMARY_KEYS
    assert summary["responses"] == 4 and summary["failed"] == 1
    assert summary["turns_mean"] == pytest.approx(2.0)  # (2 + 1 + 3) / 3
    assert summary["response_tokens_mean"] == pytest.approx(15.0)  # (20 + 10 + 15) / 3
    assert summary["response_tokens_correct_mean"] == pytest.approx(20.0)
    assert summary["response_tokens_wrong_mean"] == pytest.approx(12.5)
    assert summary["tool_calls_per_response"] == pytest.approx(4 / 3)
    assert summary["tool_call_rate"] == pytest.approx(2 / 3)
    assert summary["tool_error_rate"] == pytest.approx(2 / 4)  # every call that did not end ok: error, timeout
    assert summary["tool_timeout_rate"] == pytest.approx(1 / 4)
    assert summary["void_turns_per_response"] == pytest.approx(1 / 3)
    assert summary["void_turn_rate"] == pytest.approx(1 / 3)
    assert summary["stop_reason/answered"] == pytest.approx(0.5)
    assert summary["stop_reason/turn_limit"] == pytest.approx(0.25)
    assert summary["stop_reason/engine_error"] == pytest.approx(0.25)
    assert summary["stop_reason/token_budget"] == 0.0
    assert summary["reflection/total_per_response"] == pytest.approx(1.0)  # (1 + 2 + 0) / 3
    assert summary["reflection/hesitation_per_response"] == pytest.approx(1 / 3)
    assert summary["reflection/verification_rate"] == pytest.approx(1 / 3)
    assert summary["reflection/revision_rate"] == 0.0


def test_summary_of_nothing_is_none_not_zero() -> None:
    empty = summarize_responses([])
    assert empty["responses"] == 0 and empty["turns_mean"] is None and empty["tool_error_rate"] is None
    only_failed = behavior_summary([trajectory(["x"], [[]], stop_reason="env_error")])
    assert only_failed["failed"] == 1 and only_failed["response_tokens_mean"] is None
    assert only_failed["stop_reason/env_error"] == 1.0
    no_calls = behavior_summary([trajectory(["x"], [[]])])
    assert no_calls["tool_calls_per_response"] == 0.0 and no_calls["tool_error_rate"] is None


def test_training_and_evaluation_mean_the_same_by_tool_error_rate():
    """One meaning for training (rollout/summary.py) and evaluation (behaviour summary): the share of tool
    calls that did not end ok, a timeout or a call past a turn's cap included."""
    from stare_agents.rollout.summary import summarize_episodes, tool_outcomes

    turns = [
        TurnRecord("a", 3, "stop", tool_calls=3, tool_statuses=["ok", "timeout", "error"]),
        TurnRecord("b", 3, "stop", tool_calls=4, tool_statuses=["ok", "ok", "error"]),  # 2 past the cap
        TurnRecord("\\\\boxed{1}", 3, "eos"),
    ]
    episode = Trajectory(
        [0], [1] * 9, [1] * 9, [-0.1] * 9, reward=1.0, correct=True, num_turns=3, turns=turns
    )
    assert tool_outcomes(episode) == (7, 4, 1)  # timeout, error, and the two past the cap
    training = summarize_episodes([episode])["tool_error_rate"]
    evaluation = behavior_summary([episode])["tool_error_rate"]
    assert training == evaluation == pytest.approx(4 / 7)
    assert behavior_summary([episode])["tool_timeout_rate"] == pytest.approx(1 / 7)


def test_training_and_evaluation_summaries_share_names_only_where_they_mean_the_same():
    """The figures both summaries have (training's summarize_episodes, evaluation's behaviour summary) are the
    same figures: over the episodes that ran (a failed one is counted apart), response tokens = sampled ones."""
    from stare_agents.rollout.summary import summarize_episodes

    turns = [TurnRecord("a", 3, "stop", tool_calls=2, tool_statuses=["ok", "error"]), TurnRecord("b", 2, "eos")]
    mask = [1] * 4 + [0] * 3 + [1] * 2  # 6 sampled tokens around an observation of 3
    logprobs = [-0.1 * bit for bit in mask]
    ran = Trajectory([0], [1] * 9, mask, logprobs, correct=True, num_turns=2, turns=turns)
    one_turn = Trajectory([0], [1] * 3, [1] * 3, [-0.1] * 3, num_turns=1, turns=[TurnRecord("c", 3, "eos")])
    failed = trajectory(["x"], [[]], stop_reason="env_error")
    episodes = [ran, one_turn, failed]
    training, evaluation = summarize_episodes(episodes), behavior_summary(episodes)
    shared = set(training) & set(evaluation)
    assert shared == {"failed", "turns_mean", "tool_calls_per_response", "response_tokens_mean", "tool_error_rate"}
    assert {k: training[k] for k in shared} == {k: evaluation[k] for k in shared}
    assert training["turns_mean"] == 1.5 and training["response_tokens_mean"] == 4.5  # (6 + 3) / 2
    assert training["tool_calls_per_response"] == 1.0 and training["tool_error_rate"] == 0.5
