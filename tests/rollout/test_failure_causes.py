"""Failures the policy causes cost reward; the infrastructure's are left out and counted. The policy here is
a scripted one (an adversary choosing its tokens), run through the real agent loop, renderer and tokenizer."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import pytest
import torch

from stare_agents.algo import AlgorithmConfig, compute_advantages
from stare_agents.envs.parsing import message
from stare_agents.rollout import RolloutConfig, RolloutTask, collect
from stare_agents.rollout.engine import Generation
from stare_agents.trajectory import (
    FAILED_STOP_REASONS,
    FAILURE_STOP_REASONS,
    STOP_CAUSES,
    STOP_REASONS,
    Trajectory,
    learning_trajectories,
    read_jsonl,
    write_jsonl,
)


def test_every_stop_reason_has_a_cause():
    assert set(STOP_CAUSES) == set(STOP_REASONS)
    assert set(STOP_CAUSES.values()) == {"policy", "infrastructure"}
    assert {r for r in FAILURE_STOP_REASONS if STOP_CAUSES[r] == "infrastructure"} == FAILED_STOP_REASONS
    assert STOP_CAUSES["policy_error"] == "policy"
    assert {STOP_CAUSES[r] for r in ("engine_error", "tool_failure", "env_error")} == {"infrastructure"}


def make(stop_reason: str, reward: float = 0.0, group: str = "g") -> Trajectory:
    return Trajectory(
        [1], [5, 6], [1, 1], [-0.1, -0.2], reward=reward, stop_reason=stop_reason, group_id=group
    )


def test_a_policy_failure_stays_in_the_loss_with_reward_zero_and_an_infrastructure_failure_leaves():
    group = [make("answered", 1.0), make("policy_error"), make("engine_error"), make("tool_failure")]
    kept = learning_trajectories(group)
    assert [t.stop_reason for t in kept] == ["answered", "policy_error"]
    assert [t.failure_cause for t in group] == [None, "policy", "infrastructure", "infrastructure"]
    advantages = compute_advantages(
        torch.tensor([t.reward for t in kept]), [t.group_id for t in kept], AlgorithmConfig.preset("grpo")
    ).advantages
    assert advantages[1] < 0 < advantages[0]  # failing is pushed down, not a free exit
    with pytest.raises(ValueError, match="policy_error scores 0"):
        make("policy_error", reward=1.0)


def test_u2028_and_other_line_breaks_keep_jsonl_one_record_per_line(tmp_path):
    text = "a\u2028b\u2029c\x85d\x0be\x1cf\r\ng"
    t = make("answered")
    t.info = {"answer": text}
    path = tmp_path / "t.jsonl"
    write_jsonl([t, t], path)
    raw = path.read_text(encoding="utf-8")
    assert len(raw.splitlines()) == 2  # even a reader that splits on U+2028 sees two records
    assert [json.loads(line)["info"]["answer"] for line in raw.splitlines()] == [text, text]
    assert [r.info["answer"] for r in read_jsonl(path)] == [text, text]
    # a file from an older writer, with a raw U+2028, still reads
    path.write_text(json.dumps(t.to_dict(), ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_jsonl(path)[0].info["answer"] == text


class ScriptedPolicy:
    """An engine whose 'samples' are fixed texts, tokenized with the real tiny model's tokenizer."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns = tokenizer, turns
        self.eos_ids = {tokenizer.eos_token_id}
        self.max_model_len, self.weight_version = 4096, 0

    async def generate(self, prompt_ids, params, stop=None, seed=None) -> Generation:
        text = self.turns[0]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), "eos")

    def update_weights(self, state_dict, version=None) -> int:
        return 0

    def close(self) -> None:
        pass


class OneStepEnv(gym.Env):
    """Not a TextEnv: ends after one turn with `reward`, or raises on text containing 'BOOM'."""

    def __init__(self, reward: object = 1.0) -> None:
        self.reward = reward

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [message("user", "Say anything.")], {"task_id": "one-step"}

    def step(self, action):
        if "BOOM" in action:
            raise RuntimeError("the environment's parser broke on the policy's text")
        return [message("user", "done")], self.reward, True, False, {"correct": True}


gym.register("tests/OneStep-v0", entry_point=OneStepEnv, disable_env_checker=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def run(tokenizer, turns, tasks):
    return collect(
        ScriptedPolicy(tokenizer, turns), tasks, RolloutConfig(rendering="chat", max_total_tokens=256)
    )


def test_text_that_makes_the_environment_raise_scores_zero_and_stays_in(tokenizer):
    [t] = run(tokenizer, ["BOOM"], [RolloutTask("tests/OneStep-v0")])
    assert (t.stop_reason, t.reward, t.correct, t.failed, t.failure_cause) == (
        "policy_error",
        0.0,
        False,
        False,
        "policy",
    )
    assert "parser broke" in t.error and t.num_action_tokens > 0 and learning_trajectories([t]) == [t]


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), "1.0x", None])
def test_a_bad_reward_from_a_plain_env_fails_that_episode_only(tokenizer, reward):
    tasks = [RolloutTask("tests/OneStep-v0", env_kwargs={"reward": reward}), RolloutTask("tests/OneStep-v0")]
    bad, good = run(tokenizer, ["hello"], tasks)
    assert (bad.stop_reason, bad.reward, bad.failed, bad.failure_cause) == (
        "env_error",
        0.0,
        True,
        "infrastructure",
    )
    assert "reward" in bad.error and math.isfinite(bad.reward)
    assert (good.stop_reason, good.reward) == ("answered", 1.0)


def test_a_template_that_cannot_render_the_observation_is_the_infrastructures_failure(tokenizer):
    """Observation tokens no longer depend on the policy's text, so a template that cannot render an
    observation fails every episode alike: env_error (left out, counted), not a reward of 0 for the policy."""
    from transformers import AutoTokenizer

    strict = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    strict.chat_template = (
        "{% for m in messages %}{% if loop.index0 > 1 %}{{ raise_exception('one exchange only') }}{% endif %}"
        "{{ m.content }}<|im_end|>{% endfor %}"
    )

    class TwoStepEnv(OneStepEnv):
        def step(self, action):
            return [message("user", "go on")], 1.0, False, False, {}

    gym.register("tests/TwoStep-v0", entry_point=TwoStepEnv, disable_env_checker=True)
    [t] = run(strict, ["hello"], [RolloutTask("tests/TwoStep-v0")])
    assert (t.stop_reason, t.reward, t.correct, t.failed) == ("env_error", 0.0, False, True)
    assert "one exchange only" in t.error and "render.py" in t.error  # the error and where it was raised
