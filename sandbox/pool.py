"""Host side shared by both backends: the pool of warm runners and `PooledSandbox`, the base of both backends.

A backend (Docker, local) only says how to start one runner and how to talk to it (a `Channel`, in
channel.py); pooling, leasing, resets between sessions, replacement of dead runners and timeouts are here,
the session API in session.py, the errors in errors.py, once."""

from __future__ import annotations

import atexit
import collections
import logging
import math
import numbers
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stare_agents.sandbox.backend import SandboxBackend
from stare_agents.sandbox.channel import (
    DEFAULT_GRACE_S,
    GRACE_RANGE_S,
    HOST_SLACK_RANGE_S,
    HOST_SLACK_S,
    MAX_OUTPUT_RANGE,
    Runner,
    check_range,
    check_timeout,
)
from stare_agents.sandbox.errors import ChannelClosed, ChannelTimeout, SandboxError
from stare_agents.sandbox.result import ExecutionResult
from stare_agents.sandbox.session import Session

logger = logging.getLogger("stare_agents.sandbox")


class _Waiter:
    """One thread waiting for a runner."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.runner: Runner | None = None
        self.error: BaseException | None = None
        self.cancelled = False

    def deliver(self, runner: Runner | None, error: BaseException | None = None) -> bool:
        """Hand over a runner (or an error). False if the waiter already gave up."""
        if self.cancelled:
            return False
        self.runner, self.error = runner, error
        self.event.set()
        return True


class Pool:
    """Warm runners leased one per session, reset between sessions, replaced when they die.

    Never more than `size` runners exist: a replacement starts only once the runner it replaces is gone,
    and replacing a runner twice does nothing the second time.
    """

    def __init__(self, start_runner: Callable[[], Runner], size: int, what: str) -> None:
        if size < 1:
            raise ValueError(f"pool_size must be >= 1, got {size}")
        self.start_runner = start_runner
        self.size = size
        self.what = what
        self._lock = threading.Lock()
        self._free: collections.deque[Runner] = collections.deque()
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._all: set[Runner] = set()
        self._starting = 0  # replacements under way (their slot counts: the old one is being removed)
        self._closed = False
        self._closing: list[threading.Thread] = []  # replacements in the background
        # runners of sessions dropped without close(), from their finalisers (which may run anywhere, so
        # they only enqueue); a thread of the pool resets and lends them again
        self._abandoned: queue.SimpleQueue[Runner | None] = queue.SimpleQueue()
        self._collector: threading.Thread | None = None
        self.last_error: BaseException | None = None
        self.start_seconds = 0.0
        self.replacements = 0

    # -- lifecycle
    def start(self) -> None:
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(self.size, 16)) as executor:
            runners = list(executor.map(lambda _: self._try_start(), range(self.size)))
        errors = [r for r in runners if isinstance(r, BaseException)]
        for runner in runners:
            if isinstance(runner, Runner):
                self._put(runner)
        self.start_seconds = time.perf_counter() - started
        if errors:
            self.close()
            raise SandboxError(
                f"could not start {len(errors)} of {self.size} {self.what}: {errors[0]}"
            ) from (errors[0])
        self._collector = threading.Thread(
            target=self._collect_abandoned, daemon=True, name="sandbox-abandoned"
        )
        self._collector.start()
        logger.info("started %d %s in %.2f s", self.size, self.what, self.start_seconds)

    def _try_start(self) -> Runner | BaseException:
        try:
            runner = self.start_runner()
        except BaseException as exc:  # reported by the caller
            return exc
        with self._lock:
            closed = self._closed
            if not closed:
                self._all.add(runner)
        if closed:
            _close_quietly(runner)
            return SandboxError("the sandbox was closed")
        return runner

    def close(self) -> None:
        with self._lock:
            self._closed = True
            runners = list(self._all)
            self._all.clear()
            self._free.clear()
            waiters = list(self._waiters)
            self._waiters.clear()
            closing = list(self._closing)
        self._abandoned.put(None)
        for waiter in waiters:
            waiter.deliver(None, SandboxError("the sandbox was closed"))
        # plain threads, not an executor: this also runs at interpreter exit, when executors refuse work
        closers = [threading.Thread(target=_close_quietly, args=(runner,)) for runner in runners]
        for closer in closers:
            closer.start()
        for closer in closers + closing:
            closer.join(30)

    def _collect_abandoned(self) -> None:
        warned = False
        while True:
            runner = self._abandoned.get()
            if runner is None:
                return
            if not warned:
                warned = True
                logger.warning(
                    "a sandbox session was dropped without close(); its %s was reset and lent again "
                    "(use `with sandbox.session() as s:`)",
                    self.what.rstrip("s"),
                )
            self.release(runner)

    # -- leasing
    def _put(self, runner: Runner) -> None:
        """Give a ready runner to the first waiter still waiting, else to the free list."""
        with self._lock:
            if runner.retired:
                return
            if self._closed:
                close = True
            else:
                close = False
                while self._waiters:
                    waiter = self._waiters.popleft()
                    if waiter.deliver(runner):
                        return
                self._free.append(runner)
        if close:
            _close_quietly(runner)

    def _take_or_wait(self, waiter: _Waiter) -> Runner | None:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            if self._free:
                return self._free.popleft()
            if not self._all and not self._starting:
                raise SandboxError(f"no {self.what} left: {self.last_error}")
            self._waiters.append(waiter)
            return None

    def _give_up(self, waiter: _Waiter) -> None:
        with self._lock:
            waiter.cancelled = True
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _lease_timeout_error(self, timeout_s: float | None) -> SandboxError:
        with self._lock:
            leased = len(self._all) - len(self._free)
        return SandboxError(
            f"no free {self.what.rstrip('s')} within {timeout_s:g} s (pool_size={self.size}, {leased} leased "
            f"to open sessions): close sessions when done (`with sandbox.session() as s:`), raise "
            f"pool_size, or pass lease_timeout_s=None to wait without a limit"
        )

    def acquire(self, timeout_s: float | None = None) -> Runner:
        waiter = _Waiter()
        runner = self._take_or_wait(waiter)
        if runner is not None:
            return runner
        if not waiter.event.wait(timeout_s):
            self._give_up(waiter)
            if waiter.runner is None and waiter.error is None:
                raise self._lease_timeout_error(timeout_s)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.runner is not None
        return waiter.runner

    def release(self, runner: Runner) -> None:
        """A session is done with `runner`: reset it (without waiting) and lend it again."""
        if runner.closed or runner.retired:
            return
        try:
            runner.send_reset()
        except (ChannelClosed, ChannelTimeout, OSError) as exc:
            logger.warning("%s %s did not take a reset (%s); replacing it", self.what, runner.name, exc)
            self.replace(runner)
            return
        self._put(runner)

    def replace(self, runner: Runner) -> None:
        """Discard a broken runner and start a new one in the background, once the old one is gone.
        Idempotent: a runner is replaced once, however many callers find it broken."""
        with self._lock:
            if runner.retired:
                return
            runner.retired = True
            self._all.discard(runner)
            start_new = not self._closed
            if start_new:
                self._starting += 1
            self.replacements += 1
        thread = threading.Thread(
            target=self._replace, args=(runner, start_new), daemon=True, name="sandbox-replace"
        )
        with self._lock:
            self._closing = [t for t in self._closing if t.is_alive()] + [thread]
        thread.start()

    def _replace(self, old: Runner, start_new: bool) -> None:
        _close_quietly(old)  # first gone, then a new one: never more than `size` at a time
        if not start_new:
            return
        result = self._try_start()
        with self._lock:
            self._starting -= 1
            failed_for_good = isinstance(result, BaseException) and not self._all and not self._starting
            if isinstance(result, BaseException):
                self.last_error = result
            waiters = list(self._waiters) if failed_for_good else []
            if failed_for_good:
                self._waiters.clear()
        if isinstance(result, Runner):
            self._put(result)
            return
        if not self._closed:
            logger.error("could not start a replacement %s: %s", self.what.rstrip("s"), result)
        for waiter in waiters:
            waiter.deliver(None, SandboxError(f"no {self.what} left: {result}"))

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._all)


def _close_quietly(runner: Runner) -> None:
    try:
        runner.close()
    except Exception as exc:  # closing is best effort; the label sweep catches what is left
        logger.debug("closing %s failed: %s", runner.name, exc)


_open_sandboxes: weakref.WeakSet[PooledSandbox] = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for sandbox in list(_open_sandboxes):
        try:
            sandbox.close()
        except Exception as exc:  # best effort at interpreter exit
            logger.debug("closing %r at exit failed: %s", sandbox, exc)


class PooledSandbox(SandboxBackend):
    """Base of DockerSandbox and LocalSandbox: a pool of warm runners and the session API."""

    runner_kind = "runner"

    def __init__(
        self,
        *,
        pool_size: int,
        default_timeout_s: float,
        max_output_bytes: int,
        lease_timeout_s: float | None,
        grace_s: float = DEFAULT_GRACE_S,
        host_slack_s: float = HOST_SLACK_S,
    ) -> None:
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        check_range("max_output_bytes", max_output_bytes, MAX_OUTPUT_RANGE, integer=True)
        check_range("grace_s", grace_s, GRACE_RANGE_S)
        check_range("host_slack_s", host_slack_s, HOST_SLACK_RANGE_S)
        if lease_timeout_s is not None and (
            isinstance(lease_timeout_s, bool)
            or not isinstance(lease_timeout_s, numbers.Real)
            or not (math.isfinite(lease_timeout_s) and lease_timeout_s > 0)
        ):
            raise ValueError(
                f"lease_timeout_s must be a finite number of seconds > 0, or None to wait without a limit; "
                f"got {lease_timeout_s!r}"
            )
        self.pool_size = pool_size
        self.default_timeout_s = check_timeout(default_timeout_s, "default_timeout_s")
        self.max_output_bytes = max_output_bytes
        self.lease_timeout_s = lease_timeout_s
        self.grace_s = float(grace_s)  # past a call's limit, how long the code has to stop when interrupted
        self.host_slack_s = float(host_slack_s)  # past the limit and the grace, a silent runner is replaced
        self._pool: Pool | None = None
        self._start_lock = threading.Lock()

    @classmethod
    def check_settings(cls, kwargs: dict[str, Any], where: str) -> None:
        """A config's sizes and timeouts, each within its range (a ValueError naming `where`.key), so that none
        can lift a limit: the output cap, the interrupt's grace, the host's slack, the default CPU limit."""
        ranges = {
            "max_output_bytes": (MAX_OUTPUT_RANGE, True),
            "grace_s": (GRACE_RANGE_S, False),
            "host_slack_s": (HOST_SLACK_RANGE_S, False),
        }
        for key, (bounds, integer) in ranges.items():
            if key in kwargs:
                check_range(f"{where}.{key}", kwargs[key], bounds, integer)
        if "default_timeout_s" in kwargs:
            check_timeout(kwargs["default_timeout_s"], f"{where}.default_timeout_s")

    # subclasses
    def _start_runner(self) -> Runner:
        raise NotImplementedError

    def _before_start(self) -> None:
        """Checks and cleanup before the first runner starts."""

    # lifecycle
    def start(self) -> PooledSandbox:
        self._pool_started()
        return self

    def _pool_started(self) -> Pool:
        with self._start_lock:
            if self._pool is None:
                self._before_start()
                pool = Pool(self._start_runner, self.pool_size, f"{self.runner_kind}s")
                pool.start()
                self._pool = pool
                _open_sandboxes.add(self)
            return self._pool

    @property
    def pool_start_seconds(self) -> float:
        return self._pool.start_seconds if self._pool is not None else 0.0

    def close(self) -> None:
        with self._start_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        _open_sandboxes.discard(self)

    def __enter__(self) -> PooledSandbox:
        return self.start()

    def __deepcopy__(self, memo: dict) -> PooledSandbox:
        # A sandbox is a shared resource (containers, threads): copies of an object that holds one,
        # such as the kwargs gymnasium deep-copies for its env checker, share it rather than clone it.
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # sessions
    def session(
        self,
        stateless: bool = False,
        timeout_s: float | None = None,
        echo: bool = False,
        wall_timeout_s: float | None = None,
    ) -> Session:
        """A session with its own interpreter; `with sandbox.session() as s: s.run(code)`.

        stateless: each call starts from an empty namespace (SimpleTIR-compatible).
        timeout_s: the CPU seconds each of this session's calls may use by default (else the sandbox's
            default_timeout_s); wall_timeout_s: their wall-clock cap (else WALL_FACTOR times timeout_s).
        echo: print the value of a trailing expression, as a notebook cell does.
        """
        return Session(
            self, stateless=stateless, timeout_s=timeout_s, wall_timeout_s=wall_timeout_s, echo=echo
        )

    def run(
        self, code: str, timeout_s: float | None = None, wall_timeout_s: float | None = None
    ) -> ExecutionResult:
        """One call in a fresh session (nothing carries over from or to other calls)."""
        with self.session(stateless=True) as session:
            return session.run(code, timeout_s, wall_timeout_s)
