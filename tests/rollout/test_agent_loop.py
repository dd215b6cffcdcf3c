"""The agent loop: token layout, chat-template equality, masks, budgets, and failures that stay contained."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest
from rollout_support import ANSWER_TURN, CODE_TURN, load_weights

from stare_agents.envs.parsing import message
from stare_agents.rollout import RolloutConfig, RolloutTask, collect, collect_async

SIX_TIMES_SEVEN = RolloutTask(
    "stare_agents/ArithmeticTIR-v0",
    options={"problem": "What is 6 times 7?", "answer": "42", "id": "six-seven"},
    env_kwargs={"prompt_template": "{problem}"},
    group_id="six-seven",
)
GREEDY = RolloutConfig(temperature=0.0, max_tokens_per_turn=64, max_total_tokens=400)


class ScriptedEnv(gym.Env):
    """A plain Gymnasium env speaking the message protocol: it never ends on its own and answers every turn
    with `feedback`; `fail_on` ("reset" or a turn number) makes it raise there."""

    def __init__(self, feedback: str = "go on", fail_on: object = None) -> None:
        self.feedback, self.fail_on, self.turn = feedback, fail_on, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.fail_on == "reset":
            raise RuntimeError("reset exploded")
        self.turn = 0
        return [message("user", "Say anything.")], {"task_id": "scripted"}

    def step(self, action):
        self.turn += 1
        if self.fail_on == self.turn:
            raise RuntimeError(f"step {self.turn} exploded")
        return [message("user", self.feedback)], 0.0, False, False, {"task_id": "scripted", "turn": self.turn}


gym.register("tests/Scripted-v0", entry_point=ScriptedEnv, disable_env_checker=True)


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tool_episode_is_the_chat_template_of_its_conversation(vllm_engine, toolcaller_model, docker_sandbox):
    load_weights(vllm_engine, toolcaller_model)
    tokenizer = vllm_engine.tokenizer
    [t] = collect(vllm_engine, [SIX_TIMES_SEVEN], GREEDY, sandbox=docker_sandbox)
    assert (t.stop_reason, t.reward, t.correct, t.num_turns) == ("answered", 1.0, True, 2), t
    assert [turn.text for turn in t.turns] == [CODE_TURN, ANSWER_TURN]
    assert [turn.finish_reason for turn in t.turns] == ["stop", "eos"]
    assert (t.turns[0].tool_calls, t.turns[0].tool_statuses) == (1, ["ok"])
    conversation = [
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": CODE_TURN},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": ANSWER_TURN},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert t.prompt_ids + t.response_ids + encode(tokenizer, "\n") == encode(tokenizer, rendered)
    # the mask is 1 exactly on the sampled ids: the code, then (after <|im_end|>, the tool turn and the next
    # assistant header, all inserted) the answer including the <|im_end|> the policy sampled itself
    code_ids, answer_ids = (
        encode(tokenizer, CODE_TURN),
        [*encode(tokenizer, ANSWER_TURN), tokenizer.eos_token_id],
    )
    inserted = encode(tokenizer, "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    assert t.response_ids == code_ids + inserted + answer_ids
    assert t.action_mask == [1] * len(code_ids) + [0] * len(inserted) + [1] * len(answer_ids)
    assert all(lp == 0.0 for lp, bit in zip(t.rollout_logprobs, t.action_mask, strict=True) if not bit)
    assert all(lp <= 0.0 for lp in t.rollout_logprobs) and t.turns[0].observation_tokens == len(inserted)
    assert t.info["correct"] is True and t.task_id == "six-seven"


def test_inline_rendering_splices_the_output_block(vllm_engine, toolcaller_model, docker_sandbox):
    load_weights(vllm_engine, toolcaller_model)
    config = RolloutConfig(temperature=0.0, max_tokens_per_turn=32, max_total_tokens=120, rendering="inline")
    [t] = collect(vllm_engine, [SIX_TIMES_SEVEN], config, sandbox=docker_sandbox)
    assert t.turns[0].text == CODE_TURN and t.turns[0].observation == "\n```output\n42\n```\n"
    code_ids = encode(vllm_engine.tokenizer, CODE_TURN)
    inline_ids = encode(vllm_engine.tokenizer, "\n```output\n42\n```\n")
    assert t.response_ids[: len(code_ids) + len(inline_ids)] == code_ids + inline_ids
    assert t.action_mask[: len(code_ids) + len(inline_ids)] == [1] * len(code_ids) + [0] * len(inline_ids)


def test_budgets_end_episodes_with_their_own_stop_reasons(vllm_engine, tiny_model):
    load_weights(vllm_engine, tiny_model)
    scripted = RolloutTask("tests/Scripted-v0")
    budget = RolloutConfig(max_tokens_per_turn=16, max_total_tokens=60)
    t = collect(vllm_engine, [scripted], budget)[0]
    assert t.stop_reason == "token_budget" and len(t.response_ids) <= 60 and t.num_turns >= 2
    assert sum(t.action_mask) == sum(turn.num_tokens for turn in t.turns)  # nothing generated was dropped
    # an observation that does not fit the context window ends the episode before it is inserted
    huge = RolloutTask("tests/Scripted-v0", env_kwargs={"feedback": "word " * 2000})
    t = collect(vllm_engine, [huge], RolloutConfig(max_tokens_per_turn=16, max_total_tokens=10_000))[0]
    assert (
        t.stop_reason == "context_overflow"
        and t.num_turns == 1
        and t.action_mask == [1] * len(t.response_ids)
    )
    # a prompt that fills the window leaves no room for a first turn
    long_prompt = RolloutTask(
        "stare_agents/ArithmeticTIR-v0",
        options={"problem": "x " * 3000, "answer": "1"},
        env_kwargs={"sandbox": None},
    )
    t = collect(vllm_engine, [long_prompt], budget)[0]
    assert t.stop_reason == "context_overflow" and t.num_turns == 0 and t.response_ids == []


def test_failing_environments_are_recorded_and_never_fail_the_batch(
    vllm_engine, toolcaller_model, docker_sandbox
):
    load_weights(vllm_engine, toolcaller_model)
    tasks = [
        RolloutTask("tests/Scripted-v0", env_kwargs={"fail_on": "reset"}),
        SIX_TIMES_SEVEN,
        RolloutTask("tests/Scripted-v0", env_kwargs={"fail_on": 2}),
        RolloutTask("tests/NoSuchEnv-v0"),
        SIX_TIMES_SEVEN,
    ]
    results = collect(vllm_engine, tasks, GREEDY, sandbox=docker_sandbox)
    assert [t.stop_reason for t in results] == ["env_error", "answered", "policy_error", "env_error", "answered"]
    assert "reset exploded" in results[0].error and results[0].prompt_ids == []
    assert "step 2 exploded" in results[2].error and results[2].num_turns == 2 and results[2].reward == 0.0
    assert results[0].failed and not results[1].failed and results[1].reward == results[4].reward == 1.0


def test_a_killed_container_is_contained(vllm_engine, toolcaller_model, docker_sandbox):
    """Every warm container is killed under the batch; each episode still ends with a recorded outcome."""
    import docker

    from stare_agents.sandbox.docker_backend import INSTANCE_LABEL, sandbox_containers

    load_weights(vllm_engine, toolcaller_model)
    client = docker.from_env()
    for record in sandbox_containers(client, instance=docker_sandbox.instance):
        if record["State"] == "running":
            client.api.kill(record["Id"])
    results = collect(vllm_engine, [SIX_TIMES_SEVEN] * 4, GREEDY, sandbox=docker_sandbox)
    assert len(results) == 4
    for t in results:
        assert t.stop_reason in ("answered", "tool_failure"), t
        if (
            t.stop_reason == "answered"
        ):  # the sandbox replaced the container (and said so, or re-ran the call)
            assert t.turns[0].tool_statuses in (["ok"], ["killed"])
    assert INSTANCE_LABEL  # the label the leak checks use
    # and the sandbox keeps serving afterwards
    [after] = collect(vllm_engine, [SIX_TIMES_SEVEN], GREEDY, sandbox=docker_sandbox)
    assert after.reward == 1.0


def test_many_episodes_in_flight_keep_their_own_tokens(vllm_engine, toolcaller_model, docker_sandbox):
    load_weights(vllm_engine, toolcaller_model)
    finished = []
    tasks = [SIX_TIMES_SEVEN] * 12
    results = asyncio.run(
        collect_async(
            vllm_engine, tasks, GREEDY, sandbox=docker_sandbox, on_done=lambda i, t: finished.append(i)
        )
    )
    assert sorted(finished) == list(range(12))
    assert all(t.reward == 1.0 and t.response_ids == results[0].response_ids for t in results)
    with pytest.raises(ValueError, match="max_concurrency"):
        RolloutConfig(max_concurrency=0)


@pytest.mark.slow
def test_smollm2_multi_turn_ids_equal_the_chat_template(smollm2_model):
    """A real pretrained model, greedy, three turns: the trajectory's ids are the template's tokens."""
    from stare_agents.rollout import make_engine

    engine = make_engine("hf", str(smollm2_model))
    tokenizer = engine.tokenizer
    task = RolloutTask("tests/Scripted-v0", env_kwargs={"feedback": "Tell me more."})
    config = RolloutConfig(temperature=0.0, max_tokens_per_turn=24, max_total_tokens=100)
    [t] = collect(engine, [task], config)
    engine.close()
    assert t.stop_reason == "token_budget" and t.num_turns >= 2
    conversation = [{"role": "user", "content": "Say anything."}]
    for turn in t.turns[:-1]:
        conversation += [
            {"role": "assistant", "content": turn.text},
            {"role": "user", "content": "Tell me more."},
        ]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    last = t.turns[-1].num_tokens
    assert t.prompt_ids + t.response_ids[:-last] == encode(tokenizer, rendered)
    assert t.action_mask[-last:] == [1] * last and sum(t.action_mask) == sum(
        turn.num_tokens for turn in t.turns
    )


def test_an_engine_that_fails_is_recorded_per_episode(tiny_model):
    """A shut-down engine (what a crashed or closed engine looks like to its callers): every episode ends with
    stop reason engine_error and the error's text; nothing raises out of collect."""
    from stare_agents.rollout import make_engine

    engine = make_engine("hf", str(tiny_model))
    engine.close()
    results = collect(engine, [RolloutTask("tests/Scripted-v0")] * 3, RolloutConfig(max_tokens_per_turn=8))
    assert [t.stop_reason for t in results] == ["engine_error"] * 3
    assert all(t.failed and t.error and t.prompt_ids and not t.response_ids for t in results)
