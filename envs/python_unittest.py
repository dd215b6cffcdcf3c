"""`PythonUnitTest-v0`: write a function; the reward is the fraction of hidden unit tests that pass.

Single turn. The policy answers with its implementation in a ```python block (the last complete block is
the submission); the environment runs it in a fresh, stateless sandbox session together with the hidden
tests (assert statements) and counts how many pass. Each test has its own time limit where the interpreter
allows a signal-based alarm, and the whole run has `tool_timeout_s`; a test that has not reported by then
counts as failed.

Tasks come from a built-in set (`BUILTIN_TASKS`) or from a dataset whose rows carry "problem" (the
description), "tests" (a list of assert statements) and optionally "entry_point" (the function's name).
"""

from __future__ import annotations

import json
import secrets
from typing import Any, ClassVar

from stare_agents.envs.core import Score, ToolEnv, load_prompt
from stare_agents.envs.parsing import python_blocks
from stare_agents.envs.tasks import Task, TaskDataset

BUILTIN_TASKS: list[dict[str, Any]] = [
    {
        "id": "is_palindrome",
        "problem": "Write `is_palindrome(s: str) -> bool` that returns True when `s` reads the same forwards and backwards, ignoring case and all non-alphanumeric characters.",
        "tests": [
            "assert is_palindrome('A man, a plan, a canal: Panama') is True",
            "assert is_palindrome('race a car') is False",
            "assert is_palindrome('') is True",
            "assert is_palindrome('No lemon, no melon') is True",
            "assert is_palindrome('ab') is False",
        ],
    },
    {
        "id": "fizzbuzz",
        "problem": "Write `fizzbuzz(n: int) -> list[str]` returning the strings for 1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for multiples of both, otherwise the number as a string.",
        "tests": [
            "assert fizzbuzz(1) == ['1']",
            "assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']",
            "assert fizzbuzz(15)[-1] == 'FizzBuzz'",
            "assert fizzbuzz(0) == []",
            "assert len(fizzbuzz(100)) == 100 and fizzbuzz(100).count('FizzBuzz') == 6",
        ],
    },
    {
        "id": "two_sum",
        "problem": "Write `two_sum(nums: list[int], target: int) -> tuple[int, int]` returning the indices (i, j), i < j, of the two numbers that add up to `target`. Exactly one solution exists.",
        "tests": [
            "assert two_sum([2, 7, 11, 15], 9) == (0, 1)",
            "assert two_sum([3, 2, 4], 6) == (1, 2)",
            "assert two_sum([3, 3], 6) == (0, 1)",
            "assert two_sum([-1, -2, -3, -4, -5], -8) == (2, 4)",
            "assert two_sum(list(range(100000)), 199997) == (99998, 99999)",
        ],
    },
    {
        "id": "flatten",
        "problem": "Write `flatten(items: list) -> list` that flattens arbitrarily nested lists, keeping the order of the leaves.",
        "tests": [
            "assert flatten([1, [2, [3, [4]], 5]]) == [1, 2, 3, 4, 5]",
            "assert flatten([]) == []",
            "assert flatten([[[]]]) == []",
            "assert flatten(['a', ['b', ['c']]]) == ['a', 'b', 'c']",
        ],
    },
    {
        "id": "run_length_encode",
        "problem": "Write `run_length_encode(s: str) -> str` that replaces each run of a repeated character by the count followed by the character, e.g. 'aaabcc' -> '3a1b2c'.",
        "tests": [
            "assert run_length_encode('aaabcc') == '3a1b2c'",
            "assert run_length_encode('') == ''",
            "assert run_length_encode('a') == '1a'",
            "assert run_length_encode('aaaaaaaaaaaa') == '12a'",
            "assert run_length_encode('abab') == '1a1b1a1b'",
        ],
    },
    {
        "id": "to_roman",
        "problem": "Write `to_roman(n: int) -> str` converting 1 <= n <= 3999 to a Roman numeral.",
        "tests": [
            "assert to_roman(1) == 'I'",
            "assert to_roman(4) == 'IV'",
            "assert to_roman(9) == 'IX'",
            "assert to_roman(58) == 'LVIII'",
            "assert to_roman(1994) == 'MCMXCIV'",
            "assert to_roman(3999) == 'MMMCMXCIX'",
        ],
    },
    {
        "id": "balanced_brackets",
        "problem": "Write `balanced(s: str) -> bool` that returns True when every bracket in `s` ((), [], {}) is closed in the right order. Other characters are ignored.",
        "tests": [
            "assert balanced('()[]{}') is True",
            "assert balanced('([)]') is False",
            "assert balanced('{[]}') is True",
            "assert balanced('(') is False",
            "assert balanced('a(b)c') is True",
            "assert balanced('') is True",
        ],
    },
    {
        "id": "merge_intervals",
        "problem": "Write `merge_intervals(intervals: list[list[int]]) -> list[list[int]]` that merges overlapping closed intervals and returns them sorted by start.",
        "tests": [
            "assert merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]]) == [[1, 6], [8, 10], [15, 18]]",
            "assert merge_intervals([[1, 4], [4, 5]]) == [[1, 5]]",
            "assert merge_intervals([]) == []",
            "assert merge_intervals([[5, 6], [1, 2]]) == [[1, 2], [5, 6]]",
            "assert merge_intervals([[1, 10], [2, 3]]) == [[1, 10]]",
        ],
    },
    {
        "id": "top_k_words",
        "problem": "Write `top_k_words(text: str, k: int) -> list[str]` returning the k most frequent lowercase words (split on whitespace), ties broken alphabetically.",
        "tests": [
            "assert top_k_words('a b a c b a', 2) == ['a', 'b']",
            "assert top_k_words('The the THE cat', 1) == ['the']",
            "assert top_k_words('x y z', 2) == ['x', 'y']",
            "assert top_k_words('', 3) == []",
        ],
    },
    {
        "id": "nth_prime",
        "problem": "Write `nth_prime(n: int) -> int` returning the n-th prime (nth_prime(1) == 2). It must handle n up to 100000 within a second.",
        "tests": [
            "assert nth_prime(1) == 2",
            "assert nth_prime(6) == 13",
            "assert nth_prime(1000) == 7919",
            "assert nth_prime(100000) == 1299709",
        ],
    },
]

# The harness that runs in the sandbox. Results go to the real stdout behind a per-call marker; everything
# the submission prints is captured so it cannot forge or drown out the result lines.
_HARNESS = """
import io as __io, json as __json, signal as __signal, sys as __sys
__out, __mark = __sys.__stdout__, {marker!r}
def __report(payload):
    __out.write(__mark + __json.dumps(payload) + "\\n"); __out.flush()
def __alarm(*_):
    raise TimeoutError("test exceeded {per_test_s}s")
try:
    __signal.signal(__signal.SIGALRM, __alarm); __can_alarm = True
except (ValueError, AttributeError):
    __can_alarm = False
__ns = {{"__name__": "solution"}}
__sys.stdout = __io.StringIO()
try:
    exec(compile({source!r}, "solution.py", "exec"), __ns)
    __loaded = True
except BaseException as __e:
    __report({{"load_error": type(__e).__name__ + ": " + str(__e)[:300]}}); __loaded = False
if __loaded:
    for __i, __test in enumerate({tests!r}):
        try:
            if __can_alarm: __signal.setitimer(__signal.ITIMER_REAL, {per_test_s})
            exec(__test, __ns)
            if __can_alarm: __signal.setitimer(__signal.ITIMER_REAL, 0)
            __report({{"test": __i, "passed": True}})
        except BaseException as __e:
            if __can_alarm: __signal.setitimer(__signal.ITIMER_REAL, 0)
            __report({{"test": __i, "passed": False, "error": type(__e).__name__ + ": " + str(__e)[:200]}})
__sys.stdout = __sys.__stdout__
"""


class PythonUnitTestEnv(ToolEnv):
    """Write a function that passes hidden unit tests; reward = passed / total (in [0, 1]).

    Args (besides `TextEnv`'s): sandbox, tool_timeout_s (whole test run, default 10 s), per_test_timeout_s
    (default 2 s), dataset (rows with "problem" and "tests"; default: the built-in tasks).
    """

    default_max_turns: ClassVar[int] = 1
    default_prompt_template: ClassVar[str] = load_prompt("python_unittest")

    def __init__(
        self,
        *,
        dataset: Any = None,
        tool_timeout_s: float = 10.0,
        per_test_timeout_s: float = 2.0,
        max_turns: int = 1,
        **kwargs: Any,
    ) -> None:
        if max_turns != 1:
            raise ValueError("PythonUnitTest-v0 is single-turn: the one action is the submission")
        super().__init__(
            dataset=dataset if dataset is not None else TaskDataset(BUILTIN_TASKS),
            tool_timeout_s=tool_timeout_s,
            max_turns=1,
            stateless=True,
            **kwargs,
        )
        self.per_test_timeout_s = per_test_timeout_s

    def tools(self) -> dict[str, Any]:
        """No callable tools: the sandbox runs the submission and the tests, not the policy's calls."""
        return {}

    def respond(self, action: str) -> Any:
        """Single turn: the action is the submission, scored when the episode ends."""
        return super(ToolEnv, self).respond(action)

    def score(self, task: Task, response: str) -> Score:
        """Run the last ```python block of the response against the task's hidden tests."""
        tests = list(task.data.get("tests") or [])
        if not tests:
            raise ValueError(f"task {task.id!r} has no 'tests' to run")
        blocks = python_blocks(response, self.languages)
        if not blocks:
            return Score(0.0, "no_answer", details={"tests_total": len(tests), "tests_passed": 0})
        source = blocks[-1]
        marker = f"@@stare-{secrets.token_hex(8)}@@"
        harness = _HARNESS.format(
            marker=marker, source=source, tests=tests, per_test_s=self.per_test_timeout_s
        )
        result = self.session().run(harness, timeout_s=self.tool_timeout_s)
        self.stats.tool_calls += 1
        self.stats.tool_timeouts += int(result.status == "timeout")
        self.stats.tool_errors += int(result.status in ("error", "killed"))
        passed, failures, load_error = 0, [], None
        for line in result.stdout.splitlines():
            if not line.startswith(marker):
                continue
            report = json.loads(line[len(marker) :])
            if "load_error" in report:
                load_error = report["load_error"]
            elif report["passed"]:
                passed += 1
            else:
                failures.append(report["error"])
        # A test stopped by its own alarm is a tool timeout too, though the run as a whole finished.
        self.stats.tool_timeouts += sum(f.startswith("TimeoutError: test exceeded") for f in failures)
        reward = passed / len(tests)
        reason = "correct" if passed == len(tests) else ("error" if load_error else "wrong")
        if result.status == "timeout" and passed < len(tests):
            reason = "timeout"
        details = {
            "tests_total": len(tests),
            "tests_passed": passed,
            "status": result.status,
            "load_error": load_error,
            "failures": failures[:5],
        }
        return Score(reward, reason, passed == len(tests), source, details)
