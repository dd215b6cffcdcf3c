"""What the local backend's code can reach and use (issue 51, items 3 and 4), each attack a hostile test that
succeeded before: the user's /tmp (a tmux socket, a file) with TMPDIR set away from it, a unix socket outside
every covered folder (a Docker socket no DOCKER_HOST names), 300 processes at once, memory past the limit in
several processes, `memory_mb: 0`, and settings without bounds (the grace after an interrupt, the output cap)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import require

from stare_agents.sandbox import DockerSandbox, LocalSandbox, check_config_kwargs
from stare_agents.sandbox.local import LOCAL_PIDS, UNLIMITED_MEMORY_ENV
from stare_agents.sandbox.runner import landlock_abi

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _landlock():
    require(landlock_abi() >= 1, "Landlock (Linux >= 5.13)", "the local sandbox refuses to start without it")


@contextlib.contextmanager
def listening(path: Path) -> Iterator[socket.socket]:
    """A unix socket listening at `path` that anyone may connect to (as tmux's or a Docker engine's)."""
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o666)
        listener.listen(4)
        yield listener
    finally:
        listener.close()
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def open_folder(parent: Path) -> Iterator[Path]:
    """A folder anyone may search, outside /tmp, the home folder and /run: no folder the runner covers."""
    folder = Path(tempfile.mkdtemp(prefix="stare-bounds-", dir=parent))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder)


CONNECT = """
import os, socket
def connect(path):
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect(path)
        return "connected"
    except OSError as error:
        return type(error).__name__
"""


def test_tmp_and_its_sockets_are_out_of_sight_with_tmpdir_elsewhere(monkeypatch):
    marker = f"stare-bounds-{uuid.uuid4().hex[:8]}"
    with open_folder(REPO) as tmpdir, listening(Path("/tmp") / f"{marker}.sock"):
        (Path("/tmp") / f"{marker}.txt").write_text("the user's file")
        try:
            monkeypatch.setattr(
                tempfile, "tempdir", str(tmpdir)
            )  # the scratch folders live there, not in /tmp
            with LocalSandbox(1, allow_host_execution=True, preimport=()) as box:
                probe = f"print(connect('/tmp/{marker}.sock'), [n for n in os.listdir('/tmp') if '{marker}' in n])"
                r = box.run(CONNECT + probe)
        finally:
            (Path("/tmp") / f"{marker}.txt").unlink()
    assert r.status == "ok", r
    assert r.stdout.startswith(("FileNotFoundError", "ConnectionRefusedError")) and r.stdout.endswith(
        " []\n"
    ), r


def test_a_socket_outside_every_covered_folder_is_covered_too():
    """A Docker socket at a path no DOCKER_HOST names (the start-up check cannot know it): /proc/net/unix can."""
    with (
        open_folder(REPO) as folder,
        listening(folder / "docker.sock"),
        LocalSandbox(1, allow_host_execution=True, preimport=()) as box,
    ):
        r = box.run(CONNECT + f"print(connect({str(folder / 'docker.sock')!r}))")
    assert (r.status, r.stdout) in (("ok", "ConnectionRefusedError\n"), ("ok", "FileNotFoundError\n")), r


PROCESSES = """
import subprocess
started = []
try:
    for _ in range(300):
        started.append(subprocess.Popen(["sleep", "30"]))
except OSError as error:
    pass
print(len(started))
for process in started:
    process.kill()
    process.wait()
"""


def test_processes_are_bounded_as_in_a_container():
    with LocalSandbox(1, allow_host_execution=True, preimport=()) as box:
        r = box.run(PROCESSES, timeout_s=30)
    assert r.status == "ok", r
    assert 100 < int(r.stdout) < LOCAL_PIDS, r  # 300 before; the runner's own processes count too


MEMORY = """
import subprocess, sys
children = [
    subprocess.Popen([sys.executable, "-c", "b = bytearray(250 * 2**20); import time; time.sleep(0.5)"])
    for _ in range(3)
]
print(sorted(child.wait() for child in children))
"""


def test_memory_is_bounded_in_all_not_only_per_process():
    if os.geteuid() != 0:
        pytest.skip(
            "a cgroup of its own needs root; as another user the total is bounded by pids x memory_mb"
        )
    with LocalSandbox(1, allow_host_execution=True, preimport=(), memory_mb=512) as box:
        r = box.run(MEMORY, timeout_s=30)
    # 3 x 250 MB in 512 MB: the kernel ends one (or the interpreter that started them)
    assert r.status == "killed" or (r.status == "ok" and "-9" in r.stdout), r


def test_no_memory_limit_needs_the_environments_acknowledgement(monkeypatch):
    monkeypatch.delenv(UNLIMITED_MEMORY_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"memory_mb=0 would run .* {UNLIMITED_MEMORY_ENV}=1"):
        LocalSandbox(allow_host_execution=True, memory_mb=0)
    with pytest.raises(ValueError, match=r"rollout.sandbox_kwargs.memory_mb=0 would run"):
        check_config_kwargs("local", {"memory_mb": 0}, "rollout.sandbox_kwargs")
    with pytest.raises(ValueError, match="allow_unlimited_memory=True is not allowed"):
        check_config_kwargs("local", {"allow_unlimited_memory": True})
    for bad in (-1, 16, 10**7, 1.5, True):
        with pytest.raises(ValueError, match=r"memory_mb must be an int in \[32, 262144\]"):
            LocalSandbox(allow_host_execution=True, memory_mb=bad)
    assert LocalSandbox(allow_host_execution=True, memory_mb=0, allow_unlimited_memory=True).memory_mb == 0
    monkeypatch.setenv(UNLIMITED_MEMORY_ENV, "1")
    check_config_kwargs("local", {"memory_mb": 0})
    assert LocalSandbox(allow_host_execution=True, memory_mb=0).memory_mb == 0


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("grace_s", 45, r"\[0.1, 10\]"),  # a 2 s call ran on for 45 s
        ("grace_s", 0, r"\[0.1, 10\]"),
        ("host_slack_s", 10_000, r"\[1, 60\]"),
        ("max_output_bytes", 100 * 2**20, r"\[64, 1048576\]"),  # a call returned 100 MB to the host
        ("max_output_bytes", 10, r"\[64, 1048576\]"),
        ("default_timeout_s", 10_000, r"\(0, 3600\]"),
    ],
)
def test_sizes_and_times_without_bounds_are_refused_at_load(key, value, allowed):
    backend = "local" if key in LocalSandbox.config_kwargs else "docker"
    with pytest.raises(ValueError, match=rf"rollout.sandbox_kwargs.{key} must be .*{allowed}, got {value}"):
        check_config_kwargs(backend, {key: value}, "rollout.sandbox_kwargs")
    with pytest.raises(ValueError, match=rf"{key} must be .*{allowed}"):
        DockerSandbox(**{key: value})
