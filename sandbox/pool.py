"""Host side shared by both backends: channels to a runner, the pool of warm runners, sessions.

A backend (Docker, local) only says how to start one runner and how to talk to it (a `Channel`); pooling,
leasing, resets between sessions, replacement of dead runners, timeouts and the sync/async session API are
here, once.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stare_agents.sandbox.result import ExecutionResult
from stare_agents.sandbox.runner import encode_frame

logger = logging.getLogger("stare_agents.sandbox")

# Extra time the host grants past a call's own limit before it gives up on the runner: the runner's
# interrupt grace period plus transport. Past it the runner is discarded and replaced.
HOST_SLACK_S = 10.0

# Modules every session's interpreter starts with, already imported: sessions are forked from a template
# interpreter that imported them once per container (see runner.py), so they cost no time per session.
PREIMPORT: tuple[str, ...] = ("numpy", "sympy")


class SandboxError(RuntimeError):
    """The sandbox itself failed (no engine, no image, a runner that cannot start) - never the code's doing."""


class ChannelClosed(Exception):
    """The runner went away (its container or process ended)."""


class ChannelTimeout(Exception):
    """The runner did not answer in time."""


class Channel:
    """A byte stream to one runner. Subclasses implement `send`, `_recv_some` and `close`."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def _recv_some(self, deadline: float | None) -> bytes:
        """Some bytes of the runner's stdout; b"" at end of stream; ChannelTimeout past deadline."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def peer_gone(self) -> bool:
        """True if the runner has certainly ended (checked without blocking)."""
        raise NotImplementedError

    def recv_exact(self, n: int, deadline: float | None) -> bytes:
        while len(self._buffer) < n:
            chunk = self._recv_some(deadline)
            if not chunk:
                raise ChannelClosed("the runner closed its output")
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data


class Runner:
    """Host-side handle of one warm runner (one container, or one local process)."""

    def __init__(self, channel: Channel, name: str, on_close: Callable[[], None] | None = None) -> None:
        self.channel = channel
        self.name = name
        self._on_close = on_close
        self._pending = 0  # replies to requests sent without waiting (resets between sessions)
        self.calls = 0
        self.closed = False
        self.info: dict[str, Any] = {}

    def _read_reply(self, deadline: float | None) -> tuple[dict, bytes, bytes]:
        size = int.from_bytes(self.channel.recv_exact(4, deadline), "big")
        header = json.loads(self.channel.recv_exact(size, deadline))
        out = self.channel.recv_exact(header.get("stdout", 0), deadline)
        err = self.channel.recv_exact(header.get("stderr", 0), deadline)
        return header, out, err

    def settle(self, deadline: float | None) -> None:
        """Wait for the replies of requests sent earlier without waiting."""
        while self._pending:
            header, _, _ = self._read_reply(deadline)
            self._pending -= 1
            if header.get("status") != "ok":
                raise ChannelClosed(f"runner {self.name} failed a reset: {header}")

    def request(self, header: dict[str, Any], deadline: float | None) -> tuple[dict, bytes, bytes]:
        self.settle(deadline)
        self.channel.send(encode_frame(header))
        self.calls += 1
        return self._read_reply(deadline)

    def send_reset(self) -> None:
        """Ask the runner to wipe the session (fresh interpreter, empty scratch folder); don't wait."""
        self.channel.send(encode_frame({"op": "reset"}))
        self._pending += 1

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.channel.close()
        finally:
            if self._on_close is not None:
                self._on_close()


class _Waiter:
    """One caller waiting for a runner: a thread (event) or a coroutine (future on its loop)."""

    def __init__(self, pool: Pool, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.pool = pool
        self.loop = loop
        self.future: asyncio.Future | None = loop.create_future() if loop is not None else None
        self.event = threading.Event() if loop is None else None
        self.runner: Runner | None = None
        self.error: BaseException | None = None
        self.cancelled = False

    def deliver(self, runner: Runner | None, error: BaseException | None = None) -> bool:
        """Hand over a runner (or an error). False if the waiter already gave up."""
        if self.cancelled:
            return False
        self.runner, self.error = runner, error
        if self.event is not None:
            self.event.set()
            return True
        assert self.loop is not None and self.future is not None
        if self.loop.is_closed():
            return False

        def settle() -> None:
            if self.future.done():  # cancelled in the meantime: give the runner back
                if runner is not None:
                    self.pool._put(runner)
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(runner)

        self.loop.call_soon_threadsafe(settle)
        return True


class Pool:
    """Warm runners leased one per session, reset between sessions, replaced when they die."""

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
        self._starting = 0
        self._closed = False
        self._closing: list[threading.Thread] = []  # replaced runners being closed in the background
        self.last_error: BaseException | None = None
        self.start_seconds = 0.0

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
        logger.info("started %d %s in %.2f s", self.size, self.what, self.start_seconds)

    def _try_start(self) -> Runner | BaseException:
        try:
            runner = self.start_runner()
        except BaseException as exc:  # reported by the caller
            return exc
        with self._lock:
            self._all.add(runner)
        return runner

    def close(self) -> None:
        with self._lock:
            self._closed = True
            runners = list(self._all)
            self._all.clear()
            self._free.clear()
            waiters = list(self._waiters)
            self._waiters.clear()
        for waiter in waiters:
            waiter.deliver(None, SandboxError("the sandbox was closed"))
        # plain threads, not an executor: this also runs at interpreter exit, when executors refuse work
        closers = [threading.Thread(target=_close_quietly, args=(runner,)) for runner in runners]
        for closer in closers:
            closer.start()
        for closer in closers + self._closing:
            closer.join(30)

    # -- leasing
    def _put(self, runner: Runner) -> None:
        """Give a ready runner to the first waiter still waiting, else to the free list."""
        with self._lock:
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

    def acquire(self, timeout_s: float | None = None) -> Runner:
        waiter = _Waiter(self)
        runner = self._take_or_wait(waiter)
        if runner is not None:
            return runner
        assert waiter.event is not None
        if not waiter.event.wait(timeout_s):
            with self._lock:
                waiter.cancelled = True
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if waiter.runner is None:
                raise SandboxError(f"no free {self.what} within {timeout_s} s (pool_size={self.size})")
        if waiter.error is not None:
            raise waiter.error
        assert waiter.runner is not None
        return waiter.runner

    async def aacquire(self) -> Runner:
        waiter = _Waiter(self, asyncio.get_running_loop())
        runner = self._take_or_wait(waiter)
        if runner is not None:
            return runner
        assert waiter.future is not None
        try:
            return await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                waiter.cancelled = True
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            raise

    def release(self, runner: Runner) -> None:
        """A session is done with `runner`: reset it (without waiting) and lend it again."""
        if runner.closed:
            return
        try:
            runner.send_reset()
        except (ChannelClosed, OSError) as exc:
            logger.warning("%s %s did not take a reset (%s); replacing it", self.what, runner.name, exc)
            self.replace(runner)
            return
        self._put(runner)

    def replace(self, runner: Runner) -> None:
        """Discard a broken runner and start a new one in the background."""
        with self._lock:
            self._all.discard(runner)
            if self._closed:
                return
            self._starting += 1
        closer = threading.Thread(target=_close_quietly, args=(runner,), daemon=True)
        closer.start()
        with self._lock:
            self._closing = [t for t in self._closing if t.is_alive()] + [closer]
        threading.Thread(target=self._start_replacement, daemon=True, name="sandbox-replace").start()

    def _start_replacement(self) -> None:
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
        logger.error("could not start a replacement %s: %s", self.what, result)
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


# --------------------------------------------------------------------------------------------- sessions


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class Session:
    """One stateful interpreter leased from a sandbox's pool. Use as a context manager.

    `run(code, timeout_s=None)` executes code and returns an ExecutionResult; it never raises for what the
    code does. With stateless=True each call starts from an empty namespace (SimpleTIR-style); imported
    modules stay cached and files written to the scratch folder remain until the session ends.
    """

    def __init__(
        self, sandbox: PooledSandbox, *, stateless: bool = False, timeout_s: float | None = None, echo: bool
    ) -> None:
        self.sandbox = sandbox
        self.stateless = stateless
        self.timeout_s = timeout_s if timeout_s is not None else sandbox.default_timeout_s
        self.echo = echo
        self.runner: Runner | None = None
        self.used = False  # this session's code has run on self.runner: its death must be reported
        self.closed = False
        self._lock = threading.Lock()  # one call at a time, even if threads share the session

    def __enter__(self) -> Session:
        self._lease()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lease(self) -> Runner:
        if self.closed:
            raise SandboxError("this session is closed")
        if self.runner is None:
            self.runner = self.sandbox._pool_started().acquire(self.sandbox.lease_timeout_s)
        return self.runner

    def _settled_runner(self) -> Runner:
        """The leased runner, done with the reset that its previous session left queued.

        A runner that fails its reset is replaced before this session's code runs, so the session's
        first call never reports a failure that belongs to the previous session. Once the session has
        run code on its runner, a dead runner is left for `run` to report (the session's state is gone).
        """
        if self.used:
            return self._lease()
        for _ in range(5):
            runner = self._lease()
            try:
                runner.settle(time.monotonic() + 60)
                if runner.channel.peer_gone():
                    raise ChannelClosed("it ended while idle")
                return runner
            except (ChannelClosed, ChannelTimeout, OSError) as exc:
                logger.warning("%s failed its reset between sessions (%s); replacing it", runner.name, exc)
                self.sandbox._pool_started().replace(runner)
                self.runner = None
        raise SandboxError("five runners in a row failed their reset between sessions")

    def run(self, code: str, timeout_s: float | None = None) -> ExecutionResult:
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        with self._lock:
            return self._run(code, timeout_s, retry=True)

    def _run(self, code: str, timeout_s: float | None, retry: bool) -> ExecutionResult:
        started = time.perf_counter()
        limit = float(timeout_s if timeout_s is not None else self.timeout_s)
        if limit <= 0:
            raise ValueError(f"timeout_s must be > 0, got {limit}")
        runner = self._settled_runner()
        fresh, self.used = not self.used, True
        request = {
            "op": "run",
            "code": code,
            "timeout_s": limit,
            "stateless": self.stateless,
            "echo": self.echo,
            "max_output": self.sandbox.max_output_bytes,
        }
        try:
            header, out, err = runner.request(request, time.monotonic() + limit + self.sandbox.host_slack_s)
        except (ChannelClosed, ChannelTimeout, OSError, ValueError) as exc:
            if fresh and retry and not isinstance(exc, ChannelTimeout):
                # The runner ended under this session's first call on it. The code cannot end a runner
                # (PID 1 ignores it; out of memory kills the worker, not the runner), so it died on its
                # own, e.g. while idle; with no state to lose and every effect gone with it, run the call
                # again on a fresh one.
                logger.warning(
                    "%s ended under a session's first call (%s); running it on another", runner.name, exc
                )
                self.sandbox._pool_started().replace(runner)
                self.runner, self.used = None, False
                return self._run(code, timeout_s, retry=False)
            return self._runner_lost(runner, exc, started, limit)
        status = header.get("status", "error")
        return ExecutionResult(
            stdout=_decode(out),
            stderr=_decode(err),
            status=status,
            truncated=bool(header.get("truncated")),
            duration_s=time.perf_counter() - started,
        )

    def _runner_lost(
        self, runner: Runner, exc: BaseException, started: float, limit: float
    ) -> ExecutionResult:
        """The runner died or hung: replace it; this call reports what happened and the session goes on."""
        self.sandbox._pool_started().replace(runner)
        self.runner, self.used = None, False
        if isinstance(exc, ChannelTimeout):
            status, what = (
                "timeout",
                f"the sandbox did not answer within {limit:g} s + {self.sandbox.host_slack_s:g} s",
            )
        else:
            status, what = "killed", f"the sandbox {self.sandbox.runner_kind} stopped ({exc})"
        message = f"{what}; it was replaced and this session's variables were lost\n"
        return ExecutionResult("", message, status, False, time.perf_counter() - started)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        runner, self.runner = self.runner, None
        if runner is not None:
            pool = self.sandbox._pool
            if pool is not None:
                pool.release(runner)


class AsyncSession:
    """asyncio twin of Session: `async with sandbox.asession() as s: r = await s.arun(code)`.

    Leasing waits without holding a thread; each `arun` runs the blocking call on the sandbox's executor
    (one thread per leased runner), so many coroutines can share a small pool.
    """

    def __init__(self, session: Session) -> None:
        self.session = session

    async def __aenter__(self) -> AsyncSession:
        await self._lease()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.session.close()

    async def _lease(self) -> None:
        if self.session.runner is None and not self.session.closed:
            pool = await asyncio.get_running_loop().run_in_executor(
                self.session.sandbox._executor(), self.session.sandbox._pool_started
            )
            self.session.runner = await pool.aacquire()

    async def arun(self, code: str, timeout_s: float | None = None) -> ExecutionResult:
        await self._lease()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.session.sandbox._executor(), self.session.run, code, timeout_s)

    async def aclose(self) -> None:
        self.session.close()


# ---------------------------------------------------------------------------------------------- sandbox

_open_sandboxes: weakref.WeakSet[PooledSandbox] = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for sandbox in list(_open_sandboxes):
        try:
            sandbox.close()
        except Exception as exc:  # best effort at interpreter exit
            logger.debug("closing %r at exit failed: %s", sandbox, exc)


class PooledSandbox:
    """Base of DockerSandbox and LocalSandbox: a pool of warm runners and the session API."""

    runner_kind = "runner"

    def __init__(
        self,
        *,
        pool_size: int,
        default_timeout_s: float,
        max_output_bytes: int,
        lease_timeout_s: float | None,
    ) -> None:
        if max_output_bytes < 64:
            raise ValueError(f"max_output_bytes must be >= 64, got {max_output_bytes}")
        self.pool_size = pool_size
        self.default_timeout_s = default_timeout_s
        self.max_output_bytes = max_output_bytes
        self.lease_timeout_s = lease_timeout_s
        self.host_slack_s = HOST_SLACK_S
        self._pool: Pool | None = None
        self._start_lock = threading.Lock()
        self._threads: ThreadPoolExecutor | None = None

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
            threads, self._threads = self._threads, None
        if pool is not None:
            pool.close()
        if threads is not None:
            threads.shutdown(wait=False)
        _open_sandboxes.discard(self)

    def __enter__(self) -> PooledSandbox:
        return self.start()

    def __deepcopy__(self, memo: dict) -> PooledSandbox:
        # A sandbox is a shared resource (containers, threads): copies of an object that holds one,
        # such as the kwargs gymnasium deep-copies for its env checker, share it rather than clone it.
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> PooledSandbox:
        await asyncio.get_running_loop().run_in_executor(None, self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def _executor(self) -> ThreadPoolExecutor:
        with self._start_lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(
                    max_workers=self.pool_size + 4, thread_name_prefix="sandbox-call"
                )
            return self._threads

    # sessions
    def session(self, stateless: bool = False, timeout_s: float | None = None, echo: bool = False) -> Session:
        """A session with its own interpreter; `with sandbox.session() as s: s.run(code)`.

        stateless: each call starts from an empty namespace (SimpleTIR-compatible).
        timeout_s: the default limit of this session's calls (else the sandbox's default_timeout_s).
        echo: print the value of a trailing expression, as a notebook cell does.
        """
        return Session(self, stateless=stateless, timeout_s=timeout_s, echo=echo)

    def asession(
        self, stateless: bool = False, timeout_s: float | None = None, echo: bool = False
    ) -> AsyncSession:
        """asyncio session: `async with sandbox.asession() as s: r = await s.arun(code)`."""
        return AsyncSession(self.session(stateless=stateless, timeout_s=timeout_s, echo=echo))

    def run(self, code: str, timeout_s: float | None = None) -> ExecutionResult:
        """One call in a fresh session (nothing carries over from or to other calls)."""
        with self.session(stateless=True) as session:
            return session.run(code, timeout_s)

    async def arun(self, code: str, timeout_s: float | None = None) -> ExecutionResult:
        async with self.asession(stateless=True) as session:
            return await session.arun(code, timeout_s)
