"""Scripted episodes for every registered environment: correct and wrong answers, tool calls, malformed and
unterminated fences, empty / 1 MB / odd-Unicode actions, the turn limit, tool timeouts, void turns."""

from __future__ import annotations

import re
import time
from typing import ClassVar

import gymnasium as gym
import pytest
import sympy

from stare_agents.envs import ArithmeticTIREnv, MathTIREnv, PythonUnitTestEnv, Task
from stare_agents.envs.arithmetic import KINDS

PINNED = {"problem": "What is 6 times 7?", "answer": "42"}
ONE_MB = 1024 * 1024
CODE = "Let me compute.\n```python\n{}\n```"
ARITHMETIC_VERSIONS = ["stare_agents/ArithmeticTIR-v0", "stare_agents/ArithmeticTIR-v1"]  # one scorer


@pytest.fixture(
    params=["local", pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.timeout(120)])]
)
def sandbox(request: pytest.FixtureRequest):
    """Each tool-environment test runs on the local backend, and on Docker where an engine is up."""
    return request.getfixturevalue(f"{request.param}_sandbox")


def make(env_id: str, sandbox=None, **kwargs) -> gym.Env:
    if sandbox is not None:
        kwargs["sandbox"] = sandbox
    return gym.make(env_id, **kwargs)


# -- MathTIR ---------------------------------------------------------------------------------------------------
def test_mathtir_correct_and_wrong(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox)
    env.reset(seed=0, options=PINNED)
    obs, reward, terminated, truncated, info = env.step("6 * 7 = 42, so \\boxed{42}.")
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["finished"] and info["grade_reason"] == "correct" and info["extracted"] == "42"
    env.reset(seed=0, options=PINNED)
    _, reward, terminated, _, info = env.step("\\boxed{41}")
    assert (reward, terminated, info["grade_reason"]) == (0.0, True, "wrong")
    env.close()


def test_mathtir_tool_call_keeps_state_and_then_answers(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox)
    env.reset(seed=0, options=PINNED)
    obs, reward, terminated, truncated, info = env.step(CODE.format("x = 6\nprint(x * 7)"))
    assert obs == [{"role": "tool", "content": "42", "inline": "\n```output\n42\n```\n"}]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert (info["tool_calls"], info["tool_errors"], info["turn"]) == (1, 0, 1)
    obs, _, _, _, info = env.step(CODE.format("print(x + 1)\n1 / 0"))  # the session kept x
    assert obs[0]["content"].startswith("7\nTraceback")
    assert "ZeroDivisionError" in obs[0]["content"]
    assert (info["tool_calls"], info["tool_errors"]) == (2, 1)
    obs, reward, terminated, _, info = env.step("So the answer is \\boxed{42}")
    assert (obs, reward, terminated, info["turn"]) == ([], 1.0, True, 3)
    env.close()


def test_mathtir_new_episode_gets_a_fresh_session(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox)
    env.reset(seed=0, options=PINNED)
    env.step(CODE.format("secret = 123"))
    env.reset(seed=0, options=PINNED)
    obs, *_ = env.step(CODE.format("print(secret)"))
    assert "NameError" in obs[0]["content"]
    env.close()


@pytest.mark.parametrize(
    "action",
    [
        "```pythonprint(6*7)```",  # malformed: no newline after the tag
        "Let me run\n```python\nprint(6 * 7)\n",  # unterminated fence
        "",  # empty
        "I have no idea. " * (ONE_MB // 16),  # 1 MB of prose
        "Ünïcödé ✓ 答案 𝔸𝕟𝕤𝕨𝕖𝕣 \u200b\ufeff\u202e reversed",  # odd Unicode, no answer
    ],
)
def test_mathtir_void_turns_end_the_episode(sandbox, action: str) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox)
    env.reset(seed=0, options=PINNED)
    started = time.perf_counter()
    obs, reward, terminated, truncated, info = env.step(action)
    assert time.perf_counter() - started < 5.0
    assert (obs, reward, terminated, truncated) == ([], 0.0, True, False)
    assert info["void_turn"] and info["void_turns"] == 1 and info["tool_calls"] == 0
    assert info["grade_reason"] == "no_answer"
    env.close()


def test_mathtir_void_turn_policy_continue(sandbox) -> None:
    env = make(
        "stare_agents/MathTIR-v0", sandbox, void_turn_policy="continue", void_turn_feedback="Keep going."
    )
    env.reset(seed=0, options=PINNED)
    obs, reward, terminated, truncated, info = env.step("Hmm, let me think.")
    assert obs == [{"role": "user", "content": "Keep going.", "inline": "\nKeep going.\n"}]
    assert (reward, terminated, truncated, info["void_turn"]) == (0.0, False, False, True)
    _, reward, terminated, _, info = env.step("\\boxed{42}")
    assert (reward, terminated, info["void_turns"], info["void_turn"]) == (1.0, True, 1, False)
    env.close()


def test_mathtir_one_megabyte_and_unicode_answers(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox)
    env.reset(seed=0, options=PINNED)
    started = time.perf_counter()
    _, reward, *_ = env.step("x" * ONE_MB + " so \\boxed{42}")
    assert reward == 1.0 and time.perf_counter() - started < 5.0
    env.reset(seed=0, options=PINNED)
    _, reward, *_ = env.step("答案是 ✓ 𝔸 \u200b \\boxed{42} ✓")
    assert reward == 1.0
    env.reset(seed=0, options=PINNED)
    obs, *_ = env.step(CODE.format("print('答案 ✓ 𝔸 \\u200b')"))
    assert obs[0]["content"] == "答案 ✓ 𝔸 \u200b"
    env.close()


def test_mathtir_one_megabyte_tool_output_is_truncated(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox, max_obs_chars=500)
    env.reset(seed=0, options=PINNED)
    obs, *_ = env.step(CODE.format("print('A' + 'x' * 1_000_000 + 'Z')"))
    content = obs[0]["content"]
    assert len(content) <= 500 and content.startswith("A") and content.endswith("Z")
    assert "truncated" in content
    env.close()


def test_mathtir_turn_limit_truncates_without_running_the_last_call(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox, max_turns=2)
    env.reset(seed=0, options=PINNED)
    _, _, terminated, truncated, _ = env.step(CODE.format("print(1)"))
    assert not terminated and not truncated
    obs, reward, terminated, truncated, info = env.step(CODE.format("print(2)"))
    assert (obs, reward, terminated, truncated) == ([], 0.0, False, True)
    assert info["truncated"] and not info["finished"] and info["tool_calls"] == 1
    with pytest.raises(gym.error.ResetNeeded, match="after the episode ended"):
        env.step("\\boxed{42}")
    env.close()


def test_mathtir_tool_timeout_is_an_observation(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox, tool_timeout_s=1.0)
    env.reset(seed=0, options=PINNED)
    started = time.perf_counter()
    obs, reward, terminated, truncated, info = env.step(
        CODE.format("import time\nwhile True:\n    time.sleep(0.01)")
    )
    assert time.perf_counter() - started < 10.0
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "Timeout" in obs[0]["content"] or "timeout" in obs[0]["content"]
    assert (info["tool_timeouts"], info["tool_calls"]) == (1, 1)
    _, reward, terminated, *_ = env.step("\\boxed{42}")
    assert (reward, terminated) == (1.0, True)
    env.close()


def test_mathtir_code_execution_result_style_and_last_block(sandbox) -> None:
    env = make(
        "stare_agents/MathTIR-v0",
        sandbox,
        observation_format="code_execution_result",
        code_block="last",
        error_lines=1,
    )
    env.reset(seed=0, options=PINNED)
    obs, *_ = env.step("```python\nprint('first')\n```\nthen\n```python\nprint('last')\n```")
    assert obs[0]["inline"] == "\nCode execution result: last\n"
    obs, *_ = env.step(CODE.format("raise ValueError('boom')"))
    assert obs[0]["content"] == "ValueError: boom"  # error_lines=1: the traceback's last line only
    env.close()


def test_mathtir_hermes_tool_calls(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox, tool_format="hermes")
    _, info = env.reset(seed=0, options=PINNED)
    assert info["tools"][0]["function"]["name"] == "python"
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
    obs, _, terminated, _, info = env.step(call)
    assert obs == [{"role": "tool", "content": "42", "inline": "\n<tool_response>\n42\n</tool_response>\n"}]
    assert not terminated
    obs, _, _, _, info = env.step(
        '<tool_call>{"name": "python", "arguments": {oops}</tool_call><tool_call>{"name": "shell", "arguments": {}}</tool_call>'
    )
    assert "not valid JSON" in obs[0]["content"] and "unknown tool 'shell'" in obs[1]["content"]
    assert (info["tool_calls"], info["tool_errors"]) == (3, 2)
    obs, *_ = env.step("```python\nprint(1)\n```")  # a fence is not a call in hermes mode: void turn
    assert obs == []
    env.close()


def test_tool_answer_accepted_only_where_enabled(sandbox) -> None:
    code = CODE.format("final_answer(6 * 7)")
    env = make("stare_agents/MathTIR-v0", sandbox, accept_tool_answer=True)
    env.reset(seed=0, options=PINNED)
    obs, reward, terminated, _, info = env.step(code)
    assert (obs, reward, terminated) == ([], 1.0, True)
    assert info["score_details"]["answer_source"] == "tool"
    env.close()
    env = make(
        "stare_agents/MathTIR-v0", sandbox
    )  # default: a boxed answer printed by the tool is just output
    env.reset(seed=0, options=PINNED)
    obs, reward, terminated, *_ = env.step(CODE.format("print(chr(92) + 'boxed{42}')"))
    assert (reward, terminated) == (0.0, False) and obs[0]["content"] == "\\boxed{42}"
    env.close()


def test_api_misuse_raises_clear_errors(sandbox) -> None:
    env = MathTIREnv(sandbox=sandbox)
    with pytest.raises(gym.error.ResetNeeded, match="before reset"):
        env.step("\\boxed{1}")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="str"):
        env.step(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool_format"):
        MathTIREnv(sandbox=sandbox, tool_format="xml")  # type: ignore[arg-type]
    env.close()


def test_injected_sandbox_survives_env_close(sandbox) -> None:
    env = make("stare_agents/MathTIR-v0", sandbox)
    env.reset(seed=0, options=PINNED)
    env.step(CODE.format("print(1)"))
    env.close()
    with sandbox.session() as session:
        assert session.run("print(2)", timeout_s=5).stdout == "2\n"


def test_envs_without_a_sandbox_share_one_process_wide_pool() -> None:
    """Four environments made without sandbox= start at most one pool between them, and closing them leaves
    it up (it belongs to the process, closed at exit)."""
    import gc

    from stare_agents.envs import shared_sandbox
    from stare_agents.sandbox import PooledSandbox

    def is_started_pool(o: object) -> bool:
        try:
            return isinstance(o, PooledSandbox) and getattr(o, "_pool", None) is not None
        except ReferenceError:  # a weak proxy (another test's) whose referent is gone
            return False

    def started_pools() -> set[int]:
        return {id(o) for o in gc.get_objects() if is_started_pool(o)}

    before = started_pools()
    envs = [gym.make("stare_agents/ArithmeticTIR-v0") for _ in range(3)]
    envs.append(gym.make("stare_agents/PythonUnitTest-v0"))
    for env in envs[:3]:
        env.reset(seed=0, options=PINNED)
        obs, *_ = env.step(CODE.format("print(6 * 7)"))
        assert obs[0]["content"] == "42"
    envs[3].reset(seed=0, options={"index": 0})
    assert envs[3].step(PALINDROME)[1] == 1.0
    assert len(started_pools() - before) <= 1
    sandboxes = {id(env.unwrapped.tools()["python"].sandbox) for env in envs[:3]}
    assert sandboxes == {id(shared_sandbox())} == {id(envs[3].unwrapped.sandbox)}
    for env in envs:
        env.close()
    assert shared_sandbox()._pool is not None  # still up for the next environment
    with shared_sandbox().session() as session:
        assert session.run("print(2)", timeout_s=5).stdout == "2\n"


def test_python_tool_is_injected_and_owns_the_episode_session(sandbox) -> None:
    from stare_agents.envs import PythonTool

    stateful = PythonTool(sandbox, timeout_s=2.0)
    env = MathTIREnv(tools=[stateful])
    env.reset(seed=0, options=PINNED)
    env.step(CODE.format("x = 1"))
    assert stateful._session is not None  # a stateful tool holds the episode's session
    env.step("\\boxed{42}")
    assert stateful._session is None  # the episode's end closed it; the sandbox is still up
    env.close()

    tool = PythonTool(sandbox, timeout_s=2.0, stateless=True, error_lines=1)
    env = MathTIREnv(tools=[tool])
    env.reset(seed=0, options=PINNED)
    obs, *_ = env.step(CODE.format("x = 1"))
    assert tool._session is None  # stateless: the interpreter went back to the pool after the call
    obs, *_ = env.step(CODE.format("print(x)"))  # stateless: x is gone
    assert obs[0]["content"] == "NameError: name 'x' is not defined"  # error_lines=1
    env.step("\\boxed{42}")
    with pytest.raises(ValueError, match="already serves another environment"):
        MathTIREnv(tools=[tool])
    with pytest.raises(
        ValueError, match=r"\['stateless', 'tool_timeout_s'\] configure the default python tool"
    ):
        MathTIREnv(tools=[PythonTool(sandbox)], tool_timeout_s=1.0, stateless=True)
    with pytest.raises(TypeError, match="end_episode"):
        MathTIREnv(tools=[object()])
    env.close()


# -- MathCoT ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("action", "reward", "reason"),
    [
        ("6 * 7 = 42. \\boxed{42}", 1.0, "correct"),
        ("\\boxed{\\frac{84}{2}}", 1.0, "correct"),
        ("\\boxed{41}", 0.0, "wrong"),
        ("```python\nprint(6 * 7)\n```", 0.0, "no_answer"),  # code is not run in a CoT env
        ("```python\nprint(6 * 7)", 0.0, "no_answer"),
        ("", 0.0, "no_answer"),
        ("z" * ONE_MB, 0.0, "no_answer"),
        ("\\boxed{42", 0.0, "parse_failure"),
        ("答案 ✓ 𝔸 \u200b\u202e \\boxed{42}", 1.0, "correct"),
    ],
)
def test_mathcot_single_turn(action: str, reward: float, reason: str) -> None:
    env = gym.make("stare_agents/MathCoT-v0")
    env.reset(seed=0, options=PINNED)
    obs, got, terminated, truncated, info = env.step(action)
    assert (obs, got, terminated, truncated, info["grade_reason"]) == ([], reward, True, False, reason)
    assert info["tool_calls"] == 0


def test_mathcot_short_and_long_differ_in_prompt_and_budget() -> None:
    short, long = gym.make("stare_agents/MathCoT-v0"), gym.make("stare_agents/MathCoT-v0", cot="long")
    short_prompt, _ = short.reset(seed=0, options=PINNED)
    long_prompt, _ = long.reset(seed=0, options=PINNED)
    assert short_prompt != long_prompt
    assert short.unwrapped.max_response_tokens < long.unwrapped.max_response_tokens
    assert short.unwrapped.max_turns == long.unwrapped.max_turns == 1


def test_dataset_from_file_and_index_option(tmp_path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"q": "1+1?", "a": "2"}\n{"q": "2+2?", "a": "4"}\n')
    env = gym.make("stare_agents/MathCoT-v0", dataset=str(path), fields={"problem": "q", "answer": "a"})
    obs, info = env.reset(options={"index": 1})
    assert "2+2?" in obs[-1]["content"] and info["task_id"] == "tasks-1"
    _, reward, *_ = env.step("\\boxed{4}")
    assert reward == 1.0


# -- ArithmeticTIR ---------------------------------------------------------------------------------------------
def _independent_answer(task: Task) -> int:
    numbers = [int(n) for n in re.findall(r"\d+", task.problem)]
    kind = task.data["kind"]
    if kind == "multiply":
        return numbers[0] * numbers[1]
    if kind == "modpow":
        return pow(numbers[0], numbers[1], numbers[2])
    if kind == "range_sum":
        k, lo, hi, r, d = numbers
        return sum(i**k for i in range(lo, hi + 1) if i % d == r)
    if kind == "digit_sum_factorial":
        return sum(int(c) for c in str(sympy.factorial(numbers[0])))
    lo, hi = numbers
    return int(sympy.primepi(hi) - sympy.primepi(lo - 1))


def test_arithmetic_answers_are_right_and_seeded() -> None:
    env = ArithmeticTIREnv()
    seen = set()
    for seed in range(40):
        env.reset(seed=seed)
        task = env.task
        assert int(task.answer) == _independent_answer(task), task.problem
        seen.add(task.data["kind"])
        env.reset(seed=seed)
        assert env.task == task
    assert seen == set(KINDS)


def test_arithmetic_tool_call_solves_the_task(sandbox) -> None:
    env = make("stare_agents/ArithmeticTIR-v0", sandbox, kinds=("multiply",), digits=20)
    obs, _ = env.reset(seed=3)
    a, b = re.findall(r"\d+", env.unwrapped.task.problem)
    obs, _, terminated, _, info = env.step(CODE.format(f"print({a} * {b})"))
    assert not terminated and info["tool_calls"] == 1
    product = obs[0]["content"]
    formatted = f"{int(product):,}"  # commas inside the box are accepted
    _, reward, terminated, _, info = env.step(f"The product is \\boxed{{{formatted}}}.")
    assert (reward, terminated, info["grade_reason"]) == (1.0, True, "correct")


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ("\\boxed{1}", "wrong"),
        ("\\boxed{about 5}", "parse_failure"),
        ("\\boxed{²}", "parse_failure"),
        ("", "no_answer"),
        ("```python\nprint(1)", "no_answer"),  # unterminated fence: a void turn
        ("```pythonprint(1)```", "no_answer"),  # malformed fence: a void turn
        ("\\boxed{４２}", "parse_failure"),  # full-width digits are not an integer here
        ("答案 ✓ 𝔸 \u200b\u202e", "no_answer"),
        ("q" * ONE_MB, "no_answer"),
    ],
)
@pytest.mark.parametrize("version", ARITHMETIC_VERSIONS)
def test_arithmetic_failures(sandbox, action: str, reason: str, version: str) -> None:
    env = make(version, sandbox)
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step(action)
    assert (reward, terminated, info["grade_reason"]) == (0.0, True, reason)


@pytest.mark.parametrize("version", ARITHMETIC_VERSIONS)
def test_arithmetic_separators_and_hedges(sandbox, version: str) -> None:
    env = make(version, sandbox)
    for action, reward in [
        ("\\boxed{1\\,234\\,567}", 1.0),
        ("\\boxed{1 234 567}", 1.0),
        ("\\boxed{1{,}234{,}567}", 1.0),
        ("\\boxed{1234567}, \\boxed{1,234,567}", 1.0),  # the same integer twice
        ("\\boxed{1234566} or \\boxed{1234567}", 0.0),  # a hedge
        ("\\boxed{7} then I see it is \\boxed{1234567}", 1.0),  # a correction: the last box
    ]:
        env.reset(options={"problem": "p", "answer": "1234567"})
        assert env.step(action)[1] == reward, action


@pytest.mark.parametrize("version", ARITHMETIC_VERSIONS)
def test_arithmetic_turn_limit_and_timeout(sandbox, version: str) -> None:
    env = make(version, sandbox, max_turns=2, tool_timeout_s=1.0)
    env.reset(seed=2)
    obs, _, _, _, info = env.step(CODE.format("while True:\n    pass"))
    assert info["tool_timeouts"] == 1 and obs[0]["role"] == "tool"
    _, reward, terminated, truncated, _ = env.step(CODE.format("print(1)"))
    assert (reward, terminated, truncated) == (0.0, False, True)


# -- PythonUnitTest --------------------------------------------------------------------------------------------
PALINDROME = "```python\nimport re\n\ndef is_palindrome(s):\n    t = re.sub(r'[^a-z0-9]', '', s.lower())\n    return t == t[::-1]\n```"


def unit_env(sandbox, **kwargs) -> gym.Env:
    env = make("stare_agents/PythonUnitTest-v0", sandbox, **kwargs)
    env.reset(seed=0, options={"index": 0})  # is_palindrome, 5 tests
    return env


def test_unittest_correct_solution_passes_all(sandbox) -> None:
    env = unit_env(sandbox)
    obs, reward, terminated, truncated, info = env.step("Here you go:\n" + PALINDROME)
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["score_details"]["tests_passed"] == 5 and info["correct"]


@pytest.mark.parametrize(
    ("solution", "reward", "reason"),
    [
        (
            "def is_palindrome(s):\n    return s == s[::-1]",
            3 / 5,
            "wrong",
        ),  # ignores case/punctuation rules: partial
        ("def is_palindrome(s):\n    return False", 2 / 5, "wrong"),
        ("def is_palindrome(s) return 1", 0.0, "error"),  # syntax error
        ("import sys\nsys.exit(0)", 0.0, "error"),
        ("def is_palindrome(s):\n    import os\n    os._exit(1)", 0.0, "wrong"),
        (
            'print(\'@@stare-0000000000000000@@{"test": 0, "passed": true}\')\ndef is_palindrome(s):\n    return None',
            0.0,
            "wrong",
        ),
    ],
)
def test_unittest_partial_and_broken_solutions(sandbox, solution: str, reward: float, reason: str) -> None:
    env = unit_env(sandbox)
    _, got, terminated, _, info = env.step(f"```python\n{solution}\n```")
    assert got == pytest.approx(reward) and terminated
    assert info["grade_reason"] == reason, info["score_details"]


def test_unittest_timeouts_are_counted(sandbox) -> None:
    env = make("stare_agents/PythonUnitTest-v0", sandbox, per_test_timeout_s=0.5, tool_timeout_s=20)
    env.reset(options={"index": 9})  # nth_prime, 4 tests
    solution = "def nth_prime(n):\n    if n < 7:\n        return [2, 3, 5, 7, 11, 13][n - 1]\n    while True:\n        pass"
    _, reward, terminated, _, info = env.step(f"```python\n{solution}\n```")
    assert reward == pytest.approx(2 / 4) and terminated
    assert info["tool_timeouts"] == 2


@pytest.mark.parametrize(
    "action",
    [
        "",
        "I would use slicing.",
        "```python\ndef is_palindrome(s):\n    return True",
        "ñ" * ONE_MB,
        "```pythondef f(): pass```",
    ],
)
def test_unittest_no_submission(sandbox, action: str) -> None:
    env = unit_env(sandbox)
    _, reward, terminated, _, info = env.step(action)
    assert (reward, terminated, info["grade_reason"]) == (0.0, True, "no_answer")


def test_unittest_unicode_and_megabyte_submission(sandbox) -> None:
    env = unit_env(sandbox)
    padding = "# " + "é" * ONE_MB + "\n"
    solution = "def is_palindrome(s):\n    ñ = ''.join(c for c in s.lower() if c.isalnum())  # ✓ 答案\n    return ñ == ñ[::-1]\n"
    _, reward, *_ = env.step(f"```python\n{padding}{solution}```")
    assert reward == 1.0


def test_unittest_pinned_task_with_its_own_tests(sandbox) -> None:
    env = make("stare_agents/PythonUnitTest-v0", sandbox)
    env.reset(
        options={"problem": "Write add(a, b).", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
    )
    _, reward, *_ = env.step("```python\ndef add(a, b):\n    return a + b\n```")
    assert reward == 1.0


def test_unittest_is_single_turn() -> None:
    with pytest.raises(ValueError, match="single-turn"):
        PythonUnitTestEnv(max_turns=3)


def test_deepcopy_shares_the_sandbox_not_the_session(sandbox) -> None:
    import copy

    env = MathTIREnv(sandbox=sandbox)
    env.reset(seed=0, options=PINNED)
    env.step(CODE.format("mine = 1"))
    clone = copy.deepcopy(env)
    tool, cloned_tool = env.tools()["python"], clone.tools()["python"]
    assert cloned_tool is not tool and cloned_tool.sandbox is sandbox and cloned_tool._session is None
    obs, *_ = clone.step(CODE.format("print(mine)"))  # the clone's own, fresh session
    assert "NameError" in obs[0]["content"]
    obs, *_ = env.step(CODE.format("print(mine)"))
    assert obs[0]["content"] == "1"
    env.close()
    clone.close()


def test_custom_tools_hook_with_hermes_calls() -> None:
    from stare_agents.envs import Tool, ToolEnv, ToolOutput

    class LookupEnv(ToolEnv):
        """A tool environment without Python: one lookup tool, whose failures become observations."""

        table: ClassVar[dict[str, str]] = {"answer": "42"}

        def sample_task(self) -> Task:
            return Task(problem="Look up 'answer'.", answer="42", id="lookup")

        def tools(self) -> dict[str, Tool]:
            def lookup(arguments: dict) -> ToolOutput:
                return ToolOutput(self.table[arguments["key"]])  # KeyError on a missing key

            schema = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
            return {"lookup": Tool("lookup", "Look a key up.", schema, lookup)}

    env = LookupEnv(tool_format="hermes", render_mode="ansi")
    _, info = env.reset(seed=0)
    assert [tool["function"]["name"] for tool in info["tools"]] == ["lookup"]
    obs, _, _, _, info = env.step('<tool_call>{"name": "lookup", "arguments": {"key": "answer"}}</tool_call>')
    assert obs[0]["content"] == "42"
    obs, _, _, _, info = env.step('<tool_call>{"name": "lookup", "arguments": {"key": "nope"}}</tool_call>')
    assert "KeyError" in obs[0]["content"] and info["tool_errors"] == 1
    _, reward, terminated, _, _ = env.step("\\boxed{42}")
    assert (reward, terminated) == (1.0, True)
    assert env.render().splitlines()[0] == "[task lookup] Look up 'answer'."
    assert "python" not in env.tools()  # the hook replaced the default tool
    env.close()
