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
