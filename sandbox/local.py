"""LocalSandbox: the same interpreter and API without Docker, for development. NOT a security boundary."""

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
)

logger = logging.getLogger("stare_agents.sandbox")

RUNNER_PATH = Path(__file__).with_name("runner.py")
_warned = False


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
    candidates = [(unshare, "--net")] if os.geteuid() == 0 else []
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
    sessions in separate processes, but the code runs as the current user and can read and write whatever
    that user can: never point it at untrusted code on a machine you care about. It says so once, loudly.
    """

    runner_kind = "local interpreter"

    def __init__(
        self,
        pool_size: int = 2,
        *,
        default_timeout_s: float = 10.0,
        max_output_bytes: int = 32 * 1024,
        memory_mb: int = 4096,
        isolate_network: bool = True,
        python: str = sys.executable,
        lease_timeout_s: float | None = DEFAULT_LEASE_TIMEOUT_S,
        preimport: tuple[str, ...] = PREIMPORT,
    ) -> None:
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
        self.network_prefix = network_isolation_prefix() if self.isolate_network else None
        if not _warned:
            _warned = True
            network = (
                "no network (own network namespace)"
                if self.network_prefix
                else "FULL NETWORK ACCESS (unshare is not available here)"
            )
            logger.warning(
                "LocalSandbox is NOT a security boundary: model-written code runs as user %s with this "
                "machine's files; limits: %d MB address space, time limits, %s. Use DockerSandbox "
                "(`stare-agents sandbox doctor`) for untrusted code.",
                os.environ.get("USER", os.getuid()),
                self.memory_mb,
                network,
            )

    def _start_runner(self) -> Runner:
        workdir = tempfile.mkdtemp(prefix="stare-sandbox-")
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
        ]
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=workdir, start_new_session=True
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
