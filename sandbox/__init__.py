"""Sandboxed Python for model-written code: stateful sessions leased from a pool of warm interpreters.

    from stare_agents.sandbox import make_sandbox
    with make_sandbox("auto", pool_size=4) as sandbox:
        with sandbox.session() as s:              # session(stateless=True): SimpleTIR-style calls
            s.run("x = 20", timeout_s=5)
            r = s.run("print(x + 22)")            # r.stdout == "42\\n", r.status == "ok"

    async with sandbox.asession() as s:           # asyncio
        r = await s.arun("print(1)")

`DockerSandbox` is the security boundary (no network, memory/pids/CPU limits, read-only root, non-root,
no capabilities, a syscall filter on top of the engine's seccomp profile; `runtime="runsc"` adds gVisor's
user-space kernel); `LocalSandbox` has the same API for development and is not. Between sessions a
container keeps nothing of the previous one: every process is killed, IPC objects removed, scratch
folders wiped, and that is checked before the container is lent again.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from stare_agents.sandbox.docker_backend import DEFAULT_IMAGE, DockerLimits, DockerSandbox, docker_status
from stare_agents.sandbox.local import LocalSandbox
from stare_agents.sandbox.pool import AsyncSession, PooledSandbox, SandboxError, Session
from stare_agents.sandbox.result import STATUSES, ExecutionResult

__all__ = [
    "DEFAULT_IMAGE",
    "STATUSES",
    "AsyncSession",
    "DockerLimits",
    "DockerSandbox",
    "ExecutionResult",
    "LocalSandbox",
    "PooledSandbox",
    "SandboxError",
    "Session",
    "docker_status",
    "make_sandbox",
]

logger = logging.getLogger("stare_agents.sandbox")

Backend = Literal["auto", "docker", "local"]
_fallbacks_reported: set[str] = set()


def make_sandbox(backend: Backend = "auto", *, pool_size: int = 4, **kwargs: Any) -> PooledSandbox:
    """A sandbox (not started yet; use it as a context manager or call .start()).

    backend: "docker" (DockerSandbox; fails if no engine or image), "local" (LocalSandbox), or "auto":
    Docker when an engine answers and the image (and the runtime, if one is given) exists, otherwise
    LocalSandbox with a logged warning that says why. kwargs go to the chosen class (e.g. default_timeout_s,
    max_output_bytes, lease_timeout_s; image/limits/runtime for Docker, e.g. runtime="runsc" for gVisor;
    memory_mb for local); keys the chosen class does not take are an error.
    """
    if backend == "docker":
        return DockerSandbox(pool_size, **kwargs)
    if backend == "local":
        return LocalSandbox(pool_size, **kwargs)
    if backend != "auto":
        raise ValueError(f"backend must be 'auto', 'docker' or 'local', got {backend!r}")
    image = kwargs.get("image", DEFAULT_IMAGE)
    available, reason = docker_status(image, kwargs.get("runtime"))
    if available:
        return DockerSandbox(pool_size, **kwargs)
    if reason not in _fallbacks_reported:  # loudly, once per reason and process
        _fallbacks_reported.add(reason)
        logger.warning("sandbox backend 'auto': using LocalSandbox, NOT Docker, because %s", reason)
    local_kwargs = {k: v for k, v in kwargs.items() if k not in ("image", "limits", "grace_s", "runtime")}
    return LocalSandbox(pool_size, **local_kwargs)
