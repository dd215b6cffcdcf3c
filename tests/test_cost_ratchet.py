"""The test-cost ratchet (tests/cost_ratchet.py): what it counts, what it leaves out, and that its list of
allowed slow tests only shrinks.

Each case runs a small inner pytest session in a subprocess with the plugin at a limit of 0.4 s of CPU (and no
slack unless the case is about it), and reads its exit code and summary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cost_ratchet import ALLOWED, LIMIT_S, SLACK

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

# burns `seconds` of CPU in this process, in a child, in a grandchild, or sleeps
BURN = """
import subprocess, sys, time

LOOP = "import time\\nend = time.process_time() + {s}\\nwhile time.process_time() < end: pass"


def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def in_child(seconds):
    subprocess.run([sys.executable, "-c", LOOP.format(s=seconds)], check=True)


def in_grandchild(seconds):
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {LOOP.format(s=seconds)!r}], check=True)"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


@pytest.fixture(autouse=True)
def plugin_on_path(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(pytester.path)]))


def run_inner(
    pytester: pytest.Pytester,
    tests: str,
    allowed: dict[str, float] | None = None,
    slack: float = 1.0,
    args: tuple[str, ...] = (),
):
    pytester.makepyfile(burn=BURN, test_inner=tests)
    pytester.makeconftest(
        f"""
from cost_ratchet import CostRatchet


def pytest_configure(config):
    config.pluginmanager.register(
        CostRatchet(limit_s=0.4, allowed={allowed or {}!r}, slack={slack!r}), "cost_ratchet"
    )
"""
    )
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--durations=5", *args, timeout=120)


def section(result: pytest.RunResult, title: str) -> list[str]:
    """The lines of the inner session's summary section whose header holds `title`."""
    lines = result.stdout.lines
    [start] = [i for i, line in enumerate(lines) if title in line and line.startswith(("=", "-"))]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("=", "-"))), len(lines))
    return lines[start + 1 : end]


def test_a_test_that_burns_cpu_in_a_child_or_grandchild_fails_the_session_by_name(pytester: pytest.Pytester):
    result = run_inner(
        pytester,
        """
from burn import burn, in_child, in_grandchild

def test_cheap(): burn(0.05)
def test_here(): burn(0.8)
def test_child(): in_child(0.8)
def test_grandchild(): in_grandchild(0.8)
""",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*over the test-cost limit (0.4 s of CPU*", "*4 passed*"])
    over = [line.split(":")[2] for line in section(result, "over the test-cost limit")[:-1]]
    assert sorted(over) == ["test_child", "test_grandchild", "test_here"]


def test_under_xdist_the_controller_judges_what_every_worker_measured(pytester: pytest.Pytester):
    """scripts/test.sh runs two xdist workers: a worker's costs reach the controller, which fails the session
    and names the tests of both workers (a worker alone would print its report nowhere)."""
    pytester.makepyfile(
        test_other="from burn import burn\n\ndef test_there(): burn(0.8)\ndef test_fine(): burn(0.05)\n"
    )
    result = run_inner(
        pytester,
        "from burn import burn, in_child\n\ndef test_here(): burn(0.8)\ndef test_child(): in_child(0.8)\n",
        args=("-n", "2", "--dist", "loadfile"),
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*2 workers*", "*over the test-cost limit (0.4 s of CPU*", "*4 passed*"])
    over = sorted(line.split(":")[2] for line in section(result, "over the test-cost limit")[:-1])
    assert over == ["test_child", "test_here", "test_there"]
    ranked = section(result, "costliest 5 by CPU")
    assert len(ranked) == 4 and any("test_fine" in line for line in ranked), ranked


def test_a_live_child_that_keeps_burning_across_tests_is_charged_to_each_test_for_its_share(
    pytester: pytest.Pytester,
):
    """A process started by one test and working on during the next (a server, an engine) is the next test's
    cost too: /proc is read at every boundary, not only when a child ends."""
    result = run_inner(
        pytester,
        """
import subprocess, sys, time
import psutil
from burn import LOOP

CHILD = []

def test_start():
    CHILD.append(subprocess.Popen([sys.executable, "-c", LOOP.format(s=3.0)]))

def test_wait():  # until the child has used 1.5 s of CPU, however loaded the machine
    while sum(psutil.Process(CHILD[0].pid).cpu_times()[:2]) < 1.5:
        time.sleep(0.05)

def test_reap():
    CHILD[0].wait()
""",
    )
    over = [line.split(":")[2] for line in section(result, "over the test-cost limit")[:-1]]
    assert sorted(over) == ["test_reap", "test_wait"]


def test_a_shared_fixture_is_charged_once_to_itself_not_to_the_test_that_ran_first(pytester: pytest.Pytester):
    result = run_inner(
        pytester,
        """
import pytest
from burn import in_child

@pytest.fixture(scope="module")
def engine():
    in_child(0.6)
    yield "engine"
    in_child(0.6)

def test_first(engine): assert engine
def test_second(engine): assert engine
""",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    [line, _remedy] = section(result, "over the test-cost limit")
    assert line.startswith("fixture engine (module test_inner.py): ")
    assert float(line.split(": ")[1].split(" s of CPU")[0]) > 1.0  # setup and teardown: 1.2 s, not 0.6


def test_an_allowed_test_passes_under_its_ceiling_and_fails_over_it(pytester: pytest.Pytester):
    tests = "from burn import burn\n\ndef test_slow(): burn(0.8)\n"
    assert run_inner(pytester, tests, {"test_inner.py::test_slow": 3.0}).ret == pytest.ExitCode.OK
    result = run_inner(pytester, tests, {"test_inner.py::test_slow": 0.6})
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*test_inner.py::test_slow: * s of CPU * > its ceiling in ALLOWED, 0.6 s*"])


def test_the_slack_warns_between_the_limit_and_fails_beyond_it(pytester: pytest.Pytester):
    """A test over its limit by less than the slack (a slower or busier CI machine) is named in a warning and
    passes; beyond the slack it fails, listed or not."""
    tests = "from burn import burn\n\ndef test_slow(): burn(0.8)\ndef test_listed(): burn(0.8)\n"
    allowed = {"test_inner.py::test_listed": 0.6}
    result = run_inner(pytester, tests, allowed, slack=2.5)
    assert result.ret == pytest.ExitCode.OK
    near = section(result, "within the slack (x2.5)")
    assert sorted(line.split(":")[2] for line in near) == ["test_listed", "test_slow"]
    assert "over the test-cost limit (" not in result.stdout.str()
    result = run_inner(pytester, tests, allowed, slack=1.25)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    failing = section(result, "over the test-cost limit (0.4 s of CPU, x1.25 slack")[:-1]
    assert sorted(line.split(":")[2] for line in failing) == ["test_listed", "test_slow"]


def test_an_allowed_test_that_got_cheap_is_named_for_removal(pytester: pytest.Pytester):
    result = run_inner(pytester, "def test_now_fast(): pass\n", {"test_inner.py::test_now_fast": 3.0})
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*now under the limit (remove them from ALLOWED)*", "test_inner.py::test_now_fast: *"]
    )


def test_waiting_is_not_cost_and_the_report_ranks_by_cpu(pytester: pytest.Pytester):
    """Wall time is left out on purpose (the module docstring says why): a test that sleeps costs nothing."""
    result = run_inner(
        pytester,
        """
import time
from burn import burn

def test_sleeps(): time.sleep(1.0)
def test_burns(): burn(0.2)
""",
    )
    assert result.ret == pytest.ExitCode.OK
    lines = section(result, "costliest 5 by CPU")
    assert (
        len(lines) == 2
        and lines[0].endswith("test_inner.py::test_burns")
        and lines[1].endswith("test_inner.py::test_sleeps")
    )


def test_a_failing_session_keeps_its_own_exit_code(pytester: pytest.Pytester):
    result = run_inner(
        pytester, "from burn import burn\n\ndef test_slow_and_wrong():\n    burn(0.8)\n    assert False\n"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_the_allowed_list_only_shrinks():
    """Lower this number when a test leaves ALLOWED; never raise it (make the new test cheaper instead)."""
    assert len(ALLOWED) <= 1
    assert LIMIT_S == 60.0 and SLACK == 1.5
    assert all(ceiling > LIMIT_S for ceiling in ALLOWED.values())
    assert sum(ALLOWED.values()) <= 125.0  # the ceilings shrink too: lower this with them
