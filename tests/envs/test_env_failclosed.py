"""Hostile answers and tool output cannot buy time or context: many distinct boxes are not all graded, and
an observation's cap bounds its tokens, not only its characters. Also: `sandbox: none` runs nothing."""

from __future__ import annotations

import gymnasium as gym
import pytest

from stare_agents.envs.grading import MAX_GRADED_BOXES, MathGrader
from stare_agents.envs.parsing import truncate_middle
from stare_agents.sandbox import NoSandbox

SLOW = "9^{{9^{{9^{{9^{{{}}}}}}}}}"  # each of these costs the grader its whole timeout


def test_nine_distinct_boxes_are_not_nine_timeouts() -> None:
    with MathGrader(timeout_s=1.0, workers=1) as grader:
        hedge = ", ".join(f"\\boxed{{{SLOW.format(k)}}}" for k in range(2, 11))
        result = grader.grade(hedge, "1")
        assert (result.correct, result.reason) == (False, "wrong") and "a hedge" in result.detail
        assert grader.stats.requests == 0  # more than MAX_GRADED_BOXES: wrong without grading
        few = " and ".join(f"\\boxed{{{SLOW.format(k)}}}" for k in range(2, 2 + MAX_GRADED_BOXES))
        result = grader.grade(few, "1")
        assert not result.correct and grader.stats.requests == 1  # the first slow box settles it
        assert grader.grade("\\boxed{2} or \\boxed{2.0}", "2").correct  # equal boxes still grade


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from stare_agents.models import prepare_model

    return AutoTokenizer.from_pretrained(prepare_model("tiny", out=tmp_path_factory.mktemp("m") / "tiny"))


@pytest.mark.parametrize("unit", ["x", "é", "😀", "\u2028", "中文"])
def test_truncation_bounds_bytes_and_so_tokens(tokenizer, unit: str) -> None:
    text = "HEAD" + unit * 5000 + "TAIL"
    short = truncate_middle(text, 512)
    assert len(short.encode("utf-8")) <= 512 and short.startswith("HEAD") and short.endswith("TAIL")
    assert len(tokenizer(short, add_special_tokens=False)["input_ids"]) <= 512
    assert "characters truncated" in short
    assert truncate_middle("é" * 10, 512) == "é" * 10


def test_an_emoji_flood_from_the_tool_stays_within_the_cap_in_tokens(local_sandbox, tokenizer) -> None:
    env = gym.make("stare_agents/MathTIR-v0", sandbox=local_sandbox, max_obs_chars=256)
    env.reset(seed=0, options={"problem": "p", "answer": "1"})
    observation, *_ = env.step("```python\nprint('😀' * 20000)\n```")
    [tool_message] = observation
    content = tool_message["content"]
    assert len(tokenizer(content, add_special_tokens=False)["input_ids"]) <= 256 + 32  # + the fence markup
    env.close()


def test_sandbox_none_turns_every_tool_call_into_a_tool_error() -> None:
    env = gym.make("stare_agents/MathTIR-v0", sandbox=NoSandbox())
    env.reset(seed=0, options={"problem": "p", "answer": "1"})
    observation, reward, terminated, _, info = env.step("```python\nprint(6 * 7)\n```")
    assert "sandbox: none" in observation[0]["content"] and "42" not in observation[0]["content"]
    assert info["tool_errors"] == 1 and not terminated and reward == 0.0
    env.close()
