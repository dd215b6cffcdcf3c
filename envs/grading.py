"""Math answer grading: the last `\\boxed{}` of a response, checked with math-verify under a hard timeout.

`grade_answer(response, reference)` is the one entry point most code needs. It extracts the final answer
(the last `\\boxed{...}` or `\\fbox{...}`; there is no "last number in the text" fallback), then asks a
long-lived worker process to parse both sides with math-verify and compare them. The worker runs in its own
process with a memory limit; a call that exceeds `timeout_s` kills it (a fresh one starts on the next call),
so a pathological expression such as `\\boxed{9^{9^{9^{9}}}}` costs at most `timeout_s` and can never hang
the caller.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

GradeReason = Literal["no_answer", "parse_failure", "timeout", "wrong", "correct"]
GRADE_REASONS: tuple[str, ...] = ("no_answer", "parse_failure", "timeout", "wrong", "correct")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_WORKER_PATH = Path(__file__).with_name("_grader_worker.py")


@dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one response against one reference answer.

    correct: True only when `reason == "correct"`.
    reason: "no_answer" (no `\\boxed{}`), "parse_failure" (a box that is unterminated, empty, too long or
        not understood), "timeout" (grading exceeded the time limit), "wrong" or "correct".
    extracted: the text inside the last box (None when there is none).
    detail: a short human-readable note (why parsing failed, ...); empty when there is nothing to add.
    """

    correct: bool
    reason: GradeReason
    extracted: str | None
    detail: str = ""


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` in `text` (nested braces balanced), else None.

    None also when the last box opens a brace that never closes. `\\boxed 5` (no braces) yields "5".
    Linear in `len(text)`.
    """
    return _last_box(text)[0]


def _last_box(text: str) -> tuple[str | None, bool]:
    """(content of the last box or None, whether that box is unterminated)."""
    start = -1
    command = ""
    for name in _BOX_COMMANDS:
        position = text.rfind(name)
        if position > start:
            start, command = position, name
    if start < 0:
        return None, False
    i = start + len(command)
    n = len(text)
    if i < n and text[i] == " ":  # "\boxed 5": the argument is the next token
        j = i + 1
        while j < n and not text[j].isspace() and text[j] != "$":
            j += 1
        return text[i + 1 : j], False
    while i < n and text[i] in " \t\n":
        i += 1
    if i >= n or text[i] != "{":
        return None, False
    depth = 0
    for j in range(i, n):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], False
    return None, True


_BASE_NUMBER = re.compile(r"^\s*([0-9A-Za-z]+)_\{?\s*(\d+)\s*\}?\s*$")


def _base_subscript_mismatch(answer: str, reference: str) -> str:
    """math-verify drops a number's base subscript (`52_8` equals `52_9` to it). When both sides are
    written as base-b numbers, digits and base must match exactly; returns why not, or "" to go on."""
    ref, ans = _BASE_NUMBER.match(reference), _BASE_NUMBER.match(answer)
    if ref is None or ans is None:
        return ""
    if (ans.group(1).lower(), int(ans.group(2))) != (ref.group(1).lower(), int(ref.group(2))):
        return f"base-{ans.group(2)} number {ans.group(1)} differs from base-{ref.group(2)} number {ref.group(1)}"
    return ""


class MathGrader:
    """Grades answers in a long-lived worker process with a hard per-call timeout.

    Thread-safe (calls are serialised on one worker). The worker starts on first use; its start-up (about a
    second: it imports sympy) does not count against `timeout_s`. After a timeout the worker is killed and
    the next call starts a new one.

    Args:
        timeout_s: wall-clock limit for one comparison. The worker interrupts itself shortly before; if it is
            stuck in C code the parent kills it at `timeout_s`.
        memory_limit_mb: address-space limit of the worker (an answer like `10^{10^{10}}` fails to allocate
            instead of swapping the machine). 0 disables the limit.
        max_answer_chars: longer boxed answers are rejected as "parse_failure" without parsing.
    """

    def __init__(self, timeout_s: float = 5.0, memory_limit_mb: int = 2048, max_answer_chars: int = 1000):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.memory_limit_mb = int(memory_limit_mb)
        self.max_answer_chars = int(max_answer_chars)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.restarts = 0  # worker (re)starts after the first, for diagnostics

    # -- public API -----------------------------------------------------------------------------------------
    def grade(self, response: str, reference: str) -> GradeResult:
        """Grade the last boxed answer in `response` against `reference` (a LaTeX answer string)."""
        boxed, unterminated = _last_box(response)
        if unterminated:
            return GradeResult(False, "parse_failure", None, "the last \\boxed{ is never closed")
        if boxed is None:
            return GradeResult(False, "no_answer", None)
        return self.compare(boxed, reference)

    def compare(self, answer: str, reference: str) -> GradeResult:
        """Compare an already extracted answer with `reference` (no box extraction)."""
        if not answer.strip():
            return GradeResult(False, "parse_failure", answer, "empty answer")
        if len(answer) > self.max_answer_chars:
            return GradeResult(
                False, "parse_failure", answer, f"answer longer than {self.max_answer_chars} characters"
            )
        base_mismatch = _base_subscript_mismatch(answer, str(reference))
        if base_mismatch:
            return GradeResult(False, "wrong", answer, base_mismatch)
        reply = self._request({"answer": answer, "reference": str(reference)})
        reason = reply["reason"]
        return GradeResult(reason == "correct", reason, answer, reply.get("detail", ""))

    def close(self) -> None:
        """Stop the worker process (a later call starts a new one)."""
        with self._lock:
            self._stop_worker()

    def __deepcopy__(self, memo: dict[int, object]) -> MathGrader:
        return self  # one worker process, shared by copies (it is thread-safe)

    def __enter__(self) -> MathGrader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- worker management ----------------------------------------------------------------------------------
    def _request(self, payload: dict[str, str]) -> dict[str, str]:
        with self._lock:
            for attempt in range(2):
                self._ensure_worker()
                assert self._proc is not None and self._proc.stdin is not None
                request = dict(payload, soft_timeout_s=max(0.05, self.timeout_s - 0.25))
                try:
                    self._proc.stdin.write((json.dumps(request) + "\n").encode())
                    self._proc.stdin.flush()
                    line = self._read_line(time.monotonic() + self.timeout_s)
                except (BrokenPipeError, EOFError):
                    # The worker died (e.g. killed by the OS); retry once on a fresh worker.
                    self._stop_worker()
                    if attempt == 0:
                        continue
                    return {"reason": "parse_failure", "detail": "the grading worker died on this input"}
                if line is None:
                    self._stop_worker()
                    return {"reason": "timeout", "detail": f"killed after {self.timeout_s:g} s"}
                return json.loads(line)
        raise AssertionError("unreachable")

    def _ensure_worker(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._proc is not None:
            self.restarts += 1
        self._stop_worker()
        memory = self.memory_limit_mb * 1024 * 1024 if self.memory_limit_mb > 0 else 0
        self._proc = subprocess.Popen(
            [sys.executable, str(_WORKER_PATH), str(memory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        ready = self._read_line(time.monotonic() + 120.0)
        if ready is None or not json.loads(ready).get("ready"):
            self._stop_worker()
            raise RuntimeError(
                f"the math-grading worker ({_WORKER_PATH}) did not start within 120 s; "
                f"check that math-verify imports in {sys.executable}"
            )

    def _read_line(self, deadline: float) -> str | None:
        """One line from the worker, None on timeout; EOFError when the worker is gone."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("grading worker closed its output")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def _stop_worker(self) -> None:
        proc, self._proc, self._buffer = self._proc, None, b""
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


_default_grader: MathGrader | None = None
_default_lock = threading.Lock()


def default_grader() -> MathGrader:
    """The process-wide grader used by `grade_answer` (created on first use, closed at exit)."""
    global _default_grader
    with _default_lock:
        if _default_grader is None:
            _default_grader = MathGrader()
            atexit.register(_default_grader.close)
        return _default_grader


def grade_answer(response: str, reference: str, *, grader: MathGrader | None = None) -> GradeResult:
    """Grade the last `\\boxed{}` answer in `response` against the reference answer.

    >>> grade_answer("so the answer is \\\\boxed{\\\\frac{1}{2}}", "0.5").correct
    True

    Returns a `GradeResult` with `.correct`, `.reason` (one of "no_answer", "parse_failure", "timeout",
    "wrong", "correct") and `.extracted`. Never raises for what the response contains, and returns within the
    grader's `timeout_s` (5 s by default) plus process overhead.
    """
    return (grader or default_grader()).grade(response, reference)
