"""The runner's own defences, without Docker: the scratch wipe, the syscall filter, reply checks, the
channel's signatures; and the session/pool rules of issue 10 (cancellation, close, finalisation, odd
input) through LocalSandbox, which shares the pool and the runner with DockerSandbox."""

from __future__ import annotations

import errno
import gc
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stare_agents.sandbox import STATUSES, LocalSandbox, SandboxError
from stare_agents.sandbox.channel import MAX_TIMEOUT_S, check_timeout
from stare_agents.sandbox.runner import (
    DEFAULT_TIMEOUT_S,
    IO_URING,
    ChannelKey,
    _Violation,
    _worker_reply,
    bounded_timeout,
    empty_folder,
    encode_frame,
    syscall_filter,
)
from stare_agents.sandbox.runner import MAX_TIMEOUT_S as runner_max_timeout

# ---------------------------------------------------------------------------------------- scratch wipe


def _hostile_tree(root: str, outside: str) -> None:
    """Folders chmodded to 000, a chain deeper than PATH_MAX, many files, a FIFO, a symlink out."""
    os.makedirs(os.path.join(root, "locked", "inner"))
    with open(os.path.join(root, "locked", "inner", "secret"), "w") as f:
        f.write("secret")
    os.chmod(os.path.join(root, "locked", "inner"), 0)
    os.chmod(os.path.join(root, "locked"), 0)
    deep = os.open(root, os.O_RDONLY)
    for _ in range(600):  # 600 * 12 characters: 7 kB of path, beyond PATH_MAX (4 kB)
        os.mkdir("d" * 11, dir_fd=deep)
        next_fd = os.open("d" * 11, os.O_RDONLY, dir_fd=deep)
        os.close(deep)
        deep = next_fd
    os.close(os.open("bottom", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=deep))
    os.fchmod(deep, 0)
    os.close(deep)
    os.mkdir(os.path.join(root, "many"))
    for i in range(2000):
        open(os.path.join(root, "many", str(i)), "w").close()
    os.mkfifo(os.path.join(root, "fifo"))
    os.symlink(outside, os.path.join(root, "link-out"))
    with open(os.path.join(root, "plain"), "w") as f:
        f.write("x")
    os.chmod(os.path.join(root, "plain"), 0)


def test_empty_folder_removes_a_hostile_tree_and_nothing_outside(tmp_path):
    root, outside = tmp_path / "scratch", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep").write_text("keep")
    _hostile_tree(str(root), str(outside))
    assert empty_folder(str(root), time.monotonic() + 30)
    assert os.listdir(root) == []
    assert (outside / "keep").read_text() == "keep"  # the symlink was removed, not followed


def test_empty_folder_stops_at_its_deadline(tmp_path):
    for i in range(50):
        (tmp_path / f"f{i}").mkdir()
    assert not empty_folder(str(tmp_path), time.monotonic() - 1)
    assert len(os.listdir(tmp_path)) == 50  # nothing was touched after the deadline
    assert empty_folder(str(tmp_path / "missing"), time.monotonic())  # no folder: nothing to do


# ------------------------------------------------------------------------------------- syscall filter


def test_syscall_filter_program_x86_64():
    program, denied = syscall_filter("x86_64", block_ipc=False, block_mqueue=False)
    # ld arch; jeq x86_64 else deny; ld nr; jge x32 -> deny; 3 x jeq io_uring -> deny;
    # jeq socket else allow; ld args[0]; jeq AF_ALG -> deny; jeq AF_VSOCK -> deny; ret allow; ret deny
    assert len(program) == 13
    assert program[0] == (0x20, 0, 0, 4)
    assert program[1] == (0x15, 0, 10, 0xC000003E)  # false: skip 10 to index 12 (deny)
    assert program[3] == (0x35, 8, 0, 0x40000000)  # true: 3 + 1 + 8 = 12
    assert [step[3] for step in program[4:7]] == [425, 426, 427]
    assert program[7] == (0x15, 0, 3, 41)  # socket, else to index 11 (allow)
    assert program[8] == (0x20, 0, 0, 16)
    assert program[9] == (0x15, 2, 0, 38) and program[10] == (0x15, 1, 0, 40)
    assert program[11] == (0x06, 0, 0, 0x7FFF0000) and program[12] == (0x06, 0, 0, 0x00050001)
    assert denied == [*IO_URING, "socket(AF_ALG)", "socket(AF_VSOCK)", "foreign ABIs"]
    program, denied = syscall_filter("x86_64", block_ipc=True, block_mqueue=True)
    assert len(program) == 17 and {"shmget", "semget", "msgget", "mq_open"} <= set(denied)
    program, _ = syscall_filter("aarch64", block_ipc=False, block_mqueue=False)
    assert len(program) == 12 and program[1][3] == 0xC00000B7 and program[6][3] == 198  # no x32 check


FILTER_PROBE = r"""
import ctypes, errno, json, os, socket, sys
sys.path.insert(0, sys.argv[1])
from runner import install_syscall_filter
install_syscall_filter(block_ipc=sys.argv[2] == "1", block_mqueue=sys.argv[2] == "1")
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
buf = ctypes.create_string_buffer(256)
seen["io_uring_setup"] = (libc.syscall(425, 8, buf), ctypes.get_errno())
for name, family, kind in (("AF_ALG", 38, 5), ("AF_VSOCK", 40, 1), ("AF_INET", 2, 1), ("AF_UNIX", 1, 1)):
    try:
        socket.socket(family, kind).close()
        seen[name] = "ok"
    except OSError as e:
        seen[name] = e.errno
ctypes.set_errno(0)
shm = libc.shmget(0, 4096, 0o1600)
seen["shmget"] = (shm >= 0, ctypes.get_errno())
if shm >= 0:
    libc.shmctl(shm, 0, None)
seen["pid"] = os.getpid() > 0
print(json.dumps(seen))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="seccomp is Linux only")
@pytest.mark.parametrize("block_ipc", [False, True])
def test_the_syscall_filter_denies_what_it_says_and_nothing_else(block_ipc):
    import json

    from stare_agents.sandbox import runner

    folder = os.path.dirname(runner.__file__)
    probe = subprocess.run(
        [sys.executable, "-I", "-c", FILTER_PROBE, folder, "1" if block_ipc else "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen["io_uring_setup"] == [-1, errno.EPERM]
    assert seen["AF_ALG"] == errno.EPERM and seen["AF_VSOCK"] == errno.EPERM
    assert seen["AF_INET"] == "ok" and seen["AF_UNIX"] == "ok" and seen["pid"]
    assert seen["shmget"] == ([False, errno.EPERM] if block_ipc else [True, 0])


# ----------------------------------------------------------------------------------- replies, channel


def _reply(payload: bytes) -> bytearray:
    return bytearray(len(payload).to_bytes(4, "big") + payload)


def test_worker_replies_are_checked_field_by_field():
    assert _worker_reply(_reply(b'{"status": "ok", "threads": 1, "call": 7}'), 7) == {
        "status": "ok",
        "threads": 1,
        "call": 7,
    }
    assert _worker_reply(_reply(b'{"status": "ok", "threads": 1, "call": 7}')[:10], 7) is None  # partial
    hostile = [
        b'{"status": "ok", "threads": 1, "call": 6}',  # a reply to another call
        b'{"status": "killed", "threads": 1, "call": 7}',  # not a worker status
        b'{"status": ["ok"], "threads": 1, "call": 7}',
        b'{"status": "ok", "threads": "1", "call": 7}',
        b'{"status": "ok", "threads": true, "call": 7}',
        b'{"status": "ok", "threads": 0, "call": 7}',
        b'{"status": "ok", "threads": 1, "call": 7.0}',
        b'{"status": "ok", "threads": 1, "call": 7, "extra": 1}',
        b'{"status": "ok", "threads": 1}',
        b"[1, 2]",
        b"not json",
        b"\xff\xfe",
    ]
    for payload in hostile:
        with pytest.raises(_Violation):
            _worker_reply(_reply(payload), 7)
    with pytest.raises(_Violation, match="2000 bytes"):
        _worker_reply(bytearray((2000).to_bytes(4, "big")), 7)  # too large: refused before it arrives
    with pytest.raises(_Violation, match="after the reply"):
        _worker_reply(_reply(b'{"status": "ok", "threads": 1, "call": 7}') + b"x", 7)


def test_channel_frames_cannot_be_forged_replayed_or_reversed():
    key = bytes(range(32))
    host, supervisor = ChannelKey(key), ChannelKey(key)
    first = host.seal(ChannelKey.HOST, encode_frame({"op": "ping"}))
    second = host.seal(ChannelKey.HOST, encode_frame({"op": "ping"}))
    assert first != second  # numbered: the same request twice signs differently
    assert supervisor.verify(ChannelKey.HOST, first[:-32], first[-32:])
    assert not supervisor.verify(ChannelKey.HOST, first[:-32], first[-32:])  # replayed
    forged = ChannelKey(bytes(32)).seal(ChannelKey.HOST, encode_frame({"op": "ping"}))
    assert not ChannelKey(key).verify(ChannelKey.HOST, forged[:-32], forged[-32:])  # another key
    reply = ChannelKey(key).seal(ChannelKey.SUPERVISOR, encode_frame({"status": "ok"}))
    assert not ChannelKey(key).verify(ChannelKey.HOST, reply[:-32], reply[-32:])  # the other direction
    flipped = bytearray(first)
    flipped[6] ^= 1
    assert not ChannelKey(key).verify(ChannelKey.HOST, bytes(flipped[:-32]), bytes(flipped[-32:]))


def test_timeouts_are_checked_on_both_sides():
    assert check_timeout(5) == 5.0 and check_timeout(0.25) == 0.25 and check_timeout(MAX_TIMEOUT_S) == 3600.0
    for bad in (math.inf, -math.inf, math.nan, 0, -1, MAX_TIMEOUT_S + 1, 1e300):
        with pytest.raises(ValueError, match="timeout_s must be a finite number of seconds in"):
            check_timeout(bad)
    for wrong in ("5", True, None, [5], 1j):
        with pytest.raises(TypeError, match="timeout_s must be a number of seconds"):
            check_timeout(wrong)
    # the runner never trusts the value either: anything odd becomes the one default, DEFAULT_TIMEOUT_S
    assert [bounded_timeout(v) for v in (2, 0.5, math.inf, math.nan, -1, "5", True, None)] == [
        2.0,
        0.5,
        *[DEFAULT_TIMEOUT_S] * 6,
    ]
    assert DEFAULT_TIMEOUT_S == 5.0 and runner_max_timeout == MAX_TIMEOUT_S  # one default, one cap


# ------------------------------------------------------------------------ sessions through LocalSandbox


@pytest.fixture(scope="module")
def one():
    """A pool of one interpreter (no pre-imports: fast), so every next session reuses it."""
    with LocalSandbox(
        pool_size=1, preimport=(), default_timeout_s=10, lease_timeout_s=20, allow_host_execution=True
    ) as box:
        yield box


def test_closing_mid_call_interrupts_it_and_keeps_results_apart(one):
    s = one.session()
    s.run("pass")
    results = {}
    caller = threading.Thread(
        target=lambda: results.setdefault(
            "a", s.run("import time\nprint('A', flush=True)\ntime.sleep(5)\nprint('A end')")
        )
    )
    caller.start()
    time.sleep(0.5)
    closed_at = time.monotonic()
    s.close()
    s.close()  # idempotent
    with one.session() as b:
        assert b.run("print('B')").stdout == "B\n"
    assert time.monotonic() - closed_at < 3
    caller.join(10)
    assert results["a"].status == "timeout" and results["a"].stdout == "A\n"
    assert "CancelledError: the caller cancelled the call" in results["a"].stderr
    with pytest.raises(SandboxError, match="closed"):
        s.run("print(1)")


def test_a_dropped_session_gives_its_interpreter_back(one):
    one.session().run("secret = 1")  # used, never closed
    gc.collect()
    started = time.monotonic()
    with one.session() as s:
        assert s.run("print('secret' in globals())").stdout == "False\n"
    assert time.monotonic() - started < 5


def test_lease_timeout_is_finite_and_its_error_says_what_to_do():
    assert LocalSandbox(allow_host_execution=True).lease_timeout_s == 300.0
    with (
        LocalSandbox(allow_host_execution=True, pool_size=1, preimport=(), lease_timeout_s=0.3) as box,
        box.session() as held,
    ):
        held.run("pass")
        started = time.monotonic()
        with pytest.raises(SandboxError, match=r"within 0.3 s \(pool_size=1, 1 leased.*lease_timeout_s=None"):
            box.session().run("pass")
        assert time.monotonic() - started < 3
    for bad in (0, -1, math.inf, math.nan, "5"):
        with pytest.raises(ValueError, match="lease_timeout_s"):
            LocalSandbox(allow_host_execution=True, lease_timeout_s=bad)


def test_odd_input_is_a_clear_error(one):
    with one.session() as s:
        for bad in (math.inf, math.nan, 0, -2, 1e300):
            with pytest.raises(ValueError, match="timeout_s"):
                s.run("print(1)", timeout_s=bad)
        with pytest.raises(TypeError, match="timeout_s"):
            s.run("print(1)", timeout_s="1")
        with pytest.raises(ValueError, match="bytes"):
            s.run("#" * (17 * 1024 * 1024))
        assert s.run("print(1)").stdout == "1\n"
    for kwargs in ({"default_timeout_s": math.inf}, {"pool_size": 0}, {"max_output_bytes": 10}):
        with pytest.raises(ValueError):
            LocalSandbox(allow_host_execution=True, **kwargs)


def test_a_forged_reply_on_either_channel_is_the_calls_error(one):
    forge_worker = (
        "import os\nfor fd in range(3, 256):\n    try:\n        os.write(fd, b'\\x00\\x00\\x00\\x02{}')\n"
        "    except OSError:\n        pass"
    )
    # locally the code cannot reach the supervisor's channel to the host either: it is confined by Landlock,
    # which keeps it from the /proc files of the (unconfined) supervisor
    forge_host = "import os\nwith open(f'/proc/{os.getppid()}/fd/1', 'wb') as f:\n    f.write(b'\\x00\\x00\\x00\\x02{}' * 4)"
    for code, says in ((forge_worker, "control channel"), (forge_host, "Permission denied")):
        with one.session() as s:
            r = s.run(code)
            assert r.status == "error" and says in r.stderr, r
            assert r.status in STATUSES
            assert s.run("print('next')").stdout == "next\n"
    with one.session() as s:
        assert s.run("print('clean')").stdout == "clean\n"


def test_replacing_a_runner_twice_replaces_it_once(one):
    pool = one._pool
    with one.session() as s:
        s.run("pass")
        runner = s.runner
        before = pool.replacements
        pool.replace(runner)
        pool.replace(runner)
        pool.release(runner)  # a retired runner is never lent again
        assert pool.replacements == before + 1
    deadline = time.monotonic() + 20
    while pool.live < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.live == 1 and runner not in pool._free
    with one.session() as s:
        assert s.runner is not runner and s.run("print(2)").stdout == "2\n"


def test_threads_share_one_sandbox():
    """How the rollout layer uses it: one sandbox per process, sessions from many threads at the same time
    (the agent loop's environment steps), more sessions than interpreters."""
    errors: list[str] = []
    with LocalSandbox(allow_host_execution=True, pool_size=2, preimport=()) as box:

        def thread_worker(i: int) -> None:
            for j in range(3):
                with box.session() as s:
                    s.run(f"v = {i * 10 + j}")
                    out = s.run("print(v)").stdout
                    if out != f"{i * 10 + j}\n":
                        errors.append(f"thread {i}/{j}: {out!r}")

        threads = [threading.Thread(target=thread_worker, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert box._pool.live == 2
    assert errors == []


def test_doctor_reads_limits_from_the_engine_where_gvisor_hides_them():
    from stare_agents.sandbox import DockerLimits
    from stare_agents.sandbox.docker_backend import GVISOR_EXTRA_PIDS
    from stare_agents.sandbox.doctor import check_limits

    limits = DockerLimits(memory_mb=256, pids=64, cpus=1.0)
    hidden = {  # what code sees inside gVisor: no cgroup files, no NoNewPrivs line
        "uid": 1000,
        "interfaces": ["lo"],
        "connects_out": False,
        "root_writable": False,
        "tmp_writable": True,
        "memory_limit": None,
        "pids_limit": None,
        "cpu_quota": None,
        "cap_eff": "0000000000000000",
        "no_new_privs": None,
        "host_env": [],
    }
    engine = {
        "memory": 256 * 2**20,
        "pids": 64 + GVISOR_EXTRA_PIDS,
        "nano_cpus": 10**9,
        "security_opt": ["no-new-privileges"],
    }
    assert [c.name for c in check_limits(hidden, limits, engine, gvisor=True) if not c.ok] == []
    wrong = {**engine, "pids": 64, "memory": 512 * 2**20, "security_opt": []}  # gVisor without its headroom
    failed = [c.name for c in check_limits(hidden, limits, wrong, gvisor=True) if not c.ok]
    assert failed == ["memory limit", "pids limit", "no-new-privileges"]
    assert [c.name for c in check_limits(hidden, limits) if not c.ok] == [
        "memory limit",
        "pids limit",
        "cpu quota",
        "no-new-privileges",
    ]  # nothing from the engine: an unknown limit is a failed check, never a passed one


def test_a_container_that_cannot_be_made_clean_is_replaced(tmp_path, monkeypatch):
    """The runner with no time for its wipe: any file left makes the reset fail its check, and the host
    replaces the runner before the next session runs rather than lend it out."""
    import stare_agents.sandbox.local as local
    from stare_agents.sandbox import runner

    source = Path(runner.__file__).read_text()
    assert source.count("RESET_BUDGET_S = 5.0") == 1
    patched = tmp_path / "runner.py"
    patched.write_text(source.replace("RESET_BUDGET_S = 5.0", "RESET_BUDGET_S = -1.0"))
    monkeypatch.setattr(local, "RUNNER_PATH", patched)
    with LocalSandbox(allow_host_execution=True, pool_size=1, preimport=()) as box:
        with box.session() as s:
            s.run("print('nothing left')")
            first = s.runner
        with box.session() as s:  # an empty folder needs no time: the same runner
            assert s.run("print(1)").stdout == "1\n" and s.runner is first
            s.run("open('left-behind', 'w').write('x')")
        with box.session() as s:
            r = s.run("import os\nprint(os.listdir('.'))")
            assert (r.status, r.stdout) == ("ok", "[]\n") and s.runner is not first
        assert box._pool.replacements == 1
