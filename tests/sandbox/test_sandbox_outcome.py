"""What a sandboxed call comes to, decided without running anything: `runner.call_outcome` (status, notes,
restart) from how the wait for the worker's reply ended, and `runner.compose_reply` (the reply frame, with
`truncated`) from the captured output. Every expected value is written out by hand."""

from __future__ import annotations

import pytest

from stare_agents.sandbox.result import STATUSES
from stare_agents.sandbox.runner import CallEnd, CallLimits, Outcome, _Capture, call_outcome, compose_reply

LOST = "the interpreter was restarted and this session's variables were lost"


def reply(status: str = "ok", threads: int = 1) -> dict:
    return {"status": status, "threads": threads, "call": 1}


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        # the code ran to its end: the worker's word stands, nothing is noted, nothing restarted
        (CallEnd(reply=reply("ok")), Outcome("ok")),
        (CallEnd(reply=reply("error")), Outcome("error")),
        (CallEnd(reply=reply("error", threads=4)), Outcome("error")),  # threads matter only when interrupted
        # interrupted at the deadline and unwound: a timeout that keeps the session
        (
            CallEnd(reply=reply("interrupted"), interrupted=True),
            Outcome(
                "timeout",
                (
                    "TimeoutError: the code used its 2.5 s of CPU time and was interrupted; "
                    "the session's variables are kept",
                ),
            ),
        ),
        # it finished just as SIGINT was sent: still the timeout it ran into
        (
            CallEnd(reply=reply("ok"), interrupted=True),
            Outcome(
                "timeout",
                (
                    "TimeoutError: the code used its 2.5 s of CPU time and was interrupted; "
                    "the session's variables are kept",
                ),
            ),
        ),
        # the worker says it was interrupted although no deadline passed (the code raised KeyboardInterrupt)
        (
            CallEnd(reply=reply("interrupted")),
            Outcome(
                "timeout",
                (
                    "TimeoutError: the code used its 2.5 s of CPU time and was interrupted; "
                    "the session's variables are kept",
                ),
            ),
        ),
        # interrupted, but threads it started run on: the interpreter goes
        (
            CallEnd(reply=reply("interrupted", threads=3), interrupted=True),
            Outcome(
                "timeout",
                (
                    "TimeoutError: the code used its 2.5 s of CPU time and was interrupted; threads it started "
                    f"were still running, so {LOST}",
                ),
                restart=True,
            ),
        ),
        # the wall-clock cap reached by code that slept or waited: said so, with the CPU time it used
        (
            CallEnd(reply=reply("interrupted"), interrupted=True, limit="wall", cpu_s=0.013),
            Outcome(
                "timeout",
                (
                    "TimeoutError: the code ran past the 10 s wall-clock limit while using 0.01 s of its 2.5 s "
                    "of CPU time (it slept, waited, or got little CPU) and was interrupted; the session's variables are kept",
                ),
            ),
        ),
        (
            CallEnd(interrupted=True, hard_killed=True, limit="wall", cpu_s=0.0),
            Outcome(
                "timeout",
                (
                    "TimeoutError: the code ran past the 10 s wall-clock limit while using 0.00 s of its 2.5 s "
                    f"of CPU time (it slept, waited, or got little CPU) and did not stop when interrupted; {LOST}",
                ),
                restart=True,
            ),
        ),
        # the host cancelled (a session closed mid-call)
        (
            CallEnd(reply=reply("interrupted"), interrupted=True, cancelled=True),
            Outcome(
                "timeout",
                (
                    "CancelledError: the caller cancelled the call and it was interrupted; "
                    "the session's variables are kept",
                ),
            ),
        ),
        # no reply within the grace period after the interrupt
        (
            CallEnd(interrupted=True, hard_killed=True),
            Outcome(
                "timeout",
                (
                    f"TimeoutError: the code used its 2.5 s of CPU time and did not stop when interrupted; {LOST}",
                ),
                restart=True,
            ),
        ),
        (
            CallEnd(interrupted=True, hard_killed=True, cancelled=True),
            Outcome(
                "timeout",
                (f"the call was cancelled and did not stop when interrupted; {LOST}",),
                restart=True,
            ),
        ),
        # the code wrote to the control channel: the call's error, never a crash
        (
            CallEnd(violation="a reply frame of 9999 bytes"),
            Outcome(
                "error",
                (
                    "SandboxError: the code wrote to the sandbox's control channel (a reply frame of 9999 "
                    f"bytes); {LOST}",
                ),
                restart=True,
            ),
        ),
        # a forged frame outranks the deadline that passed meanwhile
        (
            CallEnd(violation="the status 'fine'", interrupted=True, hard_killed=True),
            Outcome(
                "error",
                (
                    f"SandboxError: the code wrote to the sandbox's control channel (the status 'fine'); {LOST}",
                ),
                restart=True,
            ),
        ),
    ],
)
def test_call_outcome(end, expected):
    outcome = call_outcome(end, CallLimits(2.5, 10.0))
    assert outcome == expected
    assert outcome.status in STATUSES


@pytest.mark.parametrize(
    ("exit_code", "memory_hint", "note"),
    [
        (
            -9,
            "512 MB",
            "the interpreter was killed by SIGKILL (most likely out of memory: the limit is 512 MB); "
            "it was restarted and this session's variables were lost",
        ),
        (
            -9,
            "",
            "the interpreter was killed by SIGKILL; it was restarted and this session's variables were lost",
        ),
        (
            -11,
            "512 MB",
            "the interpreter was killed by SIGSEGV (a segmentation fault, e.g. from ctypes or unbounded "
            "recursion); it was restarted and this session's variables were lost",
        ),
        (
            3,
            "512 MB",
            "the interpreter exited with code 3; it was restarted and this session's variables were lost",
        ),
        (
            None,
            "512 MB",
            "the interpreter stopped answering; it was restarted and this session's variables were lost",
        ),
    ],
)
def test_a_worker_that_died_is_killed(exit_code, memory_hint, note):
    outcome = call_outcome(CallEnd(died=True), CallLimits(), exit_code=exit_code, memory_hint=memory_hint)
    assert outcome == Outcome("killed", (note,), restart=True)


def capture(cap: int, *chunks: bytes) -> _Capture:
    captured = _Capture(cap)
    for chunk in chunks:
        captured.feed(chunk)
    return captured


def test_capture_keeps_head_and_tail_around_a_marker():
    assert capture(8, b"0123", b"4567").result() == b"01234567"
    assert not capture(8, b"01234567").truncated
    cut = capture(8, b"01", b"23456", b"789")  # 10 bytes, 4 + 4 kept
    assert cut.truncated
    assert cut.result() == b"0123\n... [2 bytes of output truncated] ...\n6789"
    # no half characters: "é" is 2 bytes; a head ending in its first byte drops it, a tail starting in its
    # second byte drops that
    assert (
        capture(8, "abcé12é3".encode()).result() == b"abc\n... [3 bytes of output truncated] ...\n2\xc3\xa93"
    )
    assert capture(8, "abcdefgé123".encode()).result() == b"abcd\n... [5 bytes of output truncated] ...\n123"


def test_compose_reply_puts_the_notes_after_the_codes_stderr_and_says_truncated():
    outcome = Outcome("timeout", ("TimeoutError: ...", "second note"))
    header, out, err = compose_reply(outcome, capture(64, b"partial"), capture(64, b"Traceback"), 1.5, 0.75)
    assert (out, err) == (b"partial", b"Traceback\nTimeoutError: ...\nsecond note\n")
    assert header == {
        "status": "timeout",
        "truncated": False,
        "duration_s": 1.5,
        "cpu_s": 0.75,
        "stdout": 7,
        "stderr": 40,
    }
    header, out, err = compose_reply(Outcome("ok"), capture(8, b"x" * 20), capture(8, b"line\n"), 0.25)
    assert err == b"line\n" and out == b"xxxx\n... [12 bytes of output truncated] ...\nxxxx"
    assert header == {
        "status": "ok",
        "truncated": True,
        "duration_s": 0.25,
        "cpu_s": 0.0,
        "stdout": 48,
        "stderr": 5,
    }
    _, _, err = compose_reply(Outcome("ok"), capture(8), capture(64, b"ends with a newline\n"), 0.0)
    assert err == b"ends with a newline\n"  # nothing to note: stderr as the code wrote it
