"""LocalSandbox: the session API, limits and result contract, without Docker."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from stare_agents.sandbox import ExecutionResult, LocalSandbox


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(
        allow_host_execution=True, pool_size=2, default_timeout_s=10, max_output_bytes=4096, memory_mb=1024
    ) as box:
        yield box


def test_state_persists_within_a_session_and_not_across(sandbox):
    with sandbox.session() as s:
        assert s.run("x = 20", timeout_s=5).status == "ok"
        r = s.run("print(x + 22)")
        assert (r.stdout, r.stderr, r.status, r.truncated) == ("42\n", "", "ok", False)
        assert isinstance(r, ExecutionResult) and r.duration_s > 0
    with sandbox.session() as s:
        r = s.run("print(x)")
        assert r.status == "error" and "NameError" in r.stderr


def test_sessions_start_with_numpy_and_sympy_imported(sandbox):
    probe = "import sys, numpy\nprint('sympy' in sys.modules, numpy.random.randint(1 << 30))"
    outputs = []
    for _ in range(3):
        with sandbox.session() as s:
            outputs.append(s.run(probe).stdout.split())
    assert all(imported == "True" for imported, _ in outputs)
    assert len({number for _, number in outputs}) == 3  # reseeded per session


def test_stateless_session_forgets_variables(sandbox):
    with sandbox.session(stateless=True) as s:
        assert s.run("y = 1").status == "ok"
        assert "NameError" in s.run("print(y)").stderr


def test_error_has_a_traceback_of_the_users_code_only(sandbox):
    with sandbox.session() as s:
        r = s.run("def f():\n    return 1 / 0\nf()")
        assert r.status == "error"
        assert "ZeroDivisionError" in r.stderr and "<cell" in r.stderr and "runner.py" not in r.stderr
        assert s.run("print(f.__name__)").stdout == "f\n"  # the definition survived the error


def test_timeout_keeps_the_session(sandbox):
    with sandbox.session() as s:
        s.run("x = 1")
        r = s.run("import time\nx = 2\nwhile True: pass", timeout_s=0.5)
        assert r.status == "timeout" and "TimeoutError" in r.stderr and r.duration_s < 5
        assert s.run("print(x)").stdout == "2\n"  # assignments before the interrupt survive


def test_swallowed_interrupt_restarts_the_interpreter(sandbox):
    with sandbox.session() as s:
        s.run("x = 1")
        swallow = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except BaseException:\n        pass"
        r = s.run(swallow, timeout_s=0.3)
        assert r.status == "timeout" and "variables were lost" in r.stderr
        assert s.run("print(1)").stdout == "1\n"


def test_death_is_killed_and_the_session_continues(sandbox):
    with sandbox.session() as s:
        r = s.run("import os; os._exit(3)")
        assert r.status == "killed" and "exited with code 3" in r.stderr
        assert s.run("print('alive')").stdout == "alive\n"


def test_memory_limit(sandbox):
    with sandbox.session() as s:
        r = s.run("x = bytearray(2 * 1024**3)")
        assert r.status in ("error", "killed") and ("MemoryError" in r.stderr or "killed" in r.stderr)
        assert s.run("print(1)").status == "ok"


def test_output_is_capped_head_and_tail(sandbox):
    with sandbox.session() as s:
        r = s.run("print('A' * 10_000 + 'B' * 10_000)")
        assert r.truncated and r.status == "ok"
        assert r.stdout.startswith("A" * 100) and r.stdout.endswith("B" * 100 + "\n")
        assert "bytes of output truncated" in r.stdout and len(r.stdout) < 4096 + 100


def test_fd_level_capture_of_subprocess_and_c_output(sandbox):
    with sandbox.session() as s:
        r = s.run("import os, ctypes\nos.system('echo from-shell')\nctypes.CDLL(None).puts(b'from-libc')")
        assert r.status == "ok" and "from-shell" in r.stdout and "from-libc" in r.stdout


def test_binary_and_invalid_unicode_output(sandbox):
    with sandbox.session() as s:
        r = s.run("import sys; sys.stdout.buffer.write(b'\\xff\\xfe ok'); print('\\udcff')")
        assert r.status == "ok" and "\ufffd" in r.stdout and " ok" in r.stdout


def test_echo_prints_a_trailing_expression(sandbox):
    with sandbox.session(echo=True) as s:
        assert s.run("1 + 1").stdout == "2\n"
        assert s.run("x = 3").stdout == ""


def test_no_network(sandbox):
    with sandbox.session() as s:
        r = s.run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)")
        assert r.status == "error"
        r = s.run("print(open('/proc/net/dev').read().count(':'))")
        assert r.stdout.strip() == "1"  # loopback only


def test_run_rejects_non_string_code(sandbox):
    with sandbox.session() as s, pytest.raises(TypeError):
        s.run(b"print(1)")


def test_a_killed_host_leaves_no_interpreter_or_folder_behind():
    scratch = os.path.join(tempfile.gettempdir(), "stare-sandbox-*")  # the host's TMPDIR, as the sandbox's
    before = set(glob.glob(scratch))
    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from stare_agents.sandbox import LocalSandbox\nimport os, time\n"
            "box = LocalSandbox(2, allow_host_execution=True, preimport=()).start()\n"
            "print(' '.join(str(r.channel.process.pid) for r in box._pool._free), flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    supervisors = [int(pid) for pid in host.stdout.readline().split()]
    assert len(supervisors) == 2 and len(set(glob.glob(scratch)) - before) == 2
    os.kill(host.pid, signal.SIGKILL)
    host.wait()
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in supervisors) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in supervisors)  # they end when stdin closes
    assert set(glob.glob(scratch)) - before == set()  # and remove their folders


def test_deep_copy_shares_the_sandbox(sandbox):
    import copy

    holder = {"sandbox": sandbox, "other": [1, 2]}
    copied = copy.deepcopy(holder)
    assert copied["sandbox"] is sandbox and copied["other"] is not holder["other"]
    with copied["sandbox"].session() as s:
        assert s.run("print(6 * 7)").stdout == "42\n"
