"""LocalSandbox: the same interpreter and API without Docker, for development. NOT a security boundary.

It runs only when asked for by name and acknowledged (`allow_host_execution=True` or STARE_ALLOW_LOCAL_SANDBOX=1),
never as root (as root, its interpreters run as `nobody`), with a scrubbed environment, in namespaces of its own
(no network, only its own processes, every mount read-only but its scratch folder, /run and the home folder
covered; see runner.isolate), and may write only in its scratch folder (Landlock). Where the kernel has no
Landlock or cannot make the namespaces, or where its code could still reach a Docker socket, it refuses to start.
NoSandbox is the "none" backend: nothing runs, every tool call is a tool error.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from typing import Any

from stare_agents.sandbox.backend import RUNNER_PATH, SandboxBackend
from stare_agents.sandbox.channel import (
    DEFAULT_GRACE_S,
    DEFAULT_LEASE_TIMEOUT_S,
    MEMORY_RANGE_MB,
    PREIMPORT,
    START_WAIT_S,
    Channel,
    Runner,
    check_range,
)
from stare_agents.sandbox.errors import ChannelTimeout, SandboxError
from stare_agents.sandbox.pool import PooledSandbox
from stare_agents.sandbox.runner import ALWAYS_HIDDEN, DEFAULT_TIMEOUT_S, SHARED_SCRATCH, landlock_abi

logger = logging.getLogger("stare_agents.sandbox")

ALLOW_LOCAL_ENV = "STARE_ALLOW_LOCAL_SANDBOX"
UNPRIVILEGED_USER = "nobody"
_warned = False


def local_execution_acknowledged(allow_host_execution: bool) -> bool:
    """True when the caller passed allow_host_execution=True or STARE_ALLOW_LOCAL_SANDBOX is 1/true/yes."""
    return allow_host_execution or os.environ.get(ALLOW_LOCAL_ENV, "").strip().lower() in ("1", "true", "yes")


@functools.lru_cache(maxsize=1)
def unprivileged_ids() -> tuple[int, int]:
    """(uid, gid) the local interpreters run as when this process is root: `nobody`'s."""
    import pwd

    try:
        entry = pwd.getpwnam(UNPRIVILEGED_USER)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


class NoSandbox(SandboxBackend):
    """The "none" backend: no code runs. A PythonTool given this sandbox answers every call with a tool
    error that says tool execution is off; it has the lifecycle of a sandbox so that callers need no case."""

    runner_kind = "nothing"
    pool_size = 0
    runs_code = False
    config_kwargs: frozenset[str] = frozenset()  # nothing for a config to set
    message = (
        "Error: tool execution is disabled in this run (sandbox: none); no code was run. "
        "Answer without calling tools."
    )

    @classmethod
    def create(cls, pool_size: int = 0, **kwargs: Any) -> NoSandbox:
        return cls()  # nothing to size or configure

    def start(self) -> NoSandbox:
        return self

    def close(self) -> None:
        pass

    def __enter__(self) -> NoSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def session(self, **kwargs: object):
        raise SandboxError("sandbox 'none': tool execution is disabled in this run; no session can be opened")

    def __repr__(self) -> str:
        return "NoSandbox()"


class PipeChannel(Channel):
    """Talks to a runner process over its stdin/stdout pipes."""

    def __init__(self, process: subprocess.Popen) -> None:
        super().__init__()
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self._in = process.stdin.fileno()
        self._out = process.stdout.fileno()
        os.set_blocking(self._in, False)  # a stopped runner must not block a send past its deadline

    def send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout("the local runner did not take the request in time")
            _, writable, _ = select.select([], [self._in], [], remaining)
            if writable:
                with contextlib.suppress(BlockingIOError):
                    view = view[os.write(self._in, view[: 1 << 16]) :]

    def _recv_some(self, deadline: float | None) -> bytes:
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ChannelTimeout("the local runner did not answer in time")
            ready, _, _ = select.select([self._out], [], [], remaining)
            if ready:
                return os.read(self._out, 1 << 16)

    def peer_gone(self) -> bool:
        return self.process.poll() is not None

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


def _home() -> str:
    """This user's home folder, covered in the runner's mount namespace ("" where there is none)."""
    home = os.path.expanduser("~")
    return home if home.startswith("/") and home != "/" and os.path.isdir(home) else ""


def docker_socket_paths() -> list[str]:
    """Where a Docker engine's socket may be: the usual places, rootless Docker's and Docker Desktop's, and the
    one DOCKER_HOST names."""
    paths = [*DOCKER_SOCKETS, f"/run/user/{os.getuid()}/docker.sock"]
    home = _home()
    if home:
        paths += [
            os.path.join(home, ".docker", "run", "docker.sock"),
            os.path.join(home, ".docker", "desktop", "docker.sock"),
        ]
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        paths.append(host.removeprefix("unix://"))
    return list(dict.fromkeys(paths))


def _can_connect(path: str, uid: int | None) -> bool:
    """Whether a process of `uid` (None: this process, with its groups) may connect to the socket `path`."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(info.st_mode):
        return False
    if uid is None:
        return os.access(path, os.W_OK)
    return bool(info.st_mode & (0o200 if info.st_uid == uid else 0o002))  # `nobody`, with no groups


def docker_sockets_in_reach(hidden: list[str]) -> tuple[list[str], list[str]]:
    """The Docker sockets the local sandbox's code user could open: (those inside a folder in `hidden`, which
    the runner's mount namespace covers, those elsewhere, which would give the code the Docker engine)."""
    uid = unprivileged_ids()[0] if os.geteuid() == 0 else None
    covered, exposed = [], []
    for path in docker_socket_paths():
        if _can_connect(path, uid):
            real = os.path.realpath(path)
            inside = any(real == f or real.startswith(f + "/") for f in map(os.path.realpath, hidden))
            (covered if inside else exposed).append(path)
    return covered, exposed


LOCAL_PIDS = 128  # processes and threads of one runner's code, as in a Docker container (DockerLimits.pids)
CGROUP_ROOT = "/sys/fs/cgroup"
UNLIMITED_MEMORY_ENV = "STARE_SANDBOX_UNLIMITED_MEMORY"


def unlimited_memory_acknowledged(allow_unlimited_memory: bool) -> bool:
    """True when the caller passed allow_unlimited_memory=True or STARE_SANDBOX_UNLIMITED_MEMORY is 1/true/yes."""
    value = os.environ.get(UNLIMITED_MEMORY_ENV, "").strip().lower()
    return allow_unlimited_memory or value in ("1", "true", "yes")


def check_memory_mb(value: object, name: str = "memory_mb", acknowledged: bool = False) -> None:
    """Refuse a local runner's memory limit outside MEMORY_RANGE_MB; 0 (no limit) only when acknowledged."""
    if value == 0 and not isinstance(value, bool) and acknowledged:
        return
    if value == 0 and not isinstance(value, bool):
        raise ValueError(
            f"{name}=0 would run model-written code with no memory limit; that needs the same acknowledgement "
            f"as host execution: {UNLIMITED_MEMORY_ENV}=1 in the environment of whoever starts the run (a config "
            f"file cannot), or a limit in [{MEMORY_RANGE_MB[0]}, {MEMORY_RANGE_MB[1]}] MB"
        )
    check_range(name, value, MEMORY_RANGE_MB, integer=True)


class RunnerCgroup:
    """The cgroup of one local runner (as root): at most `pids` processes and threads and `memory_bytes` of
    memory in all (0: no memory limit), as a Docker container's. cgroup v1: one folder per controller below this
    process's own cgroup (so whatever limits the trainer limits the code too); v2: under /sys/fs/cgroup/
    stare-local. The runner joins `folders` before anything else; `remove()` kills what is left and removes them."""

    def __init__(self, name: str, pids: int, memory_bytes: int, root: str = CGROUP_ROOT) -> None:
        self.folders: list[str] = []
        try:
            if os.path.exists(os.path.join(root, "cgroup.controllers")):
                self._make_v2(root, name, pids, memory_bytes)
            else:
                self._make_v1(root, name, pids, memory_bytes)
        except OSError:
            self.remove()
            raise

    def _make_v1(self, root: str, name: str, pids: int, memory_bytes: int) -> None:
        with open("/proc/self/cgroup") as f:
            own = {
                c: path
                for _, controllers, path in (line.rstrip("\n").split(":", 2) for line in f)
                for c in controllers.split(",")
            }
        for controller in ("pids", "memory"):
            if not os.path.isdir(os.path.join(root, controller)):
                raise OSError(f"no cgroup v1 {controller} hierarchy under {root}")
        pids_folder = os.path.join(root, "pids", own.get("pids", "/").strip("/"), f"stare-local-{name}")
        memory_folder = os.path.join(root, "memory", own.get("memory", "/").strip("/"), f"stare-local-{name}")
        for folder in (pids_folder, memory_folder):
            os.mkdir(folder)
            self.folders.append(folder)
        _write(pids_folder, "pids.max", str(pids))
        if memory_bytes:
            _write(memory_folder, "memory.limit_in_bytes", str(memory_bytes))
            if os.path.exists(os.path.join(memory_folder, "memory.memsw.limit_in_bytes")):
                _write(memory_folder, "memory.memsw.limit_in_bytes", str(memory_bytes))  # and no swap on top

    def _make_v2(self, root: str, name: str, pids: int, memory_bytes: int) -> None:
        parent = os.path.join(root, "stare-local")
        os.makedirs(parent, exist_ok=True)
        for folder in (root, parent):
            _write(folder, "cgroup.subtree_control", "+pids +memory")
        folder = os.path.join(parent, name)
        os.mkdir(folder)
        self.folders.append(folder)
        _write(folder, "pids.max", str(pids))
        if memory_bytes:
            _write(folder, "memory.max", str(memory_bytes))
            if os.path.exists(os.path.join(folder, "memory.swap.max")):
                _write(folder, "memory.swap.max", "0")

    def remove(self) -> None:
        """Kill every process left in the cgroup and remove its folders (best effort, within a few seconds)."""
        import signal

        for folder in reversed(self.folders):
            until = time.monotonic() + 5
            while os.path.isdir(folder):
                with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
                try:
                    os.rmdir(folder)
                except OSError as exc:
                    if time.monotonic() > until:
                        logger.warning("could not remove the local sandbox's cgroup %s: %s", folder, exc)
                        break
                    time.sleep(0.02)
        self.folders = []


def _write(folder: str, name: str, value: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(value)


class LocalSandbox(PooledSandbox):
    """Runs code in local subprocesses with rlimits, in namespaces of their own.

    Same API and result type as DockerSandbox, and the same promises for what the code can reach: no network
    (a network namespace with loopback only), none of the host's processes (a PID namespace per runner: it
    cannot see or signal the trainer, its environment processes or another session), no file outside its
    scratch folder changed in any way (every mount read-only, Landlock for content), no Docker or other
    daemon socket (/run covered, /dev/null over every other unix socket bound on this host when it starts), no
    /tmp, /var/tmp or /dev/shm, no other session's scratch folder and not the user's home (covered). The code
    gets a scrubbed environment; as root it runs as `nobody`, otherwise as this user, mapped to itself. It
    bounds CPU and wall-clock time, output, processes (LOCAL_PIDS, 128, as a container: a cgroup as root,
    RLIMIT_NPROC in its user namespace otherwise) and memory (`memory_mb` per process, RLIMIT_AS, and as root in
    all, by the cgroup; 0, no limit, only with STARE_SANDBOX_UNLIMITED_MEMORY=1 or allow_unlimited_memory). It can still read whatever that user can elsewhere: never
    point it at untrusted code on a machine you care about. It says so once, loudly.

    It refuses to be created unless acknowledged: `allow_host_execution=True` from Python, or
    STARE_ALLOW_LOCAL_SANDBOX=1 in the environment (how the CLI, training runs and Ray workers ask for it; a
    config file cannot). It refuses to start where Landlock or the namespaces are missing, or where a Docker
    socket its code could open lies outside the folders it covers.
    """

    runner_kind = "local interpreter"
    # what a run's config may set (rollout.sandbox_kwargs): sizes and timeouts. Never the acknowledgement or
    # the executable the host starts (`python`)
    config_kwargs: frozenset[str] = frozenset(
        {"default_timeout_s", "max_output_bytes", "lease_timeout_s", "grace_s", "memory_mb"}
    )
    pids = LOCAL_PIDS

    def __init__(
        self,
        pool_size: int = 2,
        *,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        max_output_bytes: int = 32 * 1024,
        memory_mb: int = 4096,
        python: str = sys.executable,
        lease_timeout_s: float | None = DEFAULT_LEASE_TIMEOUT_S,
        grace_s: float = DEFAULT_GRACE_S,
        preimport: tuple[str, ...] = PREIMPORT,
        allow_host_execution: bool = False,
        allow_unlimited_memory: bool = False,
    ) -> None:
        if not local_execution_acknowledged(allow_host_execution):
            raise SandboxError(
                "the local sandbox runs model-written code on this host and is no security boundary; it is "
                f"used only when acknowledged: set {ALLOW_LOCAL_ENV}=1 (or pass allow_host_execution=True), "
                "or use the Docker sandbox (`bash scripts/provision_docker.sh` as root, then sandbox 'docker')"
            )
        super().__init__(
            pool_size=pool_size,
            default_timeout_s=default_timeout_s,
            max_output_bytes=max_output_bytes,
            lease_timeout_s=lease_timeout_s,
            grace_s=grace_s,
        )
        check_memory_mb(memory_mb, acknowledged=unlimited_memory_acknowledged(allow_unlimited_memory))
        self.memory_mb = memory_mb
        self.python = python
        self.preimport = tuple(preimport)
        self.hidden = [folder for folder in (_home(),) if folder]  # covered in the runner's mount namespace
        self._covered_sockets: list[str] = []  # Docker sockets this user may open, out of the code's sight

    @classmethod
    def check(cls, **kwargs: Any) -> None:
        """Start one interpreter and run one call in it: whatever keeps this backend from running here (the
        acknowledgement, Landlock, its namespaces, a Docker socket in the code's reach) shows, with the
        remedy."""
        acknowledged = bool(kwargs.get("allow_host_execution", False))
        with cls(1, allow_host_execution=acknowledged, preimport=()) as sandbox:
            result = sandbox.run("print(6 * 7)", timeout_s=30)
        if result.stdout != "42\n":
            raise SandboxError(
                f"the local sandbox started but cannot run code here: {result.output()[-500:]}"
            )

    @classmethod
    def check_settings(cls, kwargs: dict[str, Any], where: str) -> None:
        super().check_settings(kwargs, where)
        if "memory_mb" in kwargs:  # 0 only with the environment's acknowledgement, never the config's
            check_memory_mb(kwargs["memory_mb"], f"{where}.memory_mb", unlimited_memory_acknowledged(False))

    def _before_start(self) -> None:
        if landlock_abi() < 1:
            raise SandboxError(
                "the local sandbox needs Landlock (Linux >= 5.13) to keep model-written code from writing "
                "outside its scratch folder, and this kernel has none: use the Docker sandbox"
            )
        covered, exposed = docker_sockets_in_reach(
            [*ALWAYS_HIDDEN, *SHARED_SCRATCH, *self.hidden, tempfile.gettempdir()]
        )
        if exposed:
            raise SandboxError(
                f"the local sandbox's code could open the Docker socket {exposed[0]} (this user may connect to "
                "it, and it lies outside the folders the sandbox covers), and with it start a container that "
                "mounts anything on this host: use the Docker sandbox, or run as a user who cannot open it"
            )
        self._covered_sockets = covered

    def _log_once(self, info: dict) -> None:
        global _warned
        if _warned:
            return
        _warned = True
        isolation = info["isolation"]
        scopes = " and ".join(isolation["landlock_scopes"]) or "none (this kernel has no Landlock scopes)"
        sockets = (
            f"; the Docker socket {', '.join(self._covered_sockets)} is reachable by this user but not by the "
            "code (/run and /var/run are empty in its mount namespace)"
            if self._covered_sockets
            else ""
        )
        logger.warning(
            "LocalSandbox is NOT a security boundary: model-written code runs on this host as uid %s, in "
            "namespaces of its own (%s: no network, only its own processes), with every mount read-only but "
            "its scratch folder, %s covered and /dev/null over %d other unix socket(s), writes confined by "
            "Landlock (scopes: %s), %s, CPU and wall-clock limits%s. It can still read what that user can "
            "elsewhere. Use DockerSandbox (`stare-agents sandbox doctor`) for untrusted code.",
            info.get("uid"),
            ", ".join(isolation["namespaces"]),
            ", ".join(isolation["covered"]),
            isolation.get("sockets_covered", 0),
            scopes,
            self.memory_words(),
            sockets,
        )

    def memory_words(self) -> str:
        """The runner's process and memory bounds, in words."""
        per_process = (
            f"{self.memory_mb} MB of address space per process" if self.memory_mb else "no memory limit"
        )
        if os.geteuid() == 0:  # a cgroup of its own
            total = f", {self.memory_mb} MB in all" if self.memory_mb else ""
            return f"{self.pids} processes and threads{total} (cgroup), {per_process}"
        return (
            f"{self.pids} processes of its user in its user namespace (RLIMIT_NPROC), {per_process} (no cgroup as "
            "a non-root user: total memory is bounded only by that product)"
        )

    def _start_runner(self) -> Runner:
        workdir = tempfile.mkdtemp(prefix="stare-sandbox-")
        drop: list[str] = []
        if os.geteuid() == 0:  # never as root: the scratch folder is nobody's, and the runner becomes nobody
            uid, gid = unprivileged_ids()
            os.chown(workdir, uid, gid)
            drop = ["--drop-to", f"{uid}:{gid}"]
        command = [
            self.python,
            "-I",
            str(RUNNER_PATH),
            "--mode",
            "local",
            "--workdir",
            workdir,
            "--python",
            self.python,
            "--max-output",
            str(self.max_output_bytes),
            "--grace",
            str(self.grace_s),
            "--memory-bytes",
            str(self.memory_mb * 1024 * 1024),
            "--memory-hint",
            f"{self.memory_mb} MB" if os.geteuid() == 0 else f"{self.memory_mb} MB of address space",
            "--pids",
            str(self.pids),
            "--preimport",
            ",".join(self.preimport),
            "--remove-workdir",
            *drop,
            *(f"--hide={folder}" for folder in self.hidden),
        ]
        cgroup = None
        if os.geteuid() == 0:  # bounded as a container is: processes and memory in all (the runner's +1: the
            try:  # process outside its namespaces that waits for it)
                cgroup = RunnerCgroup(os.path.basename(workdir), self.pids + 1, self.memory_mb * 1024 * 1024)
            except OSError as exc:
                shutil.rmtree(workdir, ignore_errors=True)
                raise SandboxError(
                    f"the local sandbox cannot make the cgroup that bounds its code to {self.pids} processes and "
                    f"{self.memory_mb} MB ({exc}): run it as a non-root user (RLIMIT_NPROC in its own user "
                    "namespace) or use the Docker sandbox"
                ) from exc
            command += [f"--cgroup={folder}" for folder in cgroup.folders]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        process = subprocess.Popen(  # a scrubbed environment: no tokens, keys or paths of the host's
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )

        def cleanup() -> None:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=5)
            if cgroup is not None:
                cgroup.remove()
            shutil.rmtree(workdir, ignore_errors=True)

        runner = Runner(PipeChannel(process), f"local-{process.pid}", on_close=cleanup)
        try:  # answer the first frame before counting as warm
            info = runner.start(time.monotonic() + START_WAIT_S)
            if info.get("status") != "ok":
                raise SandboxError(f"the local sandbox cannot start here: {str(info.get('error'))[:2000]}")
            if not isinstance(info.get("isolation"), dict):
                raise SandboxError("the local runner did not report its namespaces; it is not used")
        except Exception:
            runner.close()
            raise
        self._log_once(info)
        return runner
