"""LocalSandbox: the same interpreter and API without Docker, for development. NOT a security boundary.

It runs only when asked for by name and acknowledged (`allow_host_execution=True` or STARE_ALLOW_LOCAL_SANDBOX=1),
never as root (as root, its interpreters run as `nobody`), with a scrubbed environment, in a scratch folder of
its own, and may write only there (Landlock; where the kernel has none, it refuses to start).
NoSandbox is the "none" backend: nothing runs, every tool call is a tool error.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stare_agents.sandbox.pool import (
    DEFAULT_LEASE_TIMEOUT_S,
    PREIMPORT,
    START_WAIT_S,
    Channel,
    ChannelTimeout,
    PooledSandbox,
    Runner,
    SandboxError,
)
from stare_agents.sandbox.runner import DEFAULT_TIMEOUT_S, landlock_abi

logger = logging.getLogger("stare_agents.sandbox")

RUNNER_PATH = Path(__file__).with_name("runner.py")
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


class NoSandbox:
    """The "none" backend: no code runs. A PythonTool given this sandbox answers every call with a tool
    error that says tool execution is off; it has the lifecycle of a sandbox so that callers need no case."""

    runner_kind = "nothing"
    pool_size = 0
    config_kwargs: frozenset[str] = frozenset()  # nothing for a config to set
    message = (
        "Error: tool execution is disabled in this run (sandbox: none); no code was run. "
        "Answer without calling tools."
    )

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


@functools.lru_cache(maxsize=1)
def network_isolation_prefix() -> tuple[str, ...] | None:
    """The `unshare` command that gives a process an empty network namespace here, or None if none works."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return None
    candidates = [(unshare, "--net")] if os.geteuid() == 0 else []  # as root, the runner then drops to nobody
    candidates.append((unshare, "--user", "--map-root-user", "--net"))
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


class LocalSandbox(PooledSandbox):
    """Runs code in local subprocesses with rlimits and, where `unshare` allows, no network.

    Same API and result type as DockerSandbox. It bounds time, memory (RLIMIT_AS) and output and keeps
    sessions in separate processes; the code gets a scrubbed environment, a scratch folder of its own and may
    write nowhere else (Landlock), and as root it runs as `nobody`. It can still read whatever that user can:
    never point it at untrusted code on a machine you care about. It says so once, loudly.

    It refuses to be created unless acknowledged: `allow_host_execution=True` from Python, or
    STARE_ALLOW_LOCAL_SANDBOX=1 in the environment (how the CLI, training runs and Ray workers ask for it; a
    config file cannot).
    """

    runner_kind = "local interpreter"
    # what a run's config may set (rollout.sandbox_kwargs): sizes and timeouts. Never the acknowledgement, the
    # executable the host starts (`python`) or the network namespace (`isolate_network`)
    config_kwargs: frozenset[str] = frozenset(
        {"default_timeout_s", "max_output_bytes", "lease_timeout_s", "memory_mb"}
    )

    def __init__(
        self,
        pool_size: int = 2,
        *,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        max_output_bytes: int = 32 * 1024,
        memory_mb: int = 4096,
        isolate_network: bool = True,
        python: str = sys.executable,
        lease_timeout_s: float | None = DEFAULT_LEASE_TIMEOUT_S,
        preimport: tuple[str, ...] = PREIMPORT,
        allow_host_execution: bool = False,
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
        )
        self.memory_mb = memory_mb
        self.isolate_network = isolate_network
        self.python = python
        self.network_prefix: tuple[str, ...] | None = None
        self.preimport = tuple(preimport)

    def _before_start(self) -> None:
        global _warned
        if landlock_abi() < 1:
            raise SandboxError(
                "the local sandbox needs Landlock (Linux >= 5.13) to keep model-written code from writing "
                "outside its scratch folder, and this kernel has none: use the Docker sandbox"
            )
        self.network_prefix = network_isolation_prefix() if self.isolate_network else None
        if not _warned:
            _warned = True
            network = (
                "no network (own network namespace)"
                if self.network_prefix
                else "FULL NETWORK ACCESS (unshare is not available here)"
            )
            logger.warning(
                "LocalSandbox is NOT a security boundary: model-written code runs on this host as uid %s and "
                "can read what that user can (writes only in its scratch folder); limits: %d MB address "
                "space, time limits, %s. Use DockerSandbox (`stare-agents sandbox doctor`) for untrusted code.",
                unprivileged_ids()[0] if os.geteuid() == 0 else os.getuid(),
                self.memory_mb,
                network,
            )

    def _start_runner(self) -> Runner:
        workdir = tempfile.mkdtemp(prefix="stare-sandbox-")
        drop: list[str] = []
        if os.geteuid() == 0:  # never as root: the scratch folder is nobody's, and the runner becomes nobody
            uid, gid = unprivileged_ids()
            os.chown(workdir, uid, gid)
            drop = ["--drop-to", f"{uid}:{gid}"]
        command = [
            *(self.network_prefix or ()),
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
            "--memory-bytes",
            str(self.memory_mb * 1024 * 1024),
            "--memory-hint",
            f"{self.memory_mb} MB of address space",
            "--preimport",
            ",".join(self.preimport),
            "--remove-workdir",
            *drop,
        ]
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
            shutil.rmtree(workdir, ignore_errors=True)

        runner = Runner(PipeChannel(process), f"local-{process.pid}", on_close=cleanup)
        try:  # answer the first frame before counting as warm
            runner.start(time.monotonic() + START_WAIT_S)
        except Exception:
            runner.close()
            raise
        return runner
