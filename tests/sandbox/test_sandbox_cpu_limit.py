"""A call's limit is the CPU time its code uses, with a wall-clock cap for code that sleeps or waits: a busy
machine never fails an honest program, and nothing the code does (spin, sleep, fork busy children, run busy
subprocesses one after another) outlives its limits. Each on the local backend and on Docker (where the image
is there), with two busy processes on the machine's cores where load is the point."""

from __future__ import annotations

import pytest
from sandbox_support import ONE_CPU_SECOND, busy_neighbours, code_niceness, processes
from support import require

from stare_agents.envs.tools import PythonTool
from stare_agents.sandbox import DEFAULT_IMAGE, DockerSandbox, LocalSandbox, docker_status
from stare_agents.sandbox.channel import check_limits
from stare_agents.sandbox.runner import WALL_FACTOR, default_wall_timeout

ROOMY_WALL_S = 60.0  # a wall cap no loaded machine reaches here: what stops these calls is their CPU time


@pytest.fixture(scope="module", params=["local", "docker"])
def sandbox(request):
    if request.param == "docker":
        available, reason = docker_status(DEFAULT_IMAGE)
        require(
            available,
            "a Docker engine with the sandbox image",
            f"{reason} (bash scripts/provision_docker.sh)",
        )
        box = DockerSandbox(pool_size=1, preimport=())
    else:
        box = LocalSandbox(pool_size=1, preimport=(), allow_host_execution=True)
    with box:
        yield box


def test_an_honest_program_passes_while_two_busy_processes_share_the_cores(sandbox):
    with busy_neighbours(code_niceness(sandbox)), sandbox.session() as s:
        r = s.run(ONE_CPU_SECOND, timeout_s=2, wall_timeout_s=ROOMY_WALL_S)
    assert (r.status, r.stdout) == ("ok", "done\n"), r
    assert 0.9 <= r.cpu_s < 2.0  # measured by the sandbox (in clock ticks), not by the code


def test_a_busy_loop_is_cut_off_at_its_cpu_limit_and_keeps_the_session(sandbox):
    with sandbox.session() as s:
        s.run("before = 1")
        r = s.run("during = 2\nwhile True: pass", timeout_s=1, wall_timeout_s=ROOMY_WALL_S)
        assert r.status == "timeout" and "the code used its 1 s of CPU time and was interrupted" in r.stderr
        assert 0.95 <= r.cpu_s < 1.6, r.cpu_s
        assert s.run("print(before, during)").stdout == "1 2\n"  # assigned before the interrupt: kept


def test_a_sleeper_is_cut_off_at_the_wall_clock_cap_and_keeps_the_session(sandbox):
    with sandbox.session() as s:
        r = s.run("slept = 1\nimport time\ntime.sleep(600)", timeout_s=1, wall_timeout_s=1.5)
        assert r.status == "timeout" and "ran past the 1.5 s wall-clock limit" in r.stderr, r
        assert (
            "(it slept, waited, or got little CPU)" in r.stderr
            and r.cpu_s < 0.5
            and r.duration_s < 1.5 + 1 + 5
        )
        assert s.run("print(slept)").stdout == "1\n"


def test_busy_children_count_and_are_cut_off_with_the_call(sandbox):
    forks = (
        "import os\nforked = 1\nfor _ in range(2):\n    if os.fork() == 0:\n        while True:\n            pass\n"
        "os.wait()"
    )
    with sandbox.session() as s:
        before = processes(s)
        r = s.run(forks, timeout_s=1, wall_timeout_s=ROOMY_WALL_S)
        assert r.status == "timeout" and "used its 1 s of CPU time" in r.stderr, r
        assert 0.95 <= r.cpu_s < 2.0  # the children's time: the parent only waited
        assert processes(s) == before  # the children ended with the call
        assert s.run("print(forked)").stdout == "1\n"


def test_children_that_ended_count_too(sandbox):
    """Busy subprocesses run one after another: each one's time moves to the interpreter that collects it,
    and their sum reaches the limit though the interpreter itself only waits."""
    runs = "import subprocess, sys\nwhile True:\n    subprocess.run([sys.executable, '-c', 'sum(range(3 * 10**6))'])"
    with sandbox.session() as s:
        r = s.run(runs, timeout_s=1.5, wall_timeout_s=ROOMY_WALL_S)
        assert r.status == "timeout" and "used its 1.5 s of CPU time" in r.stderr, r
        assert s.run("print(1)").stdout == "1\n"


def test_limits_are_checked_with_the_key_named():
    assert check_limits(2) == (2.0, 2.0 * WALL_FACTOR) and default_wall_timeout(2000) == 3600.0
    assert check_limits(2, 3) == (2.0, 3.0) and check_limits(2, 2) == (2.0, 2.0)
    with pytest.raises(ValueError, match=r"wall_timeout_s=1 is below timeout_s=2: .*CPU time"):
        check_limits(2, 1)
    with pytest.raises(ValueError, match=r"env.tool_wall_timeout_s=1 is below env.tool_timeout_s=2"):
        check_limits(2, 1, ("env.tool_timeout_s", "env.tool_wall_timeout_s"))
    for bad in (0, -1, float("nan"), float("inf"), 3601):
        with pytest.raises(ValueError, match="wall_timeout_s must be a finite number of seconds"):
            check_limits(1, bad)
    with pytest.raises(ValueError, match=r"wall_timeout_s=0\.5 is below timeout_s=1"):
        PythonTool(None, timeout_s=1, wall_timeout_s=0.5)
    tool = PythonTool(None, timeout_s=2)
    assert (tool.timeout_s, tool.wall_timeout_s) == (2.0, 8.0)
    box = LocalSandbox(allow_host_execution=True, default_timeout_s=3)  # not started: nothing runs
    assert (box.session().timeout_s, box.session().wall_timeout_s) == (3.0, 12.0)
    with pytest.raises(ValueError, match="wall_timeout_s=1 is below timeout_s=3"):
        box.session(wall_timeout_s=1)
