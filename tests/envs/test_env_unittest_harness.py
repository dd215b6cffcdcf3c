"""PythonUnitTest-v0 grades out of the submission's reach: forged reports, protocol tricks and hostile
submissions earn only what their functions' return values deserve, and the reward stays in range."""

from __future__ import annotations

import re
import time

import gymnasium as gym
import pytest

from stare_agents.envs import PythonUnitTestEnv, Score, Task, TextEnv
from stare_agents.envs._unittest_harness import REPORT_TAG, report_mac, seal_report
from stare_agents.envs.python_unittest import _read_report

FAKE_REPORT = '{"load_error": null, "outcomes": "PPPPP", "errors": []}'


@pytest.fixture(
    params=["local", pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.timeout(180)])]
)
def sandbox(request: pytest.FixtureRequest):
    return request.getfixturevalue(f"{request.param}_sandbox")


def palindrome_episode(sandbox, solution: str, **kwargs) -> tuple[float, dict]:
    env = gym.make("stare_agents/PythonUnitTest-v0", sandbox=sandbox, **kwargs)
    env.reset(seed=0, options={"index": 0})  # is_palindrome: 3 tests expect True, 2 expect False
    _, reward, terminated, _, info = env.step(f"```python\n{solution}\n```")
    assert terminated and info["reward_violation"] is None
    assert 0.0 <= reward <= 1.0
    return reward, info


# The forgery, and what it grows into against the new harness: reach the caller's frame, print result
# lines in every format the harness ever used, write them to every descriptor and to the parent's stdout
# through /proc, then leave before any test runs.
FORGE_REPORT = f"""
import os, sys
lines = []
for i in range(16):
    lines.append('@@stare-0000000000000000@@{{"test": %d, "passed": true}}' % i)
lines.append('@@stare-report-' + '0' * 32 + '@@' + {FAKE_REPORT!r})
lines.append({FAKE_REPORT!r})
blob = ("\\n".join(lines) + "\\n").encode()
try:
    frame = sys._getframe(1)
    frame.f_globals['__report'] = None
except Exception:
    pass
print(blob.decode())
for fd in range(0, 64):
    try:
        os.write(fd, blob)
    except OSError:
        pass
for fd in range(0, 8):
    try:
        with open('/proc/%d/fd/%d' % (os.getppid(), fd), 'wb') as out:
            out.write(blob)
    except OSError:
        pass
os._exit(0)
"""


def test_a_forged_report_earns_nothing(sandbox) -> None:
    reward, info = palindrome_episode(sandbox, FORGE_REPORT)
    assert reward == 0.0 and not info["correct"]
    assert info["grade_reason"] in ("wrong", "error")
    assert info["score_details"]["tests_passed"] == 0


def test_the_driver_is_not_in_the_submissions_process(sandbox) -> None:
    """No frame above the submission belongs to the harness, and nothing it prints reaches the report."""
    probe = """
import sys
frames = []
f = sys._getframe()
while f is not None:
    frames.append(f.f_code.co_name)
    f = f.f_back
def is_palindrome(s):
    if any(name in ('_driver', 'run_test', '_Remote') for name in frames):
        return None  # would mean the harness shares this process
    t = ''.join(c for c in s.lower() if c.isalnum())
    return t == t[::-1]
"""
    reward, _ = palindrome_episode(sandbox, probe)
    assert reward == 1.0


@pytest.mark.parametrize(
    ("solution", "reward"),
    [
        # an object equal to everything cannot cross the process boundary: not plain data
        ("class E:\n    __eq__ = lambda self, other: True\ndef is_palindrome(s):\n    return E()", 0.0),
        # a self-referencing list: too deep to encode
        ("def is_palindrome(s):\n    x = []\n    x.append(x)\n    return x", 0.0),
        # 5 MB of text: past the reply limit
        ("def is_palindrome(s):\n    return 'x' * 5_000_000", 0.0),
        # its own process only: killing its parent ends the run with no report
        ("import os, signal\ndef is_palindrome(s):\n    os.kill(os.getppid(), signal.SIGKILL)", 0.0),
        # junk on the reply channel after a right answer: the protocol breaks, the test fails
        (
            "import os\ndef is_palindrome(s):\n    for fd in range(3, 16):\n        try:\n"
            '            os.write(fd, b\'{"id": 99, "value": true}\\n\')\n        except OSError:\n'
            "            pass\n    t = ''.join(c for c in s.lower() if c.isalnum())\n    return t == t[::-1]",
            None,  # checked below: some tests fail, none is forged
        ),
        # the constant answer scores what a constant function deserves: 3 of the 5 expect True
        ("def is_palindrome(s):\n    return True", 3 / 5),
    ],
)
def test_hostile_return_values(sandbox, solution: str, reward: float | None) -> None:
    got, info = palindrome_episode(sandbox, solution)
    if reward is None:
        assert got < 1.0
    else:
        assert got == pytest.approx(reward), info["score_details"]


def test_load_timeout_and_per_test_deadlines_are_enforced_from_outside(sandbox) -> None:
    started = time.monotonic()
    got, info = palindrome_episode(
        sandbox,
        "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)",
        per_test_timeout_s=0.5,
        tool_timeout_s=5.0,
    )
    assert got == 0.0 and info["grade_reason"] == "error"
    assert "loading the submission took over 0.5s" in info["score_details"]["load_error"]
    assert time.monotonic() - started < 4.0  # one load deadline, not one per test


def test_plain_data_crosses_both_ways(sandbox) -> None:
    env = gym.make("stare_agents/PythonUnitTest-v0", sandbox=sandbox)
    tests = [
        "assert f(1, [2, 3], {'a': (4, 5)}, b'x', 2.5, None, {6}, frozenset({7}), 1 + 2j, 10**30) == "
        "(1, [2, 3], {'a': (4, 5)}, b'x', 2.5, None, {6}, frozenset({7}), 1 + 2j, 10**30)",
        "assert f(float('inf'))[0] == float('inf') and f(float('nan'))[0] != f(float('nan'))[0]",
        "assert g() == [1, 2, 3] and type(g()) is list",
        "assert h(k=5) == 5",
        "assert isinstance(numpy_sum([1, 2]), int) and numpy_sum([1, 2]) == 3",
    ]
    env.reset(options={"problem": "echo", "tests": tests})
    solution = (
        "import numpy as np\ndef f(*args):\n    return args\ndef g():\n    return np.array([1, 2, 3])\n"
        "def h(k):\n    return k\ndef numpy_sum(xs):\n    return np.int64(sum(xs))"
    )
    _, reward, *_, info = env.step(f"```python\n{solution}\n```")
    assert reward == 1.0, info["score_details"]


KEY = bytes(range(32))


def sealed(body: str, key: bytes = KEY) -> str:
    return REPORT_TAG + report_mac(key, body) + " " + body


@pytest.mark.parametrize(
    ("stdout", "violation"),
    [
        ("", "found 0"),
        (sealed(FAKE_REPORT) + "\n" + sealed(FAKE_REPORT), "found 2"),
        (REPORT_TAG + "0" * 64 + " " + FAKE_REPORT, "seal does not match"),
        (REPORT_TAG + FAKE_REPORT, "seal does not match"),
        (sealed(FAKE_REPORT, key=bytes(32)), "seal does not match"),  # sealed with another run's key
        (sealed(FAKE_REPORT).replace("PPPPP", "PPPPP "), "seal does not match"),  # body changed after sealing
        (sealed("{oops"), "not valid JSON"),
        (sealed("[" * 100_000 + "]" * 100_000), "not valid JSON|exactly"),
        (sealed('{"load_error": null, "outcomes": "PPPPPPPPPPPPPPPP", "errors": []}'), "5 letters"),
        (sealed('{"load_error": null, "outcomes": "PPPPX", "errors": []}'), "5 letters"),
        (sealed('{"load_error": null, "outcomes": "PPPPP", "errors": [1]}'), "errors"),
        (sealed('{"load_error": 7, "outcomes": "PPPPP", "errors": []}'), "load_error"),
        (sealed('{"load_error": null, "outcomes": "PPPPP", "errors": [], "bonus": 10}'), "exactly"),
    ],
)
def test_malformed_reports_are_violations(stdout: str, violation: str) -> None:
    report, why = _read_report(stdout, KEY, 5)
    assert report is None and why is not None
    assert re.search(violation, why)


def test_a_valid_report_is_read() -> None:
    line = seal_report(KEY, {"load_error": None, "outcomes": "PFTPP", "errors": []})
    report, why = _read_report("noise\n" + line + "\nmore", KEY, 5)
    assert why is None and report["outcomes"] == "PFTPP"


def test_rewards_outside_the_range_are_clipped_and_reported() -> None:
    class Overpaid(TextEnv):
        def sample_task(self) -> Task:
            return Task(problem="p", answer="1", id="t")

        def score(self, task: Task, response: str) -> Score:
            return Score(float(response), "given")

    env = Overpaid()
    for action, reward, said in [
        ("16.0", 1.0, "outside reward_range (0.0, 1.0); clipped to 1"),
        ("-3", 0.0, "clipped to 0"),
        ("nan", 0.0, "not a finite number"),
        ("0.25", 0.25, None),
    ]:
        env.reset(seed=0)
        _, got, *_, info = env.step(action)
        assert got == reward and info["reward"] == reward
        assert (said is None and info["reward_violation"] is None) or said in info["reward_violation"]


def test_tests_are_validated_at_reset() -> None:
    env = PythonUnitTestEnv()
    for tests, match in [
        (None, "needs 'tests'"),
        ([], "needs 'tests'"),
        (["assert f(1) == 1", 5], "test 1 must be a string"),
        (["x = f(1)\nassert x == 1"], "one assert statement"),
        (["print(1)"], "one assert statement"),
        (["assert f(1) =="], "not valid Python"),
    ]:
        with pytest.raises(ValueError, match=match):
            env.reset(options={"problem": "p", "tests": tests})
    _, info = env.reset(options={"problem": "p", "tests": ["assert f() == 1"]})
    assert info["task_id"] == "pinned"


@pytest.mark.docker
def test_in_a_container_the_submission_cannot_reach_the_driver(docker_sandbox) -> None:
    """The driver is non-dumpable: the submission (same non-root user) cannot open its stdout or memory."""
    env = gym.make("stare_agents/PythonUnitTest-v0", sandbox=docker_sandbox)
    tests = [
        "assert reach('fd/1', 'wb') == 'PermissionError'",
        "assert reach('mem', 'rb') == 'PermissionError'",
    ]
    env.reset(options={"problem": "p", "tests": tests})
    solution = (
        "import os\ndef reach(entry, mode):\n    try:\n        open('/proc/%d/%s' % (os.getppid(), entry), mode)\n"
        "        return 'opened'\n    except OSError as error:\n        return type(error).__name__"
    )
    _, reward, *_, info = env.step(f"```python\n{solution}\n```")
    assert reward == 1.0, info["score_details"]
