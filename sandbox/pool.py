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
import math
import numbers
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stare_agents.sandbox.result import STATUSES, ExecutionResult
from stare_agents.sandbox.runner import MAC_BYTES, MAX_TIMEOUT_S, ChannelKey, encode_frame

logger = logging.getLogger("stare_agents.sandbox")

# Extra time the host grants past a call's own limit before it gives up on the runner: the runner's
# interrupt grace period plus transport. Past it the runner is discarded and replaced.
HOST_SLACK_S = 10.0

# Modules every session's interpreter starts with, already imported: sessions are forked from a template
# interpreter that imported them once per container (see runner.py), so they cost no time per session.
PREIMPORT: tuple[str, ...] = ("numpy", "sympy")

MAX_CODE_BYTES = 16 * 1024 * 1024  # the most code one call may send (UTF-8)
DEFAULT_LEASE_TIMEOUT_S = 300.0  # how long a new session waits for a free runner by default
RESET_WAIT_S = 20.0  # the previous session's reset (killing, wiping; a template restart imports again)
PING_WAIT_S = 3.0  # a leased runner answers this fast before a new session's first call, or is replaced
START_WAIT_S = 60.0  # a new runner answers its first frame
MAX_HEADER_BYTES = 64 * 1024  # a reply's JSON header
NOTES_BYTES = 64 * 1024  # what the runner may add to stderr on top of the output cap (its own notes)


class SandboxError(RuntimeError):
    """The sandbox itself failed (no engine, no image, a runner that cannot start) - never the code's doing."""


class ChannelClosed(Exception):
    """The runner went away (its container or process ended)."""


class ChannelTimeout(Exception):
    """The runner did not answer in time."""


class ProtocolError(Exception):
    """A reply the runner never sends: malformed, too large, or failing its signature. Only code that broke
    into the channel (possible under gVisor) or a broken runner produces one."""


class ResetFailed(Exception):
    """The runner could not make itself clean between sessions (something of the code was left)."""


def check_timeout(value: object, name: str = "timeout_s") -> float:
    """`value` as a time limit in seconds: a finite real number in (0, MAX_TIMEOUT_S]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise ValueError(
            f"{name} must be a finite number of seconds in (0, {MAX_TIMEOUT_S:g}], got {value!r}; "
            f"pass e.g. {name}=10"
        )
    return float(value)


class Channel:
    """A byte stream to one runner. Subclasses implement `send`, `_recv_some`, `peer_gone` and `close`."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def send(self, data: bytes, deadline: float) -> None:
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
    """Host-side handle of one warm runner (one container, or one local process).

    Every frame is signed with a key of this runner's own (see runner.ChannelKey) and every reply is
    checked: its size, its fields and their types, its status word, its signature.
    """

    def __init__(self, channel: Channel, name: str, on_close: Callable[[], None] | None = None) -> None:
        self.channel = channel
        self.name = name
        self._on_close = on_close
        self.key = ChannelKey(os.urandom(32))
        self._send_lock = threading.Lock()  # a cancel may come from another thread than the call's
        self._pending: collections.deque[str] = collections.deque()  # replies owed: "reset", "ping"
        self.calls = 0
        self.closed = False
        self.retired = False  # replaced: never lent again
        self.info: dict[str, Any] = {}

    def start(self, deadline: float) -> dict[str, Any]:
        """Give the runner its key (the first frame, before any code runs) and wait for its answer."""
        with self._send_lock:
            self.channel.send(encode_frame({"op": "hello", "key": self.key.key.hex()}), deadline)
        self.info, _, _ = self._read_reply(deadline, "hello")
        return self.info

    def _send(self, header: dict[str, Any], deadline: float) -> None:
        with self._send_lock:  # sealed and sent in one step: frames go out in the order of their numbers
            self.channel.send(self.key.seal(ChannelKey.HOST, encode_frame(header)), deadline)

    def _read_reply(
        self, deadline: float | None, kind: str, max_output: int = 0
    ) -> tuple[dict[str, Any], bytes, bytes]:
        head = self.channel.recv_exact(4, deadline)
        size = int.from_bytes(head, "big")
        if size > MAX_HEADER_BYTES:
            raise ProtocolError(f"a reply header of {size} bytes")
        body = self.channel.recv_exact(size, deadline)
        try:
            header = json.loads(body)
        except ValueError as exc:
            raise ProtocolError("a reply header that is not JSON") from exc
        if not isinstance(header, dict):
            raise ProtocolError("a reply header that is not an object")
        limit = max_output + NOTES_BYTES if kind == "run" else 0
        sizes = header.get("stdout"), header.get("stderr")
        for n in sizes:
            if type(n) is not int or not 0 <= n <= limit:
                raise ProtocolError(f"a {kind} reply announcing {str(n)[:40]} bytes (at most {limit})")
        out = self.channel.recv_exact(sizes[0], deadline)
        err = self.channel.recv_exact(sizes[1], deadline)
        mac = self.channel.recv_exact(MAC_BYTES, deadline)
        if not self.key.verify(ChannelKey.SUPERVISOR, head + body + out + err, mac):
            raise ProtocolError("a reply with a wrong signature (forged, replayed or garbled)")
        if header.get("tampered"):
            raise ProtocolError(
                f"the code tampered with the sandbox's channel ({str(header['tampered'])[:200]})"
            )
        status = header.get("status")
        if kind == "run":
            duration = header.get("duration_s")
            if status not in STATUSES or type(header.get("truncated")) is not bool:
                raise ProtocolError(f"a run reply with status {str(status)[:40]!r}")
            if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not duration >= 0:
                raise ProtocolError(f"a run reply with duration {str(duration)[:40]!r}")
        elif status not in ("ok", "error"):
            raise ProtocolError(f"a {kind} reply with status {str(status)[:40]!r}")
        return header, out, err

    def settle(self, deadline: float | None) -> None:
        """Wait for the replies of requests sent earlier without waiting (reset, ping)."""
        while self._pending:
            kind = self._pending[0]
            header, _, _ = self._read_reply(deadline, kind)
            self._pending.popleft()
            if header["status"] != "ok":
                raise ResetFailed(f"{self.name} failed its {kind}: {str(header.get('error'))[:300]}")

    def request(
        self, header: dict[str, Any], deadline: float, max_output: int
    ) -> tuple[dict[str, Any], bytes, bytes]:
        self.settle(deadline)
        self._send(header, deadline)
        self.calls += 1
        return self._read_reply(deadline, "run", max_output)

    def send_reset(self) -> None:
        """Ask the runner to wipe the session (all processes, IPC, scratch folders); don't wait."""
        self._send({"op": "reset"}, time.monotonic() + 30)
        self._pending.append("reset")

    def ping(self, deadline: float) -> None:
        """Check that the runner answers now (it may have been paused or frozen while idle)."""
        self._send({"op": "ping"}, deadline)
        self._pending.append("ping")
        self.settle(deadline)

    def cancel(self) -> None:
        """Interrupt the call in flight, from any thread; best effort (the call may have ended)."""
        try:
            self._send({"op": "cancel"}, time.monotonic() + 2)
        except (ChannelClosed, ChannelTimeout, OSError) as exc:
            logger.debug("could not cancel the call on %s: %s", self.name, exc)

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
                    "(use `with sandbox.session() as s:` or `async with sandbox.asession() as s:`)",
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
        waiter = _Waiter(self)
        runner = self._take_or_wait(waiter)
        if runner is not None:
            return runner
        assert waiter.event is not None
        if not waiter.event.wait(timeout_s):
            self._give_up(waiter)
            if waiter.runner is None and waiter.error is None:
                raise self._lease_timeout_error(timeout_s)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.runner is not None
        return waiter.runner

    async def aacquire(self, timeout_s: float | None = None) -> Runner:
        waiter = _Waiter(self, asyncio.get_running_loop())
        runner = self._take_or_wait(waiter)
        if runner is not None:
            return runner
        future = waiter.future
        assert future is not None
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except (asyncio.CancelledError, asyncio.TimeoutError) as exc:
            self._give_up(waiter)
            if future.done() and not future.cancelled() and future.exception() is None:
                self._put(future.result())  # delivered just as we gave up: it goes back
            else:
                future.cancel()  # a delivery still on its way sees this and gives the runner back
            if isinstance(exc, asyncio.TimeoutError):
                raise self._lease_timeout_error(timeout_s) from None
            raise

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


# --------------------------------------------------------------------------------------------- sessions


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

    `run(code, timeout_s=None)` executes code and returns an ExecutionResult; it never raises for what the
    code does. With stateless=True each call starts from an empty namespace (SimpleTIR-style); imported
    modules stay cached and files written to the scratch folder remain until the session ends.

    Threads may share a session (calls run one at a time). `close()` may come from any thread, also
    while a call runs: that call is interrupted, and its runner goes back to the pool only once the call
    has ended. A session dropped without close() gives its runner back when it is garbage-collected.
    """

    def __init__(
        self, sandbox: PooledSandbox, *, stateless: bool = False, timeout_s: float | None = None, echo: bool
    ) -> None:
        self.sandbox = sandbox
        self.stateless = stateless
        self.timeout_s = check_timeout(timeout_s) if timeout_s is not None else sandbox.default_timeout_s
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

    def _check_call(self, code: str, timeout_s: float | None) -> float:
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if len(code) > MAX_CODE_BYTES // 4 and len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise ValueError(
                f"code of more than {MAX_CODE_BYTES} bytes (UTF-8) cannot be sent to the sandbox"
            )
        return self.timeout_s if timeout_s is None else check_timeout(timeout_s)

    def run(self, code: str, timeout_s: float | None = None) -> ExecutionResult:
        limit = self._check_call(code, timeout_s)
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

    def _run(self, code: str, limit: float) -> ExecutionResult:
        started = time.perf_counter()
        runner = self._settled_runner()
        self.used = True
        request = {
            "op": "run",
            "code": code,
            "timeout_s": limit,
            "stateless": self.stateless,
            "echo": self.echo,
            "max_output": self.sandbox.max_output_bytes,
        }
        deadline = time.monotonic() + limit + self.sandbox.host_slack_s
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
        )

    def _runner_lost(
        self, runner: Runner, exc: BaseException, started: float, limit: float
    ) -> ExecutionResult:
        """The runner died, hung or broke its protocol: replace it; this call reports what happened and the
        session goes on with a fresh interpreter."""
        pool, _ = self._drop_runner()
        if pool is not None:
            pool.replace(runner)
        self.used = False
        if isinstance(exc, ChannelTimeout):
            status = "timeout"
            what = f"the sandbox did not answer within {limit:g} s + {self.sandbox.host_slack_s:g} s"
        elif isinstance(exc, ProtocolError):
            status, what = "error", f"SandboxError: the sandbox's reply was not valid: {exc}"
        else:
            status, what = "killed", f"the sandbox {self.sandbox.runner_kind} stopped ({exc})"
        message = f"{what}; it was replaced and this session's variables were lost\n"
        return ExecutionResult("", message, status, False, time.perf_counter() - started)

    def cancel_call(self) -> None:
        """Interrupt the call in flight on this session, if any (what cancelling `arun` does)."""
        with self._state:
            runner = self._lease_box.runner if self._in_flight else None
        if runner is not None:
            runner.cancel()

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


class AsyncSession:
    """asyncio twin of Session: `async with sandbox.asession() as s: r = await s.arun(code)`.

    Leasing waits without holding a thread; each `arun` runs the blocking call on the sandbox's executor
    (one thread per leased runner), so many coroutines can share a small pool. Cancelling `arun` (e.g.
    `asyncio.wait_for`) interrupts the call in the sandbox; leaving the `async with` block closes the
    session, also while a call runs.
    """

    def __init__(self, session: Session) -> None:
        self.session = session

    async def __aenter__(self) -> AsyncSession:
        await self._lease()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.session.close()

    async def _lease(self) -> None:
        session = self.session
        if session.closed:
            raise SandboxError("this session is closed")
        if session.runner is None:
            loop = asyncio.get_running_loop()
            pool = await loop.run_in_executor(session.sandbox._executor(), session.sandbox._pool_started)
            runner = await pool.aacquire(session.sandbox.lease_timeout_s)
            session._adopt(pool, runner)

    async def arun(self, code: str, timeout_s: float | None = None) -> ExecutionResult:
        self.session._check_call(code, timeout_s)
        await self._lease()
        loop = asyncio.get_running_loop()
        call = loop.run_in_executor(self.session.sandbox._executor(), self.session.run, code, timeout_s)
        try:
            return await call
        except asyncio.CancelledError:
            self.session.cancel_call()
            raise

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
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        if (
            isinstance(max_output_bytes, bool)
            or not isinstance(max_output_bytes, int)
            or max_output_bytes < 64
        ):
            raise ValueError(f"max_output_bytes must be an int >= 64, got {max_output_bytes!r}")
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
