"""Math answer grading: the last `\\boxed{}` of a response, checked with math-verify under a hard timeout.

`grade_answer(response, reference)` is the one entry point most code needs. It extracts the final answer
(the last `\\boxed{...}` or `\\fbox{...}`; there is no "last number in the text" fallback), then asks one
of a pool of long-lived worker processes (`MathGrader`, one pool per process by default) to parse both sides
with math-verify and compare them. Each worker has a memory limit; a call that exceeds `timeout_s` kills
its worker (a fresh one starts when needed), so a pathological expression such as `\\boxed{9^{9^{9^{9}}}}`
costs at most `timeout_s`, holds one worker only, and can never hang the caller.
"""

from __future__ import annotations

import asyncio
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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
    start, command = _rfind_box(text, len(text))
    if start < 0:
        return None, False
    content, _, unterminated = _box_at(text, start, command, len(text))
    return content, unterminated


def _rfind_box(text: str, before: int) -> tuple[int, str]:
    """(start, command) of the last box command that starts before `before`; (-1, "") if none."""
    start, command = -1, ""
    for name in _BOX_COMMANDS:
        position = text.rfind(name, 0, before)
        if position > start:
            start, command = position, name
    return start, command


def _box_at(text: str, start: int, command: str, limit: int) -> tuple[str | None, int, bool]:
    """(content, end, unterminated) of the box whose command starts at `start`, reading before `limit`.

    `\\boxed{...}` with balanced braces, or `\\boxed 5` (the next token). Content None when the command
    has no argument; unterminated when its brace does not close before `limit`.
    """
    i = start + len(command)
    j = i
    while j < limit and text[j] in " \t\n":
        j += 1
    if j < limit and text[j] == "{":
        depth = 0
        for k in range(j, limit):
            ch = text[k]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k], k + 1, False
        return None, limit, True
    if j > i and j < limit:  # "\boxed 5": the argument is the next token
        k = j
        while k < limit and not text[k].isspace() and text[k] != "$":
            k += 1
        return text[j:k], k, False
    return None, i, False


MAX_BOX_RUN = 8
# Against a single-valued reference, at most this many different boxes are compared (each comparison may cost
# the grader's timeout): more is a hedge and wrong without grading, and the first wrong box ends the check.
MAX_GRADED_BOXES = 3
# What may stand between boxes that form one answer: blanks, commas, semicolons, $, &, LaTeX spaces, and/or.
_RUN_SEPARATOR = re.compile(
    r"(?:[\s,;$&~]|\\q?quad|\\[,;:! ]|\\(?:text|mbox|textrm)\{\s*(?:and|or|,)?\s*\}|\band\b|\bor\b)*"
)


def final_boxes(text: str) -> tuple[list[str], bool]:
    """The final run of boxes: (their contents in order, whether the last box is unterminated).

    A run is the last box and the boxes right before it, separated only by blanks, commas, `$`, LaTeX
    spaces, "and" or "or" (`\\boxed{1}, \\boxed{2} and \\boxed{3}`); at most MAX_BOX_RUN + 1 boxes.
    Linear in `len(text)`: each box is read only up to the start of the next.
    """
    start, command = _rfind_box(text, len(text))
    if start < 0:
        return [], False
    content, _, unterminated = _box_at(text, start, command, len(text))
    if content is None:
        return [], unterminated
    boxes = [content]
    while len(boxes) <= MAX_BOX_RUN:
        previous, command = _rfind_box(text, start)
        if previous < 0:
            break
        content, end, unterminated = _box_at(text, previous, command, start)
        gap = text[end:start]
        if content is None or unterminated or len(gap) > 40 or not _RUN_SEPARATOR.fullmatch(gap):
            break
        boxes.insert(0, content)
        start = previous
    return boxes, False


_THOUSANDS = re.compile(
    r"(?P<pre>\s*(?:\\\$|\$)?\s*)(?P<lead>[+-]?\d{1,3})(?P<groups>(?:(?:\\[,;: ]|\{,\}|[ ,~])\d{3})+)"
    r"(?P<post>(?:\.\d+)?\s*(?:\\%|%)?\s*)"
)
_GROUP_SEPARATORS = re.compile(r"\\[,;: ]|\{,\}|[ ,~]")


def normalize_thousands(answer: str) -> str:
    """`1\\,000`, `1 000`, `1{,}000`, `12,345,678` -> `1000`, ..., `12345678` when the whole answer is one
    such number (optionally with `\\$` before or `\\%` after); anything else is returned unchanged."""
    match = _THOUSANDS.fullmatch(answer)
    if match is None:
        return answer
    groups = _GROUP_SEPARATORS.sub("", match["groups"])
    return match["pre"] + match["lead"] + groups + match["post"]


def _is_multi_valued(reference: str) -> bool:
    """Whether the reference lists several values: a comma outside brackets, once an outer pair of
    (), [], \\{ \\} (with or without \\left/\\right) that encloses all of it is removed. `1,000` is one
    number; `(1,2) \\cup (3,4)` is one set."""
    text = normalize_thousands(reference.strip())
    text = re.sub(r"\\(?:left|right|big|Big)\b", "", text).replace("\\{", "{").replace("\\}", "}").strip()
    if len(text) >= 2 and text[0] in "([{" and text[-1] in ")]}" and _closes_at(text, 0) == len(text) - 1:
        text = text[1:-1]
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return True
    return False


def _closes_at(text: str, start: int) -> int:
    """Where the bracket opened at `start` closes (any of )]} closes any of ([{, as intervals mix them)."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in "([{":
            depth += 1
        elif text[index] in ")]}":
            depth -= 1
            if depth == 0:
                return index
    return -1


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


@dataclass
class GraderStats:
    """Totals of one grader since it was made: requests answered by a worker, hard or soft timeouts, worker
    (re)starts, and the seconds requests spent in workers."""

    requests: int = 0
    timeouts: int = 0
    worker_starts: int = 0
    busy_s: float = 0.0


@dataclass
class GradingClock:
    """Seconds and timeouts of the worker requests one thread made while the clock ran (`grading_clock`)."""

    seconds: float = 0.0
    timeouts: int = 0


_clocks = threading.local()


@contextlib.contextmanager
def grading_clock() -> Iterator[GradingClock]:
    """Count the grader work this thread does inside the block (environments report it in `info`).

    Only requests that reach a worker count: an answer settled without one (no box, literal equality) costs
    0.0 s, which keeps an episode's `info` identical across replays. Clocks nest; the inner one counts.
    """
    clock = GradingClock()
    previous = getattr(_clocks, "current", None)
    _clocks.current = clock
    try:
        yield clock
    finally:
        _clocks.current = previous


def charge_grading_clock(seconds: float, timed_out: bool = False) -> None:
    """Add grading work done outside a MathGrader (e.g. a unit-test run) to this thread's running clock."""
    clock = getattr(_clocks, "current", None)
    if clock is not None:
        clock.seconds += seconds
        clock.timeouts += int(timed_out)


class _Worker:
    """One math-verify process: JSON requests on its stdin, replies on its stdout."""

    def __init__(self, memory_limit_mb: int) -> None:
        memory = memory_limit_mb * 1024 * 1024 if memory_limit_mb > 0 else 0
        self.proc = subprocess.Popen(
            [sys.executable, str(_WORKER_PATH), str(memory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.buffer = b""
        ready = self.read_line(time.monotonic() + 120.0)
        if ready is None or not json.loads(ready).get("ready"):
            self.kill()
            raise RuntimeError(
                f"the math-grading worker ({_WORKER_PATH}) did not start within 120 s; "
                f"check that math-verify imports in {sys.executable}"
            )

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, str] | None:
        """The worker's reply, or None when it missed the deadline (the caller kills it). Raises
        BrokenPipeError / EOFError when the worker is gone."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(payload, allow_nan=False) + "\n").encode())
        self.proc.stdin.flush()
        line = self.read_line(time.monotonic() + timeout_s)
        return None if line is None else json.loads(line)

    def read_line(self, deadline: float) -> str | None:
        """One line from the worker, None on timeout; EOFError when the worker is gone."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("grading worker closed its output")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def default_workers() -> int:
    """Grading workers per process by default: one per core, at least 2 (so one pathological grade never
    blocks all others), at most 8 (each worker holds sympy, ~100 MB)."""
    return max(2, min(8, os.cpu_count() or 2))


class MathGrader:
    """A pool of math-verify worker processes, each with a hard per-call timeout and a memory limit.

    A request takes an idle worker (starting one, up to `workers`, when none is idle) and returns it after;
    so a pathological answer holds one worker for at most `timeout_s` while the others keep grading. A
    worker that overruns is killed and a fresh one starts when next needed. Thread-safe; `agrade` /
    `acompare` are the asyncio entry points (they run on the grader's own threads, never the event loop).
    Workers start on demand; `start()` starts them all now. A worker's start-up (about a second: it imports
    sympy) does not count against `timeout_s`.

    Args:
        timeout_s: wall-clock limit for one comparison. The worker interrupts itself shortly before; if it is
            stuck in C code the parent kills it at `timeout_s`.
        memory_limit_mb: address-space limit of each worker (an answer like `10^{10^{10}}` fails to allocate
            instead of swapping the machine). 0 disables the limit.
        max_answer_chars: longer boxed answers are rejected as "parse_failure" without parsing (unless the
            answer is literally the reference).
        workers: the pool size (None: `default_workers()`, from the core count).
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_limit_mb: int = 2048,
        max_answer_chars: int = 1000,
        workers: int | None = None,
    ):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        workers = default_workers() if workers is None else workers
        if not 1 <= workers <= 256:
            raise ValueError(f"workers must be in 1..256, got {workers!r}")
        self.timeout_s = float(timeout_s)
        self.memory_limit_mb = int(memory_limit_mb)
        self.max_answer_chars = int(max_answer_chars)
        self.workers = int(workers)
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._count = 0  # workers alive or starting
        self._generation = 0  # bumped by close(): workers of an older generation are stopped on return
        self._threads: ThreadPoolExecutor | None = None
        self.stats = GraderStats()

    @property
    def restarts(self) -> int:
        """Worker starts beyond the pool size (replacements after kills and deaths)."""
        return max(0, self.stats.worker_starts - self.workers)

    # -- public API -----------------------------------------------------------------------------------------
    def grade(self, response: str, reference: str) -> GradeResult:
        """Grade the final boxed answer in `response` against `reference` (a LaTeX answer string).

        The last box is the answer. When boxes right before it form a run with it (`final_boxes`): against
        a reference that lists several values (`\\{1,2,3\\}`, `(1, 2)`, `-2, 3`) the run is that list;
        against a single value, every different box must be correct (`\\boxed{2} or \\boxed{3}` is a hedge
        and is wrong).
        """
        boxes, unterminated = final_boxes(response)
        if unterminated:
            return GradeResult(False, "parse_failure", None, "the last \\boxed{ is never closed")
        if not boxes:
            return GradeResult(False, "no_answer", None)
        distinct = list(dict.fromkeys(box.strip() for box in boxes))
        if len(distinct) == 1:
            return self.compare(boxes[-1], reference)
        joined = ", ".join(box.strip() for box in boxes)
        if _is_multi_valued(str(reference)):
            result = self.compare(joined, reference)
            return GradeResult(result.correct, result.reason, joined, f"{len(boxes)} boxes read as one list")
        if len(distinct) > MAX_GRADED_BOXES:
            return GradeResult(
                False,
                "wrong",
                joined,
                f"{len(distinct)} different boxed answers to a single-valued question (a hedge; more than "
                f"{MAX_GRADED_BOXES} are not graded)",
            )
        if all(self.compare(box, reference).correct for box in distinct):  # stops at the first wrong box
            return GradeResult(True, "correct", joined, f"{len(distinct)} boxes, all equal to the reference")
        return GradeResult(
            False,
            "wrong",
            joined,
            f"{len(distinct)} different boxed answers to a single-valued question (a hedge)",
        )

    def compare(self, answer: str, reference: str) -> GradeResult:
        """Compare an already extracted answer with `reference` (no box extraction).

        Literal equality (after stripping blanks and normalising thousands separators) is correct without a
        worker, whatever its length; otherwise answers longer than `max_answer_chars` are a parse failure.
        """
        reference = str(reference)
        if not answer.strip():
            return GradeResult(False, "parse_failure", answer, "empty answer")
        normal_answer, normal_reference = (
            normalize_thousands(answer.strip()),
            normalize_thousands(reference.strip()),
        )
        if normal_answer == normal_reference:
            return GradeResult(True, "correct", answer, "")
        if len(answer) > self.max_answer_chars:
            return GradeResult(
                False, "parse_failure", answer, f"answer longer than {self.max_answer_chars} characters"
            )
        base_mismatch = _base_subscript_mismatch(normal_answer, normal_reference)
        if base_mismatch:
            return GradeResult(False, "wrong", answer, base_mismatch)
        reply = self._request({"answer": normal_answer, "reference": normal_reference})
        reason = reply["reason"]
        return GradeResult(reason == "correct", reason, answer, reply.get("detail", ""))

    async def agrade(self, response: str, reference: str) -> GradeResult:
        """`grade` for asyncio code: waits on the grader's threads, never blocks the event loop."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor(), self.grade, response, reference
        )

    async def acompare(self, answer: str, reference: str) -> GradeResult:
        """`compare` for asyncio code."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor(), self.compare, answer, reference
        )

    def start(self) -> MathGrader:
        """Start every worker now, in parallel (otherwise they start on demand)."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            started = list(pool.map(lambda _: self._acquire(fresh_only=True), range(self.workers)))
        for item in started:
            if item is not None:
                self._release(item[0], alive=True, generation=item[1])
        return self

    def close(self) -> None:
        """Stop the workers (a later call starts new ones). Busy workers stop when their request ends."""
        with self._cond:
            self._generation += 1
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            threads, self._threads = self._threads, None
            self._cond.notify_all()
        for worker in idle:
            worker.kill()
        if threads is not None:
            threads.shutdown(wait=False)

    def __deepcopy__(self, memo: dict[int, object]) -> MathGrader:
        return self  # one pool of workers, shared by copies (it is thread-safe)

    def __enter__(self) -> MathGrader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pool -------------------------------------------------------------------------------------------
    def _request(self, payload: dict[str, str]) -> dict[str, str]:
        request = dict(payload, soft_timeout_s=max(0.05, self.timeout_s - 0.25))
        for attempt in range(2):
            worker, generation = self._acquire()
            started = time.perf_counter()
            try:
                reply = worker.request(request, self.timeout_s)
            except (BrokenPipeError, EOFError, OSError):
                # The worker died (e.g. killed by the OS); retry once on a fresh worker.
                self._release(worker, alive=False, generation=generation)
                if attempt == 0:
                    continue
                return {"reason": "parse_failure", "detail": "the grading worker died on this input"}
            elapsed = time.perf_counter() - started
            self._release(worker, alive=reply is not None, generation=generation)
            if reply is None:
                reply = {"reason": "timeout", "detail": f"killed after {self.timeout_s:g} s"}
            self._account(elapsed, timed_out=reply["reason"] == "timeout")
            return reply
        raise AssertionError("unreachable")

    def _account(self, seconds: float, timed_out: bool) -> None:
        with self._cond:
            self.stats.requests += 1
            self.stats.timeouts += int(timed_out)
            self.stats.busy_s += seconds
        charge_grading_clock(seconds, timed_out)

    def _acquire(self, fresh_only: bool = False) -> tuple[_Worker, int] | None:
        """An idle worker, or a new one when fewer than `workers` exist; waits otherwise. With `fresh_only`
        (used by `start`), None instead of waiting when the pool is full."""
        with self._cond:
            while True:
                if self._idle and not fresh_only:
                    return self._idle.pop(), self._generation
                if self._count < self.workers:
                    self._count += 1
                    break
                if fresh_only:
                    return None
                self._cond.wait()
        try:
            worker = _Worker(self.memory_limit_mb)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise
        with self._cond:
            self.stats.worker_starts += 1
            return worker, self._generation

    def _release(self, worker: _Worker, alive: bool, generation: int) -> None:
        with self._cond:
            keep = alive and generation == self._generation and worker.alive()
            if keep:
                self._idle.append(worker)
            else:
                self._count -= 1
            self._cond.notify()
        if not keep:
            worker.kill()

    def _executor(self) -> ThreadPoolExecutor:
        with self._cond:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=2 * self.workers, thread_name_prefix="grader")
            return self._threads


_default_grader: MathGrader | None = None
_default_pid = -1
_default_lock = threading.Lock()


def default_grader() -> MathGrader:
    """The process-wide grader pool used when none is given (created on first use, closed at exit; a forked
    child gets its own)."""
    global _default_grader, _default_pid
    with _default_lock:
        if _default_grader is None or _default_pid != os.getpid():
            _default_grader, _default_pid = MathGrader(), os.getpid()
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
