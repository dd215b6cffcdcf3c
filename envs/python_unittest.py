"""`PythonUnitTest-v0`: write a function; the reward is the fraction of hidden unit tests that pass.

Single turn. The policy answers with its implementation in a ```python block (the last complete block is
the submission). The tests are graded out of the submission's reach (`envs/_unittest_harness.py`): in a
fresh sandbox session a driver process evaluates each test (one `assert` statement) and a separate
interpreter, which imports the submission as the module `solution`, answers the driver's calls to the
submission's functions with plain data. The expected values, the comparisons and the verdicts never enter the
submission's process. The driver writes its report on the sandbox's stdout only once every process of the
submission is gone, sealed with a key made for the run that the submission cannot read; the host checks the
seal, then the report's shape and count. A submission can influence only what its
functions return. Each test has its own deadline (`per_test_timeout_s`), enforced from outside the submission.

Tasks come from a built-in set (`BUILTIN_TASKS`) or from a dataset whose rows carry "problem" (the
description) and "tests" (a list of `assert` statements). A test calls the submission's functions by name;
arguments and return values must be plain data (None, bool, int, float, complex, str, bytes, list, tuple,
dict, set, frozenset; numpy values are converted). Put expected values in the test, not in the call.
"""

from __future__ import annotations

import ast
import hmac
import json
import secrets
from pathlib import Path
from typing import Any, ClassVar

from stare_agents.envs._unittest_harness import REPORT_TAG, report_mac
from stare_agents.envs.core import Score, TextEnv, load_prompt
from stare_agents.envs.grading import charge_grading_clock
from stare_agents.envs.parsing import PYTHON_LANGUAGES, python_blocks
from stare_agents.envs.tasks import Task, TaskDataset
from stare_agents.envs.tools import shared_sandbox
from stare_agents.sandbox.channel import check_limits
from stare_agents.sandbox.runner import DEFAULT_TIMEOUT_S

HARNESS_SOURCE = Path(__file__).with_name("_unittest_harness.py").read_text(encoding="utf-8")
# Reasons a unit-test score can give (Score.reason).
UNITTEST_REASONS: tuple[str, ...] = ("correct", "wrong", "error", "timeout", "no_answer", "harness_violation")
MAX_TESTS = 1000
MAX_ERRORS = 5  # failure messages the report carries

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


class PythonUnitTestEnv(TextEnv):
    """Write a function that passes hidden unit tests; reward = passed / total (in [0, 1]).

    Args (besides `TextEnv`'s): sandbox (None: the process-wide shared one), tool_timeout_s (the CPU seconds of
    the whole test run, default DEFAULT_TIMEOUT_S, 5 s), tool_wall_timeout_s (its wall-clock cap, default 4 x
    tool_timeout_s), per_test_timeout_s (each test including any load of the submission, default 2 s),
    dataset (rows with "problem" and "tests"; default: the built-in tasks).

    Score reasons: "correct" (all pass), "wrong", "error" (the submission does not load), "timeout" (the run
    produced no report in time), "no_answer" (no complete ```python block), "harness_violation" (the report
    was malformed: counted as a tool error, reward 0, `score_details["violation"]` says what was wrong).
    """

    default_max_turns: ClassVar[int] = 1
    default_prompt_template: ClassVar[str] = load_prompt("python_unittest")
    uses_sandbox: ClassVar[bool] = True
    example_task_options: ClassVar[dict[str, Any]] = {
        "problem": "Write add(a, b).",
        "tests": ["assert add(2, 3) == 5"],
    }

    def __init__(
        self,
        *,
        dataset: Any = None,
        sandbox: Any = None,
        tool_timeout_s: float = DEFAULT_TIMEOUT_S,
        tool_wall_timeout_s: float | None = None,
        per_test_timeout_s: float = 2.0,
        max_turns: int = 1,
        languages: tuple[str, ...] = PYTHON_LANGUAGES,
        **kwargs: Any,
    ) -> None:
        if max_turns != 1:
            raise ValueError("PythonUnitTest-v0 is single-turn: the one action is the submission")
        if not (per_test_timeout_s > 0 and tool_timeout_s > per_test_timeout_s):
            raise ValueError(
                f"need 0 < per_test_timeout_s < tool_timeout_s, got {per_test_timeout_s!r} and {tool_timeout_s!r}"
            )
        super().__init__(
            dataset=dataset if dataset is not None else TaskDataset(BUILTIN_TASKS), max_turns=1, **kwargs
        )
        self._sandbox = sandbox
        self.tool_timeout_s, self.tool_wall_timeout_s = check_limits(
            tool_timeout_s, tool_wall_timeout_s, ("tool_timeout_s", "tool_wall_timeout_s")
        )
        self.per_test_timeout_s = per_test_timeout_s
        self.languages = languages

    @property
    def sandbox(self) -> Any:
        """The injected sandbox, or the process-wide shared one."""
        return self._sandbox if self._sandbox is not None else shared_sandbox()

    def validate_task(self, task: Task) -> None:
        """A task needs "tests": a non-empty list of strings, each a single `assert` statement."""
        tests = task.data.get("tests")
        if not isinstance(tests, list | tuple) or not tests or len(tests) > MAX_TESTS:
            raise ValueError(
                f"task {task.id!r} needs 'tests': a list of 1..{MAX_TESTS} assert statements (strings), got "
                f"{_short(tests)}; pin one with reset(options={{'problem': ..., 'tests': ['assert f(1) == 2']}})"
            )
        for index, test in enumerate(tests):
            if not isinstance(test, str):
                raise ValueError(f"task {task.id!r}: test {index} must be a string, got {_short(test)}")
            try:
                body = ast.parse(test).body
            except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
                raise ValueError(
                    f"task {task.id!r}: test {index} is not valid Python ({error}): {_short(test)}"
                ) from None
            if len(body) != 1 or not isinstance(body[0], ast.Assert):
                raise ValueError(
                    f"task {task.id!r}: test {index} must be one assert statement, got {_short(test)}"
                )

    def score(self, task: Task, response: str) -> Score:
        """Run the last ```python block of the response against the task's hidden tests."""
        tests = list(task.data["tests"])
        blocks = python_blocks(response, self.languages)
        if not blocks:
            return Score(0.0, "no_answer", details={"tests_total": len(tests), "tests_passed": 0})
        source = blocks[-1]
        key = secrets.token_bytes(32)  # seals the report; only the host and the driver's memory hold it
        params = {
            "source": source,
            "tests": tests,
            "per_test_s": self.per_test_timeout_s,
            "budget_s": max(self.per_test_timeout_s, self.tool_timeout_s - 1.0),
            "key": key.hex(),
        }
        code = (
            f"{HARNESS_SOURCE}\n_SOURCE = {HARNESS_SOURCE!r}\n"
            f"import json as _json\n_driver(_json.loads({json.dumps(params, allow_nan=False)!r}))\n"
        )
        with self.sandbox.session(stateless=True) as session:
            result = session.run(code, timeout_s=self.tool_timeout_s, wall_timeout_s=self.tool_wall_timeout_s)
        charge_grading_clock(result.duration_s, timed_out=result.status == "timeout")
        report, violation = _read_report(result.stdout, key, len(tests))
        self.stats.count_call("error" if violation is not None and result.status == "ok" else result.status)
        details: dict[str, Any] = {"tests_total": len(tests), "tests_passed": 0, "status": result.status}
        if report is None:
            reason = "timeout" if result.status == "timeout" else "harness_violation"
            details["violation"] = violation
            return Score(0.0, reason, False, source, details)
        outcomes = report["outcomes"]
        passed = outcomes.count("P")
        self.stats.tool_timeouts += outcomes.count("T")  # tests stopped at their deadline
        reward = passed / len(tests)
        reason = "correct" if passed == len(tests) else ("error" if report["load_error"] else "wrong")
        details.update(
            tests_passed=passed, load_error=report["load_error"], failures=report["errors"], violation=None
        )
        return Score(reward, reason, passed == len(tests), source, details)


def _read_report(stdout: str, key: bytes, count: int) -> tuple[dict[str, Any] | None, str | None]:
    """The driver's report, validated: (report, None), or (None, what was wrong).

    The one line that starts with REPORT_TAG, then the seal (HMAC-SHA256 of the body under the run's `key`),
    then the body: `{"errors": [str, ...], "load_error": str | null, "outcomes": str}`, one letter per test
    (P passed, F failed, T timed out) and the messages of the first few failures.
    """
    lines = [line for line in stdout.splitlines() if line.startswith(REPORT_TAG)]
    if len(lines) != 1:
        return None, f"expected one report line, found {len(lines)}"
    mac, _, body = lines[0][len(REPORT_TAG) :].partition(" ")
    if not hmac.compare_digest(mac.encode(), report_mac(key, body).encode()):
        return None, "the report's seal does not match the run's key"
    try:
        report = json.loads(body)
    except (ValueError, RecursionError):
        return None, "the report is not valid JSON"
    if not isinstance(report, dict) or set(report) != {"load_error", "outcomes", "errors"}:
        return None, "the report must be an object with exactly load_error, outcomes and errors"
    outcomes, errors = report["outcomes"], report["errors"]
    if not isinstance(outcomes, str) or len(outcomes) != count or set(outcomes) - set("PFT"):
        return None, f"the outcomes must be {count} letters P, F or T"
    if (
        not isinstance(errors, list)
        or len(errors) > MAX_ERRORS
        or not all(isinstance(e, str) for e in errors)
    ):
        return None, f"the errors must be a list of at most {MAX_ERRORS} strings"
    if not isinstance(report["load_error"], str | None):
        return None, "load_error must be a string or null"
    return report, None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["BUILTIN_TASKS", "UNITTEST_REASONS", "PythonUnitTestEnv"]
