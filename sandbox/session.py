"""Sessions: one stateful interpreter leased from a sandbox's pool."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING

from stare_agents.sandbox.channel import MAX_CODE_BYTES, PING_WAIT_S, RESET_WAIT_S, Runner, check_limits
from stare_agents.sandbox.errors import (
    ChannelClosed,
    ChannelTimeout,
    ProtocolError,
    ResetFailed,
    SandboxError,
)
from stare_agents.sandbox.result import ExecutionResult

if TYPE_CHECKING:
    from stare_agents.sandbox.pool import Pool, PooledSandbox


logger = logging.getLogger("stare_agents.sandbox")


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class _Lease:
    """The runner a session holds and the pool it came from, shared with the session's finaliser."""

    __slots__ = ("pool", "runner")

    def __init__(self) -> None:
        self.pool: Pool | None = None
        self.runner: Runner | None = None


def _return_abandoned(lease: _Lease) -> None:
    """Finaliser of a session dropped without close(). It may run inside any code (even with the pool's
    lock held), so it only enqueues the runner for the pool's collector thread, which resets and lends it."""
    pool, runner = lease.pool, lease.runner
    lease.pool = lease.runner = None
    if pool is not None and runner is not None:
        pool._abandoned.put(runner)


class Session:
    """One stateful interpreter leased from a sandbox's pool. Use as a context manager.

    `run(code, timeout_s=None, wall_timeout_s=None)` executes code and returns an ExecutionResult; it never
    raises for what the code does. `timeout_s` is the CPU time the call's code may use (its interpreter and
    every process it starts), `wall_timeout_s` caps its wall-clock time (code that sleeps or waits; default
    runner.WALL_FACTOR times timeout_s); unset, the session's limits (else the sandbox's default_timeout_s).
    With stateless=True each call starts from an empty namespace (SimpleTIR-style); imported
    modules stay cached and files written to the scratch folder remain until the session ends.

    Threads may share a session (calls run one at a time). `close()` may come from any thread, also
    while a call runs: that call is interrupted, and its runner goes back to the pool only once the call
    has ended. A session dropped without close() gives its runner back when it is garbage-collected.
    """

    def __init__(
        self,
        sandbox: PooledSandbox,
        *,
        stateless: bool = False,
        timeout_s: float | None = None,
        wall_timeout_s: float | None = None,
        echo: bool,
    ) -> None:
        self.sandbox = sandbox
        self.stateless = stateless
        self.timeout_s, self.wall_timeout_s = check_limits(
            sandbox.default_timeout_s if timeout_s is None else timeout_s, wall_timeout_s
        )
        self.echo = echo
        self.used = False  # this session's code has run on its runner: its death must be reported
        self.closed = False
        self._calls = threading.Lock()  # one call at a time, even if threads share the session
        self._state = threading.Lock()  # guards closed, _in_flight and the lease
        self._in_flight = False
        self._lease_box = _Lease()
        self._finalizer = weakref.finalize(self, _return_abandoned, self._lease_box)
        self._finalizer.atexit = False  # at exit the sandbox closes its pool instead

    @property
    def runner(self) -> Runner | None:
        """The runner this session holds (None before the first call and after close)."""
        return self._lease_box.runner

    def __enter__(self) -> Session:
        self._lease()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _adopt(self, pool: Pool, runner: Runner) -> Runner:
        """Take a leased runner, unless the session was closed (or leased) meanwhile: then it goes back."""
        with self._state:
            if not self.closed and self._lease_box.runner is None:
                self._lease_box.pool, self._lease_box.runner = pool, runner
                return runner
            closed, current = self.closed, self._lease_box.runner
        pool._put(runner)
        if closed or current is None:
            raise SandboxError("this session is closed")
        return current

    def _drop_runner(self) -> tuple[Pool | None, Runner | None]:
        with self._state:
            pool, runner = self._lease_box.pool, self._lease_box.runner
            self._lease_box.pool = self._lease_box.runner = None
        return pool, runner

    def _lease(self) -> Runner:
        if self.closed:
            raise SandboxError("this session is closed")
        runner = self._lease_box.runner
        if runner is None:
            pool = self.sandbox._pool_started()
            runner = self._adopt(pool, pool.acquire(self.sandbox.lease_timeout_s))
        return runner

    def _settled_runner(self) -> Runner:
        """The leased runner, done with the reset that its previous session left queued, and answering.

        A runner that fails its reset (or its check that nothing of the previous session is left) or does
        not answer a ping (it died, or was paused, while idle) is replaced before this session's code runs,
        so the session's first call never reports a failure that belongs to the previous session. Once the
        session has run code on its runner, a dead runner is left for `run` to report.
        """
        if self.used:
            return self._lease()
        for _ in range(5):
            runner = self._lease()
            pool = self._lease_box.pool
            try:
                runner.settle(time.monotonic() + RESET_WAIT_S)
                runner.ping(time.monotonic() + PING_WAIT_S)
                return runner
            except (ChannelClosed, ChannelTimeout, ProtocolError, ResetFailed, OSError) as exc:
                logger.warning("%s failed its check between sessions (%s); replacing it", runner.name, exc)
                self._drop_runner()
                if pool is not None:
                    pool.replace(runner)
        raise SandboxError("five runners in a row failed their check between sessions")

    def _check_call(
        self, code: str, timeout_s: float | None, wall_timeout_s: float | None
    ) -> tuple[float, float]:
        """The call's (CPU limit, wall-clock cap): its own, else derived from its timeout_s, else the session's."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if len(code) > MAX_CODE_BYTES // 4 and len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise ValueError(
                f"code of more than {MAX_CODE_BYTES} bytes (UTF-8) cannot be sent to the sandbox"
            )
        if timeout_s is None and wall_timeout_s is None:
            return self.timeout_s, self.wall_timeout_s
        return check_limits(self.timeout_s if timeout_s is None else timeout_s, wall_timeout_s)

    def run(
        self, code: str, timeout_s: float | None = None, wall_timeout_s: float | None = None
    ) -> ExecutionResult:
        limit = self._check_call(code, timeout_s, wall_timeout_s)
        with self._calls:
            with self._state:
                if self.closed:
                    raise SandboxError("this session is closed")
                self._in_flight = True
            try:
                return self._run(code, limit)
            finally:
                with self._state:
                    self._in_flight = False
                    give_back = self.closed  # closed while the call ran: the runner goes back now
                if give_back:
                    self._give_back()

    def _run(self, code: str, limit: tuple[float, float]) -> ExecutionResult:
        started = time.perf_counter()
        runner = self._settled_runner()
        self.used = True
        request = {
            "op": "run",
            "code": code,
            "timeout_s": limit[0],
            "wall_timeout_s": limit[1],
            "stateless": self.stateless,
            "echo": self.echo,
            "max_output": self.sandbox.max_output_bytes,
        }
        deadline = time.monotonic() + limit[1] + self.sandbox.grace_s + self.sandbox.host_slack_s
        try:
            header, out, err = runner.request(request, deadline, self.sandbox.max_output_bytes)
        except (ChannelClosed, ChannelTimeout, ProtocolError, ResetFailed, OSError) as exc:
            # never run again elsewhere: the code may be what broke the runner
            return self._runner_lost(runner, exc, started, limit)
        return ExecutionResult(
            stdout=_decode(out),
            stderr=_decode(err),
            status=header["status"],
            truncated=header["truncated"],
            duration_s=time.perf_counter() - started,
            cpu_s=float(header["cpu_s"]),
        )

    def _runner_lost(
        self, runner: Runner, exc: BaseException, started: float, limit: tuple[float, float]
    ) -> ExecutionResult:
        """The runner died, hung or broke its protocol: replace it; this call reports what happened and the
        session goes on with a fresh interpreter."""
        pool, _ = self._drop_runner()
        if pool is not None:
            pool.replace(runner)
        self.used = False
        if isinstance(exc, ChannelTimeout):
            status = "timeout"
            what = (
                f"the sandbox did not answer within the {limit[1]:g} s wall-clock limit + "
                f"{self.sandbox.grace_s + self.sandbox.host_slack_s:g} s"
            )
        elif isinstance(exc, ProtocolError):
            status, what = "error", f"SandboxError: the sandbox's reply was not valid: {exc}"
        else:
            status, what = "killed", f"the sandbox {self.sandbox.runner_kind} stopped ({exc})"
        message = f"{what}; it was replaced and this session's variables were lost\n"
        return ExecutionResult("", message, status, False, time.perf_counter() - started)

    def close(self) -> None:
        """End the session; safe from any thread and while a call runs (that call is interrupted, and the
        runner goes back to the pool when it has ended)."""
        with self._state:
            if self.closed:
                return
            self.closed = True
            in_flight, runner = self._in_flight, self._lease_box.runner
        if in_flight:
            if runner is not None:
                runner.cancel()
            return
        self._give_back()

    def _give_back(self) -> None:
        self._finalizer.detach()
        pool, runner = self._drop_runner()
        if pool is not None and runner is not None:
            pool.release(runner)
