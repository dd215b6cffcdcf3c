"""No episode can take down a batch: hostile environments, hung engines and sandboxes, bugs in callbacks all
end one episode with a failed stop reason, its error and where it was raised; a step whose episodes mostly
failed stops training with the reasons. Scripted engines and environments (adversaries) through the real
agent loop and the tiny model's tokenizer."""

from __future__ import annotations

import asyncio
import threading

import gymnasium as gym
import pytest
from transformers import AutoTokenizer

from stare_agents.envs.parsing import message
from stare_agents.rollout import RolloutConfig, RolloutTask, StopOnToolCall, collect
from stare_agents.rollout.engine import Generation, eos_token_ids
from stare_agents.rollout.summary import TooManyFailedEpisodes, check_failed_share
from stare_agents.trajectory import Trajectory

RELEASE = threading.Event()  # set at the end of the module: frees the threads a hung environment holds


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    yield AutoTokenizer.from_pretrained(tiny_model)
    RELEASE.set()


class Policy:
    """Says the prompt's last word back; hangs forever when that word is HANG (a stalled engine)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = {tokenizer.eos_token_id}
        self.max_model_len, self.weight_version = 4096, 0
        self.stops: list = []

    async def generate(self, prompt_ids, params, stop=None, seed=None) -> Generation:
        self.stops.append(stop)
        text = self.tokenizer.decode(prompt_ids)
        if "HANG" in text:
            await asyncio.Event().wait()
        ids = [*self.tokenizer("say it", add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        return Generation(ids, [-1.0] * len(ids), "eos")

    def update_weights(self, state_dict, version=None) -> int:
        return 0

    def close(self) -> None:
        pass


class HostileEnv(gym.Env):
    """`mode` picks the attack: a prompt that hangs the engine, a step that never returns, junk
    observations that are not lists of messages, or a plain episode."""

    tool_format = "python_fence"

    def __init__(self, mode: str = "plain", languages: tuple[str, ...] | None = None) -> None:
        self.mode = mode
        if languages is not None:
            self.languages = languages

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [message("user", "HANG" if self.mode == "hang_engine" else "go")], {"task_id": self.mode}

    def step(self, action):
        if self.mode == "hang_env":
            RELEASE.wait()
        junk = {"none": None, "text": "raw text", "no_content": [{"role": "tool"}], "number": 7}
        if self.mode in junk:
            return junk[self.mode], 0.0, False, False, {}
        return [], 1.0, True, False, {"correct": True}


gym.register("tests/Hostile-v0", entry_point=HostileEnv, disable_env_checker=True)


def task(mode: str, **kwargs) -> RolloutTask:
    return RolloutTask("tests/Hostile-v0", env_kwargs={"mode": mode, **kwargs}, group_id=mode)


def test_junk_observations_fail_their_episode_with_the_error_and_where_it_was_raised(tokenizer):
    modes = ["none", "text", "no_content", "number", "plain"]
    trajectories = collect(Policy(tokenizer), [task(m) for m in modes], RolloutConfig(rendering="chat"))
    *junk, plain = trajectories
    assert (plain.stop_reason, plain.reward) == ("answered", 1.0)
    for t in junk:
        assert (t.stop_reason, t.reward, t.failed) == ("env_error", 0.0, True), t.group_id
        assert "(at " in t.error and ".py:" in t.error  # a short traceback: file, line, function
        assert len(t.response_ids) == len(t.action_mask) == len(t.rollout_logprobs)
        t.validate()


def test_a_hung_engine_and_a_hung_environment_cannot_hold_the_batch(tokenizer):
    """The timeout ends the waiting episodes as the infrastructure's failures, by what they waited on;
    `collect` returns although a thread is still stuck in the environment's step."""
    config = RolloutConfig(rendering="chat", timeout_s=3)
    hung_engine, hung_env, plain = collect(
        Policy(tokenizer), [task("hang_engine"), task("hang_env"), task("plain")], config
    )
    assert (hung_engine.stop_reason, hung_engine.failed) == ("engine_error", True)
    assert "waited on the inference engine" in hung_engine.error
    assert (hung_env.stop_reason, hung_env.failed) == ("tool_failure", True)
    assert "waited on the environment" in hung_env.error and hung_env.num_turns == 1
    assert plain.stop_reason == "answered"


def test_episodes_that_never_started_before_the_timeout_fail_too(tokenizer):
    config = RolloutConfig(rendering="chat", timeout_s=3, max_concurrency=1)
    first, second = collect(Policy(tokenizer), [task("hang_engine"), task("plain")], config)
    assert first.stop_reason == second.stop_reason == "engine_error"
    assert "before the episode started" in second.error


def test_a_failing_progress_callback_does_not_lose_the_batch(tokenizer):
    def boom(index, trajectory):
        raise RuntimeError("progress bar broke")

    [t] = collect(Policy(tokenizer), [task("plain")], RolloutConfig(rendering="chat"), on_done=boom)
    assert t.stop_reason == "answered"


def test_the_stop_condition_follows_the_environments_tool_languages(tokenizer):
    policy = Policy(tokenizer)
    collect(policy, [task("plain", languages=("py",)), task("plain")], RolloutConfig(rendering="chat"))
    assert {stop.languages for stop in policy.stops} == {("py",), None}
    only_py = StopOnToolCall("python_fence", ("py",))
    assert not only_py("```python\nprint(1)\n```")  # the environment would not run it: no reason to stop
    assert StopOnToolCall("python_fence", ("py",))("```py\nprint(1)\n```")


def test_the_templates_end_of_turn_id_is_a_stop_id_for_a_base_tokenizer(tiny_model):
    """A base model's tokenizer ends sequences with <|endoftext|> while its template closes turns with
    <|im_end|> (Qwen2.5 base): both stop a turn."""
    base = AutoTokenizer.from_pretrained(tiny_model)
    base.eos_token = "<|endoftext|>"
    ids = eos_token_ids(base)
    assert ids == {base.convert_tokens_to_ids("<|endoftext|>"), base.convert_tokens_to_ids("<|im_end|>")}
    base.chat_template = None
    assert eos_token_ids(base) == {base.convert_tokens_to_ids("<|endoftext|>")}


def make(stop_reason: str) -> Trajectory:
    return Trajectory([1], [5], [1], [-0.1], stop_reason=stop_reason, error="RuntimeError: engine gone")


def test_too_many_infrastructure_failures_stop_the_step_with_the_reasons():
    step = [make("engine_error"), make("engine_error"), make("tool_failure"), make("answered")]
    with pytest.raises(
        TooManyFailedEpisodes, match=r"step 3: 3 of 4 .*engine_error': 2.*max_failed_fraction=0.5"
    ):
        check_failed_share(step, 0.5, step=3)
    assert check_failed_share(step, 0.75, step=3) == 3
    # a policy_error is the policy's: scored, not a failure of the infrastructure
    assert check_failed_share([make("policy_error")] * 4, 0.0, step=1) == 0
    assert check_failed_share([], 0.0, step=1) == 0
    with pytest.raises(ValueError, match=r"in \[0, 1\], got 1.5"):
        check_failed_share(step, 1.5, step=1)


def test_max_failed_fraction_is_checked_where_the_config_loads():
    from stare_agents.train.config import load_config

    assert (
        load_config(recipe="tiny", overrides=["rl.max_failed_fraction=0.25"]).rl.max_failed_fraction == 0.25
    )
    with pytest.raises(ValueError, match=r"max_failed_fraction must be in \[0, 1\], got -0.1"):
        load_config(recipe="tiny", overrides=["rl.max_failed_fraction=-0.1"])
