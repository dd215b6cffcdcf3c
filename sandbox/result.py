"""The result of one sandboxed call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "error", "timeout", "killed"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "killed")


@dataclass(frozen=True)
class ExecutionResult:
    """What one `Session.run` call produced.

    status: "ok" (the code ran to the end), "error" (it raised; the traceback is in stderr), "timeout" (it used
    its CPU time or ran to its wall-clock cap and was interrupted) or "killed" (the interpreter died: out of memory, a segfault,
    os._exit; the session continues in a fresh interpreter and stderr says so).
    stdout / stderr: decoded as UTF-8 (invalid bytes become U+FFFD), each capped with its head and tail kept
    around a "[N bytes of output truncated]" marker; `truncated` says whether that happened.
    duration_s: wall time of the call as the caller saw it.
    cpu_s: CPU seconds the code used (its interpreter and every process it started), as the sandbox measured
        them; what its `timeout_s` limits (its wall time is capped by `wall_timeout_s` instead).
    """

    stdout: str
    stderr: str
    status: Status
    truncated: bool = False
    duration_s: float = 0.0
    cpu_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def output(self) -> str:
        """stdout followed by stderr: what a tool observation usually shows the model."""
        if self.stdout and self.stderr and not self.stdout.endswith("\n"):
            return self.stdout + "\n" + self.stderr
        return self.stdout + self.stderr
