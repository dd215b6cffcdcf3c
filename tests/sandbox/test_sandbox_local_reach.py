"""What the local backend's code can reach (issue 32, item 3): the Docker backend's promises, kept without Docker.

Hostile code in one session tries to open the Docker socket, chmod and utime a project file, signal the
trainer and kill another session's interpreter, read that session's scratch file and find the trainer in
/proc. All of it fails, as root (the code runs as `nobody`) and as a non-root user in the `docker` group (the
code runs as that user, mapped to itself in a user namespace of its own). The backend refuses to start where
it cannot make its namespaces or where its code could open a Docker socket it does not cover, and Landlock's
signal and abstract-socket scopes hold where the kernel has them.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import require

import stare_agents.sandbox.local as local_module
from stare_agents.sandbox import LocalSandbox, SandboxError, check_backend
from stare_agents.sandbox.runner import LANDLOCK_SCOPES_SINCE, landlock_abi

REPO = Path(__file__).resolve().parents[2]
TRAINER = Path(__file__).with_name("local_reach_trainer.py")


@pytest.fixture(autouse=True)
def _landlock():
    require(landlock_abi() >= 1, "Landlock (Linux >= 5.13)", "the local sandbox refuses to start without it")


def project_copy(tmp_path: Path) -> Path:
    """A project folder of the trainer's own, with the grader a restarted worker would re-read."""
    project = tmp_path / "project"
    (project / "envs").mkdir(parents=True)
    shutil.copy(REPO / "envs" / "_grader_worker.py", project / "envs" / "_grader_worker.py")
    return project


def trainer_report(command: list[str], env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    return json.loads(lines[-1].removeprefix("REPORT "))


def assert_out_of_reach(report: dict, code_uid: int) -> None:
    code = report["code"]
    assert isinstance(code, dict), code  # the attack ran to its end
    assert code["uid"] == code_uid and code_uid != 0
    assert [key for key, value in code.items() if key.startswith("docker ") and value == "reached"] == []
    assert "done" not in (code["chmod"], code["utime"], code["write"]), code
    assert code["signal trainer"] != "done" and code["kill other session"] != "done", code
    assert code["read other scratch"] != "b-secret" and code["read home"] != "home-secret", code
    assert code["trainer in /proc"] == [], code
    assert report["other session"] == "41" and report["other interpreter alive"], report
    assert report["file unchanged"], report


@contextlib.contextmanager
def outside_tmp(uid: int) -> Iterator[tuple[Path, Path]]:
    """(a project folder, a home folder) of `uid`, beside this project (the runner covers /tmp and /var/tmp
    anyway): what keeps the code from them is then the read-only mounts and the covering of $HOME."""
    base = Path(tempfile.mkdtemp(prefix="stare-reach-", dir=REPO))
    try:
        base.chmod(0o755)
        project = project_copy(base)
        home = base / "home"
        home.mkdir()
        for path in [base, *base.rglob("*")]:
            os.chown(path, uid, uid)
        yield project, home
    finally:
        shutil.rmtree(base)


def test_hostile_code_reaches_nothing_of_the_host_as_this_user():
    marker = f"stare-reach-{uuid.uuid4().hex}"
    with outside_tmp(os.getuid()) as (project, home):
        options = {"project": str(project), "marker": marker}
        command = [sys.executable, str(TRAINER), json.dumps(options)]
        report = trainer_report(command, {**os.environ, "HOME": str(home)})
    expected = local_module.unprivileged_ids()[0] if os.geteuid() == 0 else os.getuid()
    assert_out_of_reach(report, expected)


# Run as root: a mount namespace where the interpreter is reachable by another user (a pyenv under /root is
# covered by a tmpfs with the interpreter bound back), then that user, in the docker group, runs the trainer.
AS_USER = r"""
import json, os, subprocess, sys
from pathlib import Path

options = json.loads(sys.argv[1])
needed = sorted({os.path.realpath(path) for path in options["needed"]}, key=len)
for path in needed:  # the outermost folder others cannot search on the way: covered, `path` bound back
    ways = [str(parent) for parent in reversed(Path(path).parents)]
    folder = next((way for way in ways if not os.stat(way).st_mode & 0o001), None)
    if folder is None:
        continue
    fd = os.open(path, os.O_PATH)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", folder], check=True)
    os.makedirs(path, mode=0o755)
    subprocess.run(["mount", "--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", path], check=True, pass_fds=[fd])
    os.close(fd)
os.setgroups(options["groups"])
os.setgid(options["uid"])
os.setuid(options["uid"])
os.execv(sys.executable, [sys.executable, *options["argv"]])
"""


def unused_uid() -> int:
    uid = 4242
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def docker_gid() -> int | None:
    try:
        return grp.getgrnam("docker").gr_gid
    except KeyError:
        sockets = [path for path in local_module.DOCKER_SOCKETS if os.path.exists(path)]
        return os.stat(sockets[0]).st_gid if sockets else None


def test_hostile_code_reaches_nothing_of_the_host_as_a_user_in_the_docker_group():
    """The user may open the Docker socket; its code, running as that user (not as root in its namespace:
    the runner's own root check passes), can open nothing of it."""
    if os.geteuid() != 0:
        pytest.skip(
            "starts the trainer as another user, which needs root (as non-root, the test above is this)"
        )
    require(shutil.which("unshare") is not None, "unshare (util-linux)")
    uid = unused_uid()
    gid = docker_gid()
    marker = f"stare-reach-{uuid.uuid4().hex}"
    command = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", AS_USER]
    with outside_tmp(uid) as (project, home):
        options = {
            "needed": [sys.base_prefix, sys.prefix, str(REPO)],
            "uid": uid,
            "groups": [uid, *([gid] if gid is not None else [])],
            "argv": [str(TRAINER), json.dumps({"project": str(project), "marker": marker})],
        }
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
        report = trainer_report([*command, json.dumps(options)], env)
    assert report["trainer uid"] == uid
    assert_out_of_reach(report, uid)
    assert (report["code"]["chmod"], report["code"]["utime"]) == ("EROFS", "EROFS")  # its own file, read-only


def test_a_docker_socket_outside_the_covered_folders_refuses_the_start(monkeypatch):
    """A socket the code's user could open (DOCKER_HOST names it) where the runner covers nothing: no start."""
    place = REPO / f"stare-test-{uuid.uuid4().hex[:8]}"  # not /tmp or /var/tmp: the runner covers those
    place.mkdir(mode=0o755)
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(place / "docker.sock"))
        os.chmod(place / "docker.sock", 0o666)
        monkeypatch.setenv("DOCKER_HOST", f"unix://{place / 'docker.sock'}")
        with pytest.raises(SandboxError, match=r"could open the Docker socket .*docker\.sock"):
            LocalSandbox(1, allow_host_execution=True, preimport=()).start()
        os.chmod(place / "docker.sock", 0o600)  # only the owner: root's code runs as nobody
        if os.geteuid() == 0:
            with LocalSandbox(1, allow_host_execution=True, preimport=()) as box:
                assert box.run("print(1)").stdout == "1\n"
    finally:
        listener.close()
        shutil.rmtree(place)


def test_without_its_namespaces_the_local_backend_refuses_before_any_code_runs(tmp_path, monkeypatch):
    """A kernel that refuses the namespaces (here: a runner asking for one it cannot have) means no sandbox,
    and check_backend, which starts one interpreter, says so before a training run loads anything."""
    from stare_agents.sandbox import runner

    source = Path(runner.__file__).read_text()
    assert source.count("CLONE_NEWNET = 0x40000000\n") == 1
    patched = tmp_path / "runner.py"
    patched.write_text(source.replace("CLONE_NEWNET = 0x40000000\n", "CLONE_NEWNET = 0x40000000 | 0x1\n"))
    monkeypatch.setattr(local_module, "RUNNER_PATH", patched)
    with pytest.raises(SandboxError, match=r"cannot make the namespaces .* network"):
        check_backend("local", allow_host_execution=True)
    with pytest.raises(SandboxError, match="it does not run"):
        LocalSandbox(1, allow_host_execution=True, preimport=()).start()


CONFINED_CHILD = r"""
import os, signal, socket, sys, tempfile
from stare_agents.sandbox.runner import confine_writes

name = b"\0stare-scope-test-" + os.urandom(6).hex().encode()
listener = socket.socket(socket.AF_UNIX)
listener.bind(name)
listener.listen(8)
parent = os.getpid()


def probe() -> list[str]:
    found = []
    try:
        os.kill(parent, 0)
        found.append("signal")
    except OSError:
        pass
    client = socket.socket(socket.AF_UNIX)
    try:
        client.connect(name)
        found.append("socket")
    except OSError:
        pass
    return found


for confined in (True, False):
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        if confined:
            confine_writes(tempfile.mkdtemp())
        os.write(write, ",".join(probe()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    print("confined" if confined else "free", os.read(read, 100).decode())
"""


def test_confined_code_signals_and_reaches_abstract_sockets_of_its_own_domain_only():
    require(
        landlock_abi() >= LANDLOCK_SCOPES_SINCE,
        f"Landlock ABI {LANDLOCK_SCOPES_SINCE} (Linux >= 6.12)",
        "older kernels have no scopes; the PID and network namespaces still keep the code apart",
        ci_required=False,
    )
    done = subprocess.run([sys.executable, "-c", CONFINED_CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["confined ", "free signal,socket"], done.stdout
