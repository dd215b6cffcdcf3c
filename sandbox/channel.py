"""The channel to one runner and the protocol spoken on it: frames signed both ways, the hello, a call, a reset,
a ping; the limits the host holds a runner to (time slack, code size, header size)."""

from __future__ import annotations

import collections
import json
import logging
import math
import numbers
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from stare_agents.sandbox.errors import (
    ChannelClosed,
    ChannelTimeout,
    ProtocolError,
    ResetFailed,
)
from stare_agents.sandbox.result import STATUSES
from stare_agents.sandbox.runner import (
    MAC_BYTES,
    MAX_TIMEOUT_S,
    ChannelKey,
    default_wall_timeout,
    encode_frame,
)

logger = logging.getLogger("stare_agents.sandbox")

# Past a call's limit, the time the code has to stop when interrupted (KeyboardInterrupt) before its interpreter
# is killed, and the extra time the host grants on top before it gives up on the runner (transport, a busy
# machine); past both the runner is discarded and replaced. Each within its range: a config cannot make a 2 s
# call run on for minutes.
DEFAULT_GRACE_S = 1.0
GRACE_RANGE_S = (0.1, 10.0)
HOST_SLACK_S = 10.0
HOST_SLACK_RANGE_S = (1.0, 60.0)
# the most output one stream of one call may bring back (its head and tail around a marker), and the least
MAX_OUTPUT_RANGE = (64, 1 << 20)
# a sandbox's memory limit in MB (a Docker container's; a local runner's, per process and, as root, in all)
MEMORY_RANGE_MB = (32, 262_144)

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


def check_range(name: str, value: object, bounds: tuple[float, float], integer: bool = False) -> None:
    """Refuse `value` for the setting `name` unless it is a number (an int where `integer`) within `bounds`
    (inclusive), with a ValueError naming the setting, the value and the range."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not bounds[0] <= value <= bounds[1]:
        what = "an int" if integer else "a number"
        low, high = (bound if isinstance(bound, int) else f"{bound:g}" for bound in bounds)
        raise ValueError(f"{name} must be {what} in [{low}, {high}], got {value!r}")


def check_limits(
    timeout_s: object, wall_timeout_s: object = None, names: tuple[str, str] = ("timeout_s", "wall_timeout_s")
) -> tuple[float, float]:
    """A call's (CPU limit, wall-clock cap) in seconds: `timeout_s` CPU seconds (the code's interpreter and every
    process it starts), `wall_timeout_s` the cap for code that sleeps or waits, in [timeout_s, MAX_TIMEOUT_S]
    (None: runner.default_wall_timeout(timeout_s), WALL_FACTOR times the CPU limit). `names`: the keys the
    errors name."""
    cpu_s = check_timeout(timeout_s, names[0])
    if wall_timeout_s is None:
        return cpu_s, default_wall_timeout(cpu_s)
    wall_s = check_timeout(wall_timeout_s, names[1])
    if wall_s < cpu_s:
        raise ValueError(
            f"{names[1]}={wall_timeout_s!r} is below {names[0]}={timeout_s!r}: {names[0]} is the CPU time a call "
            f"may use and {names[1]} caps its wall-clock time (for code that sleeps or waits), so it must be at "
            f"least as long; leave it unset for {default_wall_timeout(cpu_s):g} s"
        )
    return cpu_s, wall_s


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
            if status not in STATUSES or type(header.get("truncated")) is not bool:
                raise ProtocolError(f"a run reply with status {str(status)[:40]!r}")
            for key in ("duration_s", "cpu_s"):
                value = header.get(key)
                if type(value) not in (int, float) or not 0 <= value <= 1e9:
                    raise ProtocolError(f"a run reply with {key} {str(value)[:40]!r}")
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
