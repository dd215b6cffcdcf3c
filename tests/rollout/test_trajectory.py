"""The trajectory contract: validation, JSONL round trip, collation layout (hand-computed)."""

from __future__ import annotations

import json

import pytest
import torch

from stare_agents.trajectory import STOP_REASONS, Trajectory, TurnRecord, collate, read_jsonl, write_jsonl


def make(prompt, response, mask, logprobs=None, **kwargs) -> Trajectory:
    logprobs = logprobs if logprobs is not None else [-0.5 if bit else 0.0 for bit in mask]
    return Trajectory(
        prompt_ids=prompt, response_ids=response, action_mask=mask, rollout_logprobs=logprobs, **kwargs
    )


def test_validation_rejects_inconsistent_records():
    with pytest.raises(ValueError, match="same length"):
        make([1], [2, 3], [1])
    with pytest.raises(ValueError, match="only 0 and 1"):
        make([1], [2], [2])
    with pytest.raises(ValueError, match=r"0\.0 where action_mask is 0"):
        make([1], [2], [0], [-1.0])
    with pytest.raises(ValueError, match="stop_reason"):
        make([1], [2], [1], stop_reason="done")
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        make([], [2], [1])
    with pytest.raises(ValueError, match="finite"):
        make([1], [2], [1], reward=float("nan"))
    failed = make([], [], [], stop_reason="env_error", error="boom")  # a failed reset has no prompt
    assert failed.failed and not make([1], [2], [1]).failed
    assert set(STOP_REASONS) >= {"answered", "turn_limit", "token_budget", "context_overflow", "env_error"}


def test_jsonl_round_trip_and_torn_last_line(tmp_path):
    first = make(
        [1, 2], [3, 4, 5], [1, 0, 1], reward=1.0, turns=[TurnRecord("a", 1, "stop", 1, ["ok"], "x", 1)]
    )
    second = make([7], [8], [1], info={"task_id": "t", "nested": {"k": [1, 2]}}, group_id="g", sample_index=3)
    path = tmp_path / "t.jsonl"
    assert write_jsonl([first, second], path) == 2
    assert read_jsonl(path) == [first, second]
    with open(path, "a") as handle:
        handle.write(json.dumps(first.to_dict())[:25])  # a writer killed mid-line
    assert read_jsonl(path) == [first, second]
    path.write_text("not json\n" + json.dumps(first.to_dict()) + "\n")
    with pytest.raises(ValueError, match=":1: not a JSON trajectory"):
        read_jsonl(path)
    with pytest.raises(ValueError, match="unknown trajectory fields"):
        Trajectory.from_dict({**first.to_dict(), "extra": 1})


def test_collate_layout_left_pads_prompts_and_right_pads_responses():
    a = make([11, 12, 13], [21, 22], [1, 1], [-0.1, -0.2], reward=1.0)
    b = make([14], [23, 24, 25, 26], [1, 0, 0, 1], [-0.3, 0.0, 0.0, -0.4], reward=0.0)
    batch = collate([a, b], pad_token_id=0)
    assert batch.prompt_length == 3 and batch.response_length == 4
    assert batch.input_ids.tolist() == [[11, 12, 13, 21, 22, 0, 0], [0, 0, 14, 23, 24, 25, 26]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 1, 2, 3, 4]]
    assert batch.response_ids.tolist() == [[21, 22, 0, 0], [23, 24, 25, 26]]
    assert batch.action_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 1]]
    assert torch.allclose(batch.rollout_logprobs, torch.tensor([[-0.1, -0.2, 0, 0], [-0.3, 0, 0, -0.4]]))
    assert batch.rewards.tolist() == [1.0, 0.0]
    # the logits that score response token j sit at input position P - 1 + j
    p = batch.prompt_length
    assert batch.input_ids[1, p - 1 + 1 + 1].item() == batch.response_ids[1, 1].item()
    with pytest.raises(ValueError, match="without a prompt"):
        collate([make([], [], [], stop_reason="engine_error")], pad_token_id=0)
