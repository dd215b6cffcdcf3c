"""Environments in processes of their own: each episode's environment (its parsing, tool calls, grading and
observation formatting) lives in one of a few worker processes for the whole episode, off the engine's process.

    with EnvProcessPool(2, sandbox="docker", sandbox_pool_size=8) as pool:
        trajectories = collect(engine, tasks, config, env_factory=pool.make)

Each process imports the environments (and `imports`, for your own), starts its own sandbox with its share of
the interpreters, and serves many episodes at once: every call runs on a thread of its own there, so a step
waiting on a sandbox lease never holds another episode's step. `pool.make(task)` picks the process with the
fewest live environments and returns a `RemoteEnv` that the agent loop uses like the environment itself.

What can go wrong, and what happens:
* the environment raises: the error travels back with its type, text and traceback; the agent loop treats it
  as it treats the same error in-process (a `SandboxError` stays one: `tool_failure`; anything else from a
  step is the policy's: `policy_error`);
* its process dies (a crash in native code, the OOM killer, SIGKILL): every episode whose environment lived
  there fails at once with `EnvProcessDied` (`env_error`, the infrastructure's; the engine's process and the
  episodes in other processes go on), the pool starts a replacement for the next episodes, and the dead
  process's sandbox containers go with their owner (see sandbox/docker_backend.py);
* a result (or task) that cannot be pickled: that episode fails (`UnsendableResult`, `env_error`) with a clear
  error; the stream to the process stays whole;
* the parent dies: each process sees its pipe close, closes its environments and sandbox, and exits.

Processes are started with "spawn" (never forked from a process that runs an inference engine's threads).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stare_agents.rollout.agent_loop import EnvHostError

logger = logging.getLogger("stare_agents.rollout")

# the environment attributes the agent loop and the trainer read (`env.unwrapped.<name>`), copied to RemoteEnv
ENV_ATTRIBUTES = ("max_response_tokens", "tool_format", "languages", "observation_format", "max_turns")


class EnvProcessError(EnvHostError):
    """The environment process failed the episode, not the policy (`env_error`, the infrastructure's)."""


class EnvProcessDied(EnvProcessError):
    """The process that hosted this episode's environment died; the episode cannot go on."""


class UnsendableResult(EnvProcessError):
    """The environment returned what cannot be pickled back to the agent loop (the environment's fault)."""


class RemoteEnvError(RuntimeError):
    """An environment raised in its process: the original type's name, its text and the remote traceback."""

    def __init__(self, type_name: str, text: str, remote_traceback: str = "") -> None:
        super().__init__(f"{type_name}: {text}")
        self.type_name = type_name
        self.remote_traceback = remote_traceback


@dataclass(frozen=True)
class EnvPoolSpec:
    """What each environment process builds: its sandbox and the modules it imports first."""

    sandbox: str = "docker"
    sandbox_pool_size: int = 8
    sandbox_kwargs: dict[str, Any] = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()  # the CPUs the process (and its sandbox's interpreters) may run on; (): any


def pin_process(cpus: Iterable[int]) -> set[int]:
    """Restrict every thread of this process, and the threads and processes it starts later, to `cpus`
    (Linux). A CPU this process may not use (offline, outside its cgroup's cpuset) is a ValueError."""
    wanted = {int(cpu) for cpu in cpus}
    if not wanted:
        raise ValueError("pin_process needs at least one CPU")
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except OSError as error:
            raise ValueError(f"cannot run on CPUs {sorted(wanted)}: {error}") from error
    return wanted


def cpu_list(cpus: Iterable[int]) -> str:
    """CPUs as docker's --cpuset-cpus writes them: "1", "0,2,3"."""
    return ",".join(str(cpu) for cpu in sorted(set(cpus)))


def _pinned_sandbox_kwargs(spec: EnvPoolSpec) -> dict[str, Any]:
    """The sandbox's kwargs, with its interpreters kept on the process's CPUs where the backend runs them
    elsewhere (Docker's containers; unless the kwargs name CPUs). A local sandbox's interpreters are the
    process's children and run on its CPUs already."""
    if not spec.cpus:
        return dict(spec.sandbox_kwargs)
    from stare_agents.sandbox import backend_class

    return backend_class(spec.sandbox).with_cpus(spec.sandbox_kwargs, cpu_list(spec.cpus))


def start_sandbox(backend: str, pool_size: int, kwargs: dict[str, Any]) -> Any:
    """A started sandbox for a rollout worker or an environment process. "none": a NoSandbox (a tool call is a
    tool error and never reaches a shared sandbox). Episodes beyond the pool wait for an interpreter as long as
    it takes (the batch moves on as episodes end); a finite lease timeout would turn a busy pool into tool
    failures."""
    from stare_agents.sandbox import make_sandbox

    options = {"lease_timeout_s": None, **kwargs}  # ("none" takes and ignores any)
    sandbox = make_sandbox(backend, pool_size=pool_size, **options)  # type: ignore[arg-type]
    sandbox.start()
    return sandbox


# -- the child ---------------------------------------------------------------------------------------------------
def _serve(conn: Any, spec: EnvPoolSpec) -> None:
    """An environment process: build the sandbox, then serve (call_id, op, handle, payload) messages until the
    parent says stop (None) or goes away (the pipe closes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes the pool
    envs: dict[int, Any] = {}
    send_lock = threading.Lock()
    sandbox = None

    def send(message: Any) -> None:
        with send_lock:
            conn.send(message)  # pickled whole before a byte is written: a failure leaves the stream whole

    try:
        # first, so every thread started below (and a local sandbox's interpreters) inherits it
        if spec.cpus:
            pin_process(spec.cpus)
        for module in spec.imports:
            importlib.import_module(module)
        import stare_agents.envs  # noqa: F401  (registers the stare_agents/* ids)
        from stare_agents.rollout.agent_loop import make_env

        sandbox = start_sandbox(spec.sandbox, spec.sandbox_pool_size, _pinned_sandbox_kwargs(spec))
    except BaseException as error:
        with contextlib.suppress(Exception):
            send(("failed", f"{type(error).__name__}: {error}"))
        if sandbox is not None:
            with contextlib.suppress(Exception):
                sandbox.close()
        return
    send(("ready", os.getpid()))

    def handle(call_id: int, op: str, key: int, payload: Any) -> None:
        try:
            if op == "make":
                env = make_env(payload, sandbox)
                envs[key] = env
                result: Any = {
                    name: getattr(env.unwrapped, name)
                    for name in ENV_ATTRIBUTES
                    if isinstance(getattr(env.unwrapped, name, None), (int, str, tuple, list))
                }
            elif op == "reset":
                result = envs[key].reset(**payload)
            elif op == "step":
                result = envs[key].step(payload)
            elif op == "close":
                env = envs.pop(key, None)
                result = env.close() if env is not None else None
            else:
                raise ValueError(f"unknown operation {op!r}")
            reply = (call_id, "ok", result)
        except BaseException as error:
            from stare_agents.sandbox import SandboxError

            kind = "sandbox" if isinstance(error, SandboxError) else "raised"
            reply = (call_id, kind, (type(error).__name__, str(error)[:4000], traceback.format_exc()[-4000:]))
        try:
            send(reply)
        except Exception as error:  # the result does not pickle (or is too large): say so instead
            text = (
                f"the environment's {op} returned what cannot be sent back: {type(error).__name__}: {error}"
            )
            with contextlib.suppress(Exception):
                send((call_id, "unsendable", ("TypeError", text[:4000], "")))

    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if message is None:
                break
            threading.Thread(target=handle, args=message, daemon=True, name=f"env-{message[1]}").start()
    finally:
        for env in list(envs.values()):
            with contextlib.suppress(Exception):
                env.close()
        with contextlib.suppress(Exception):
            sandbox.close()


# -- the parent --------------------------------------------------------------------------------------------------
class _EnvProcess:
    """One environment process and the calls in flight to it."""

    def __init__(self, context: Any, spec: EnvPoolSpec, index: int) -> None:
        self.index = index
        self._conn, child = context.Pipe(duplex=True)
        self.process = context.Process(
            target=_serve, args=(child, spec), name=f"stare-env-{index}", daemon=True
        )
        self.process.start()
        child.close()
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._dead: str | None = None
        self.live_envs = 0
        self.ready = concurrent.futures.Future()
        self._reader = threading.Thread(target=self._read, name=f"env-pool-reader-{index}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self._dead is None and self.process.is_alive()

    def call(self, op: str, key: int, payload: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._dead is not None:
                future.set_exception(EnvProcessDied(self._dead))
                return future
            call_id = next(self._ids)
            self._calls[call_id] = future
            try:
                self._conn.send((call_id, op, key, payload))
            except Exception as error:
                del self._calls[call_id]
                if isinstance(error, (OSError, EOFError)):
                    future.set_exception(EnvProcessDied(f"{self._describe()} cannot be reached: {error}"))
                else:  # the payload does not pickle: this call only
                    future.set_exception(
                        UnsendableResult(f"cannot send {op} to the environment process: {error}")
                    )
        return future

    def _read(self) -> None:
        try:
            first = self._conn.recv()
            if first[0] != "ready":
                raise RuntimeError(f"the environment process could not start: {first[1]}")
            self.ready.set_result(first[1])
            while True:
                call_id, kind, value = self._conn.recv()
                with self._lock:
                    future = self._calls.pop(call_id, None)
                if future is None or future.done():
                    continue
                if kind == "ok":
                    future.set_result(value)
                elif kind == "sandbox":
                    from stare_agents.sandbox import SandboxError

                    future.set_exception(SandboxError(f"{value[0]}: {value[1]}"))
                elif kind == "unsendable":
                    future.set_exception(UnsendableResult(value[1]))
                else:
                    future.set_exception(RemoteEnvError(*value))
        except BaseException as error:  # the pipe closed: the process died (or was stopped)
            self._die(error)

    def _describe(self) -> str:
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
        else:
            how = f"exited with code {code}"
        return f"the environment process {self.index} (pid {self.pid}) {how}"

    def _die(self, error: BaseException) -> None:
        reason = f"{self._describe()}; the episodes whose environments lived there cannot go on"
        if not isinstance(error, (EOFError, OSError)):
            reason = f"{reason} ({type(error).__name__}: {error})"
        with self._lock:
            self._dead = reason
            calls, self._calls = self._calls, {}
        if not self.ready.done():
            self.ready.set_exception(EnvProcessDied(reason))
        for future in calls.values():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(EnvProcessDied(reason))

    def stop(self, timeout_s: float = 30.0) -> None:
        with contextlib.suppress(Exception), self._lock:
            self._conn.send(None)
        self.process.join(timeout=timeout_s)  # it closes its environments and its sandbox first
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5.0)
        with contextlib.suppress(Exception):
            self._conn.close()
        self._reader.join(timeout=5.0)


class RemoteEnv:
    """An environment living in an environment process, used like the environment itself (`reset`, `step`,
    `close`, and the attributes in ENV_ATTRIBUTES on `unwrapped`). Calls block until the process answers."""

    def __init__(
        self, pool: EnvProcessPool, process: _EnvProcess, key: int, attributes: dict[str, Any]
    ) -> None:
        self._pool = pool
        self._process = process
        self._key = key
        self._closed = False
        for name, value in attributes.items():
            setattr(self, name, tuple(value) if isinstance(value, list) else value)

    @property
    def unwrapped(self) -> RemoteEnv:
        return self

    @property
    def pid(self) -> int | None:
        """The process the environment lives in."""
        return self._process.pid

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self._process.call("reset", self._key, {"seed": seed, "options": options}).result()

    def step(self, action: Any) -> Any:
        return self._process.call("step", self._key, action).result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool._released(self._process)
        if self._process.alive:
            with contextlib.suppress(EnvProcessDied):
                self._process.call("close", self._key, None).result()


class EnvProcessPool:
    """`processes` environment processes (see the module docstring).

    Args:
        processes: how many (>= 1). sandbox / sandbox_pool_size / sandbox_kwargs: each process's sandbox, with
            `sandbox_pool_size` interpreters split between the processes (at least one each).
        imports: modules each process imports first (to register your own environments).
        start_timeout_s: how long a process may take to import the environments and start its sandbox.
        max_restarts: replacements of dead processes allowed over the pool's life; past it `make` raises
            (an environment that kills its process on every episode must not restart processes forever).
        cpus: the CPUs the processes run on, and their Docker containers (`DockerLimits.cpuset`, unless
            sandbox_kwargs sets one); () or None: wherever the parent may run. With the engine pinned to the
            other CPUs, the model's code and the environments never take the engine's cores.
    """

    def __init__(
        self,
        processes: int,
        *,
        sandbox: str = "docker",
        sandbox_pool_size: int = 8,
        sandbox_kwargs: dict[str, Any] | None = None,
        imports: Sequence[str] = (),
        start_timeout_s: float = 120.0,
        max_restarts: int = 100,
        cpus: Iterable[int] | None = None,
    ) -> None:
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be an int >= 1, got {processes!r}")
        cpus = tuple(sorted(set(cpus or ())))
        if any(isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0 for cpu in cpus):
            raise ValueError(f"cpus must be CPU numbers (ints >= 0), got {cpus!r}")
        self.spec = EnvPoolSpec(
            sandbox=sandbox,
            sandbox_pool_size=max(1, -(-sandbox_pool_size // processes)),
            sandbox_kwargs=dict(sandbox_kwargs or {}),
            imports=tuple(imports),
            cpus=cpus,
        )
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts
        self.restarts = 0
        self._context = multiprocessing.get_context("spawn")
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        started = time.perf_counter()
        self._processes = [_EnvProcess(self._context, self.spec, i) for i in range(processes)]
        try:
            for process in self._processes:
                process.ready.result(timeout=start_timeout_s)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.perf_counter() - started

    @property
    def pids(self) -> list[int | None]:
        return [process.pid for process in self._processes]

    def make(self, task: Any, sandbox: Any = None) -> RemoteEnv:
        """A new environment for `task` (a RolloutTask) in the least-loaded process (`sandbox` is ignored: each
        process has its own). The `env_factory` of `collect`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the environment pool is closed")
            for i, process in enumerate(self._processes):
                if not process.alive:
                    self._replace(i)
            process = min(self._processes, key=lambda p: p.live_envs)
            process.live_envs += 1
            key = next(self._keys)
        try:
            process.ready.result(timeout=self.start_timeout_s)
            attributes = process.call("make", key, task).result()
        except BaseException:
            self._released(process)
            raise
        return RemoteEnv(self, process, key, attributes)

    def _replace(self, index: int) -> None:
        dead = self._processes[index]
        if self.restarts >= self.max_restarts:
            raise EnvProcessDied(
                f"environment processes died {self.restarts} times (max_restarts={self.max_restarts}); "
                f"the last: {dead._dead or 'gone'}"
            )
        logger.warning("replacing environment process %d (pid %s): %s", index, dead.pid, dead._dead or "gone")
        self.restarts += 1
        with contextlib.suppress(Exception):
            dead.stop(timeout_s=1.0)
        self._processes[index] = _EnvProcess(self._context, self.spec, index)

    def _released(self, process: _EnvProcess) -> None:
        with self._lock:
            process.live_envs = max(0, process.live_envs - 1)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for process in self._processes:
            process.stop()

    def __enter__(self) -> EnvProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
