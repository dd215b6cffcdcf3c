"""step() never raises on anything the policy writes: hostile Hermes calls, parser limits, call floods, and a
bounded fuzz of every registered environment; every observation stays inside the observation space."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from stare_agents.envs import ENVIRONMENTS, INFO_KEYS, find_tool_calls, python_blocks

PINNED = {"problem": "What is 6 times 7?", "answer": "42"}


def call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def hermes_env(sandbox, **kwargs) -> gym.Env:
    env = gym.make("stare_agents/MathTIR-v0", sandbox=sandbox, tool_format="hermes", **kwargs)
    env.reset(seed=0, options=PINNED)
    return env


def step_within_space(env: gym.Env, action: str) -> tuple:
    started = time.perf_counter()
    result = env.step(action)
    obs, reward, _, _, info = result
    assert time.perf_counter() - started < 10.0
    assert obs in env.observation_space, obs
    assert env.unwrapped.reward_range[0] <= reward <= env.unwrapped.reward_range[1]
    assert all(key in info for key in INFO_KEYS)
    return result


@pytest.mark.parametrize(
    ("action", "in_content"),
    [
        # a JSON integer past Python's 4,300-digit limit
        (
            call('{"name": "python", "arguments": {"code": "print(1)", "n": ' + "9" * 5000 + "}}"),
            "ValueError",
        ),
        # nesting past the recursion limit, in the call itself
        (
            call('{"name": "python", "arguments": {"code": ' + "[" * 100_000 + "]" * 100_000 + "}}"),
            "RecursionError",
        ),
        # ... and in a JSON string argument: not JSON after all, so it is the code (a SyntaxError in Python)
        (call('{"name": "python", "arguments": "' + "[" * 100_000 + "]" * 100_000 + '"}'), "nested"),
        (call('{"name": "python", "arguments": [1, 2]}'), "arguments must be a JSON object"),
        (call('{"name": 7, "arguments": {}}'), 'must be a JSON object {"name"'),
        (call('{"name": "python", "arguments": {"code": 5}}'), 'string argument "code"'),
        (call('{"name": "' + "x" * 1_000_000 + '", "arguments": {}}'), "unknown tool 'xxx"),
        (call('{"name": "python", "arguments": {"code": "x = \'\\u0000\'"}}'), ""),
        (call('{"name": "python", "arguments": {"code": "print(\'\\ud800\')"}}'), ""),
        (call("\x00\ud800\u202e"), "not valid JSON"),
    ],
)
def test_hostile_hermes_calls_become_error_observations(local_sandbox, action: str, in_content: str) -> None:
    env = hermes_env(local_sandbox, max_obs_chars=300)
    obs, reward, terminated, truncated, info = step_within_space(env, action)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert len(obs) == 1 and in_content in obs[0]["content"] and len(obs[0]["content"]) <= 300
    assert info["tool_calls"] == 1 and info["tool_statuses"] == ["ok" if not info["tool_errors"] else "error"]
    env.close()


def test_a_call_flood_is_capped_within_the_observation_space(local_sandbox) -> None:
    env = hermes_env(local_sandbox)
    one = call('{"name": "python", "arguments": {"code": "print(7)"}}')
    obs, _, _, _, info = step_within_space(env, one * 100)
    assert [m["content"] for m in obs] == ["7"] * 4 + [
        "Error: 96 more tool call(s) were not run: at most 4 tool calls per turn"
    ]
    assert (info["tool_calls"], info["tool_errors"]) == (100, 96)
    assert info["tool_statuses"] == ["ok"] * 4 + ["error"]
    # 16 MB of empty calls: counted, not decoded, in bounded time
    obs, _, _, _, info = step_within_space(env, call("") * 700_000)
    assert len(obs) == 5 and info["tool_calls"] == 100 + 700_000
    env.close()


def test_the_cap_is_in_the_observation_space(local_sandbox) -> None:
    env = gym.make(
        "stare_agents/MathTIR-v0", sandbox=local_sandbox, tool_format="hermes", max_tool_calls_per_turn=100
    )
    assert env.observation_space.max_messages == 101
    env.reset(seed=0, options=PINNED)
    obs, *_ = step_within_space(env, call('{"name": "nope"}') * 150)
    assert len(obs) == 101
    with pytest.raises(ValueError, match="max_tool_calls_per_turn"):
        gym.make("stare_agents/MathTIR-v0", sandbox=local_sandbox, max_tool_calls_per_turn=0)


@pytest.mark.parametrize(
    "text", ["```" + " " * 1_000_000 + "x", "```python" + "\t" * 1_000_000, "```\n" * 200_000]
)
def test_fence_scanning_stays_linear(text: str) -> None:
    started = time.perf_counter()
    python_blocks(text)
    find_tool_calls(text, "hermes")
    assert time.perf_counter() - started < 2.0


# -- fuzz --------------------------------------------------------------------------------------------------------
FRAGMENTS = [
    "",
    "Let me think. ",
    "\\boxed{",
    "\\boxed{42}",
    "\\fbox 3",
    "}",
    "{",
    "```python\n",
    "```py\n",
    "```\n",
    "```",
    "print(6 * 7)\n",
    "x = 1\n",
    "final_answer(42)\n",
    "def is_palindrome(s):\n    return True\n",
    "raise ValueError('no')\n",
    "```python\nprint(6 * 7)\n```\n",
    "```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```\n",
    "```python\nfinal_answer(42)\n```\n",
    '<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>',
    "<tool_call>",
    "</tool_call>",
    '{"name": "python", "arguments": {"code": "print(2)"}}',
    '{"name": "python", "arguments": "print(3)"}',
    '{"name": "python"',
    '"arguments": {',
    "9" * 5000,
    "[" * 3000,
    "]" * 3000,
    "\x00",
    "\ud800",
    "\u202e\u200b\ufeff",
    "答案 𝔸𝕟𝕤",
    " " * 2000,
    "\n",
    "$",
    "\\",
]


def fuzz_action(rng: np.random.Generator) -> str:
    return "".join(FRAGMENTS[int(i)] for i in rng.integers(0, len(FRAGMENTS), size=int(rng.integers(1, 12))))


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("env_id", "kwargs", "steps"),
    [
        *[(env_id, {}, 40 if "UnitTest" in env_id else 120) for env_id in sorted(ENVIRONMENTS)],
        ("stare_agents/MathTIR-v0", {"tool_format": "hermes", "void_turn_policy": "continue"}, 120),
        ("stare_agents/ArithmeticTIR-v0", {"accept_tool_answer": True, "max_turns": 2}, 60),
    ],
)
def test_fuzz_step_never_raises(local_sandbox, env_id: str, kwargs: dict, steps: int) -> None:
    spec = gym.spec(env_id)
    module, _, name = str(spec.entry_point).partition(":")
    uses_sandbox = getattr(__import__(module, fromlist=[name]), name).uses_sandbox
    env = gym.make(env_id, **({"sandbox": local_sandbox} if uses_sandbox else {}), **kwargs)
    rng = np.random.default_rng(1234)
    env.reset(seed=0)
    episodes, calls, graded = 1, 0, set()
    for index in range(steps):
        action = fuzz_action(rng)
        _, _, terminated, truncated, info = step_within_space(env, action)
        calls += len(info["tool_statuses"])
        if terminated or truncated:
            graded.add(info["grade_reason"])
            env.reset(seed=index)
            episodes += 1
    assert episodes > 5 and len(graded) >= 2, graded  # episodes ended in several ways
    assert calls > 0 or not uses_sandbox  # and the tools ran
    env.close()
