"""Tools an environment is given: the `Tool` protocol, function tools, and `PythonTool` (sandboxed Python).

Ownership is split three ways (DESIGN.md: one sandbox per process, injected):

* the **sandbox** (a pool of interpreters) belongs to whoever created it: the rollout worker that passes
  `sandbox=` to `gym.make`, or, when nobody passes one, this module's process-wide `shared_sandbox()`,
  created on first use and closed at exit. No environment or tool ever closes a sandbox;
* a **tool** (`PythonTool`) holds one episode's session in that sandbox: opened on its first call, closed by
  `end_episode()`. One tool serves one environment; many tools share one sandbox;
* the **environment** (`ToolEnv`) parses the policy's calls, runs them through its tools, formats and
  truncates the results and ends the tools' episodes with its own.

    sandbox = make_sandbox("docker", pool_size=8)          # one per worker process
    env = gym.make("stare_agents/MathTIR-v0", sandbox=sandbox)   # builds PythonTool(sandbox, ...) itself
    env = MathTIREnv(tools=[PythonTool(sandbox, timeout_s=2.0, stateless=True)])   # or configure the tool
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from stare_agents.envs.grading import _last_box
from stare_agents.sandbox.channel import check_limits
from stare_agents.sandbox.runner import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from stare_agents.sandbox import ExecutionResult, PooledSandbox, Session

logger = logging.getLogger("stare_agents.envs")

TOOL_STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "killed")


@dataclass(frozen=True)
class ToolOutput:
    """The result of one tool call.

    text: what the policy sees (the environment truncates it to its `max_obs_chars`).
    status: "ok", "error", "timeout" or "killed" (as the sandbox reports); counted in `info`.
    final_answer: a final answer the tool produced (`final_answer(x)` in `PythonTool(accept_tool_answer=True)`);
        when set, the environment ends the episode and grades it if the policy's own text has no answer.
    """

    text: str
    status: str = "ok"
    final_answer: str | None = None


@runtime_checkable
class ToolLike(Protocol):
    """What `ToolEnv` needs of a tool: a name, a schema for chat templates, a call, and an episode end."""

    name: str

    def schema(self) -> dict[str, Any]: ...

    def __call__(self, arguments: dict[str, Any]) -> ToolOutput: ...

    def end_episode(self) -> None: ...


def function_schema(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI/Hermes function schema, as `tokenizer.apply_chat_template(tools=...)` expects."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": dict(parameters)},
    }


@dataclass(frozen=True)
class Tool:
    """A stateless tool: a name, a description and JSON-schema parameters (for chat templates' `tools=`),
    and a function from the call's arguments to a `ToolOutput`. An exception the function raises becomes an
    error observation (the policy sees it), except `SandboxError` (infrastructure, not the policy's doing)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[[dict[str, Any]], ToolOutput]

    def schema(self) -> dict[str, Any]:
        return function_schema(self.name, self.description, self.parameters)

    def __call__(self, arguments: dict[str, Any]) -> ToolOutput:
        return self.fn(arguments)

    def end_episode(self) -> None:
        """Nothing to release: a function tool keeps no per-episode state."""


PYTHON_TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "Python source to run; print() what you need."}},
    "required": ["code"],
}

FINAL_ANSWER_PREAMBLE = 'def final_answer(result):\n    print(f"\\\\boxed{{{result}}}")\n\n'


class PythonTool:
    """The `python` tool: runs the policy's code in a sandbox session that lasts one episode.

    Args:
        sandbox: a `stare_agents.sandbox` sandbox (e.g. `make_sandbox("docker", pool_size=8)`), shared with
            other tools and never closed here. None: the process-wide `shared_sandbox()`.
        timeout_s: the CPU seconds one call's code may use (its interpreter and every process it starts), so
            that a busy machine never fails an honest program; a timeout is an observation, never an exception.
        wall_timeout_s: the wall-clock cap of one call, for code that sleeps or waits (>= timeout_s; None:
            `runner.WALL_FACTOR` times timeout_s).
        stateless: each call runs in a fresh interpreter leased for that call only (SimpleTIR), instead of
            the episode's own interpreter, which a stateful tool holds from its first call to the episode's
            end. Stateless episodes need no interpreter while the model generates, so a small pool serves
            many episodes in flight; stateful ones need `pool_size` >= the episodes in flight or they wait.
        error_lines: keep only the last N lines of a traceback (None: all of it).
        accept_tool_answer: define `final_answer(x)` in the interpreter (it prints `\\boxed{x}`); a call whose
            output holds a box reports it as `ToolOutput.final_answer`, which ends the episode.

    A tool holds one episode's session, so it serves one environment at a time (`ToolEnv` refuses a tool
    another environment already holds); a deep copy shares the sandbox and starts without a session.
    Calls never raise for what the code does; `SandboxError` (no interpreter left, sandbox closed) does.
    """

    name = "python"
    description = "Run Python code in a sandboxed interpreter and return what it prints."
    parameters: Mapping[str, Any] = PYTHON_TOOL_PARAMETERS

    def __init__(
        self,
        sandbox: PooledSandbox | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        wall_timeout_s: float | None = None,
        stateless: bool = False,
        error_lines: int | None = None,
        accept_tool_answer: bool = False,
    ) -> None:
        self.timeout_s, self.wall_timeout_s = check_limits(timeout_s, wall_timeout_s)
        if error_lines is not None and error_lines < 1:
            raise ValueError(f"error_lines must be >= 1 or None, got {error_lines!r}")
        self._sandbox = sandbox
        self.stateless = stateless
        self.error_lines = error_lines
        self.accept_tool_answer = accept_tool_answer
        self._session: Session | None = None
        self._lock = threading.Lock()
        self.bound = False  # set by the ToolEnv that uses this tool

    @property
    def sandbox(self) -> PooledSandbox:
        """The injected sandbox, or the process-wide shared one (created on first use)."""
        return self._sandbox if self._sandbox is not None else shared_sandbox()

    def schema(self) -> dict[str, Any]:
        return function_schema(self.name, self.description, self.parameters)

    def __call__(self, arguments: dict[str, Any]) -> ToolOutput:
        """Run `arguments["code"]` in the episode's session (opened on the first call) and format the result."""
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolOutput('Error: the python tool needs a string argument "code"', "error")
        if not getattr(self.sandbox, "runs_code", True):  # NoSandbox: tool execution is off
            return ToolOutput(self.sandbox.message, "error")
        if self.accept_tool_answer:
            code = FINAL_ANSWER_PREAMBLE + code
        if self.stateless:  # nothing to keep between calls: lease an interpreter for this call only
            with self._open_session() as session:
                result = session.run(code, timeout_s=self.timeout_s, wall_timeout_s=self.wall_timeout_s)
        else:
            with self._lock:
                if self._session is None:
                    self._session = self._open_session()
                result = self._session.run(code, timeout_s=self.timeout_s, wall_timeout_s=self.wall_timeout_s)
        final_answer = _last_box(result.stdout)[0] if self.accept_tool_answer else None
        return ToolOutput(self.format_result(result), result.status, final_answer)

    def _open_session(self) -> Session:
        from stare_agents.sandbox import SandboxError

        sandbox = self.sandbox
        session = sandbox.session(stateless=self.stateless)
        try:
            session.__enter__()
        except SandboxError as error:
            raise SandboxError(
                f"{error}. The python tool holds one interpreter per open episode and "
                f"{type(sandbox).__name__}(pool_size={sandbox.pool_size}) has none free: end episodes "
                "(reset/close), or pass sandbox=make_sandbox(..., pool_size=N) sized to the episodes in flight"
            ) from error
        return session

    def format_result(self, result: ExecutionResult) -> str:
        """The observation text for a sandbox result: stdout, then the traceback (or its last `error_lines`
        lines), and a note on timeouts and kills that left no traceback."""
        parts = [result.stdout.rstrip("\n")] if result.stdout else []
        stderr = result.stderr.rstrip("\n")
        if stderr and self.error_lines is not None:
            stderr = "\n".join(stderr.splitlines()[-self.error_lines :])
        if stderr:
            parts.append(stderr)
        if result.status == "timeout" and not stderr:
            parts.append(
                f"TimeoutError: the code used more than {self.timeout_s:g} s of CPU time or ran longer than "
                f"{self.wall_timeout_s:g} s and was stopped."
            )
        elif result.status == "killed" and not stderr:
            parts.append("Error: the interpreter was killed (out of memory or crashed).")
        return "\n".join(parts)

    def end_episode(self) -> None:
        """Close the episode's session (its interpreter is reset and lent again); the sandbox stays up."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception:
                logger.exception("closing the python tool's sandbox session failed")

    def close(self) -> None:
        self.end_episode()

    def __deepcopy__(self, memo: dict[int, Any]) -> PythonTool:
        clone = PythonTool(
            self._sandbox,
            timeout_s=self.timeout_s,
            wall_timeout_s=self.wall_timeout_s,
            stateless=self.stateless,
            error_lines=self.error_lines,
            accept_tool_answer=self.accept_tool_answer,
        )
        memo[id(self)] = clone
        return clone

    def __repr__(self) -> str:
        where = type(self._sandbox).__name__ if self._sandbox is not None else "shared sandbox"
        return (
            f"PythonTool({where}, timeout_s={self.timeout_s:g}, wall_timeout_s={self.wall_timeout_s:g}, "
            f"stateless={self.stateless}, "
            f"error_lines={self.error_lines}, accept_tool_answer={self.accept_tool_answer})"
        )


# -- the process-wide sandbox ------------------------------------------------------------------------------------
SHARED_POOL_SIZE = 4
SHARED_LEASE_TIMEOUT_S = 30.0
_shared: PooledSandbox | None = None
_shared_pid = -1
_shared_lock = threading.Lock()


def shared_sandbox() -> PooledSandbox:
    """The sandbox of every tool built without one in this process: `make_sandbox("docker",
    pool_size=SHARED_POOL_SIZE, lease_timeout_s=SHARED_LEASE_TIMEOUT_S)` (a SandboxError that says what is
    missing where Docker is not ready: model-written code never falls back to the host), created on first use
    and closed at exit. A forked child gets its own.

    Each episode with a tool call holds one interpreter until it ends; an episode that finds none free within
    the lease timeout fails its step with a `SandboxError` that says so. A rollout worker creates its own
    sandbox, sized to the episodes it keeps in flight, and passes it as `sandbox=`.
    """
    global _shared, _shared_pid
    with _shared_lock:
        if _shared is None or _shared_pid != os.getpid():
            from stare_agents.sandbox import make_sandbox

            _shared = make_sandbox(
                "docker", pool_size=SHARED_POOL_SIZE, lease_timeout_s=SHARED_LEASE_TIMEOUT_S
            )
            _shared_pid = os.getpid()
            atexit.register(_close_shared, _shared)
        return _shared


def _close_shared(sandbox: PooledSandbox) -> None:
    with contextlib.suppress(Exception):
        sandbox.close()
