"""Helpers of the sandbox tests that look inside a session (Docker's container, or the local runner's PID
namespace: in both the runner is PID 1)."""

from __future__ import annotations

import json

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
