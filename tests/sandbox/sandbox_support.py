"""Helpers of the sandbox tests (and benchmarks/bench_cpu_limit.py): what processes a session holds (Docker's
container, or the local runner's PID namespace: in both the runner is PID 1), a program of exactly one CPU
second, and busy neighbours at the code's own priority."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

from stare_agents.sandbox import DockerSandbox

PROCESSES = """
import json, os
def stat(pid):
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session
runner_session = stat(1)[3]
code, runner = [], []
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) not in (1, os.getpid()):
        try:
            fields = stat(p)
        except OSError:
            continue
        if fields[0] == "X":  # dead, being removed by the kernel this instant (a replaced worker): runs nothing
            continue
        (runner if fields[3] == runner_session else code).append(f"{p} {fields[0]} {fields[1]}")
print(json.dumps([code, runner]))
"""


def processes(session) -> list[str]:
    """Processes in the session's container other than this interpreter and the runner's own (PID 1,
    its template interpreter and one spare worker, which live in PID 1's session)."""
    r = session.run(PROCESSES)
    assert r.status == "ok", r
    code, runner = json.loads(r.stdout)
    assert len(runner) <= 3, runner  # template, spare, and at most a spare being forked
    return code


# exactly one second of this process's CPU time, whatever the machine's speed or load
ONE_CPU_SECOND = (
    "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\nprint('done')"
)


def code_niceness(sandbox) -> int:
    """The niceness the sandbox's code runs at: the local runner's is this process's, Docker's containers are
    the engine's children (0)."""
    return 0 if isinstance(sandbox, DockerSandbox) else os.getpriority(os.PRIO_PROCESS, 0)


@contextlib.contextmanager
def busy_neighbours(niceness: int, count: int = 2) -> Iterator[list[subprocess.Popen]]:
    """`count` Python busy loops at `niceness` (the code's own, as `nice -n 0` beside it: an equal share), one
    per core of this machine's two, for as long as the block runs."""

    def at_niceness() -> None:
        with contextlib.suppress(OSError):  # lowering it needs root; then they stay at this process's
            os.setpriority(os.PRIO_PROCESS, 0, niceness)

    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=at_niceness)
        for _ in range(count)
    ]
    try:
        yield loops
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
