"""Sandboxed Python for model-written code: stateful sessions leased from a pool of warm interpreters.

    from stare_agents.sandbox import make_sandbox
    with make_sandbox("docker", pool_size=4) as sandbox:
        with sandbox.session() as s:              # session(stateless=True): SimpleTIR-style calls
            s.run("x = 20", timeout_s=5)
            r = s.run("print(x + 22)")            # r.stdout == "42\\n", r.status == "ok"

`DockerSandbox` is the security boundary (no network, memory/pids/CPU limits, read-only root, non-root,
no capabilities, a syscall filter on top of the engine's seccomp profile; `runtime="runsc"` adds gVisor's
user-space kernel); `LocalSandbox` has the same API for development and is not: it runs only when asked
for by name with an acknowledgement (`allow_host_execution=True` from Python, or STARE_ALLOW_LOCAL_SANDBOX=1;
never a config file's sandbox_kwargs, see `check_config_kwargs`), never as root, with a scrubbed
environment and writes confined to its own folder. Between sessions a container keeps nothing of the
previous one: every process is killed, IPC objects removed, scratch folders wiped, and that is checked
before the container is lent again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal, get_args

from stare_agents.sandbox.backend import SandboxBackend
from stare_agents.sandbox.docker_backend import DEFAULT_IMAGE, DockerLimits, DockerSandbox, docker_status
from stare_agents.sandbox.errors import SandboxError
from stare_agents.sandbox.local import ALLOW_LOCAL_ENV, LocalSandbox, NoSandbox
from stare_agents.sandbox.pool import PooledSandbox
from stare_agents.sandbox.result import STATUSES, ExecutionResult
from stare_agents.sandbox.session import Session

__all__ = [
    "ALLOW_LOCAL_ENV",
    "BACKENDS",
    "BACKEND_CLASSES",
    "DEFAULT_BACKEND",
    "DEFAULT_IMAGE",
    "STATUSES",
    "DockerLimits",
    "DockerSandbox",
    "ExecutionResult",
    "LocalSandbox",
    "NoSandbox",
    "PooledSandbox",
    "SandboxBackend",
    "SandboxError",
    "Session",
    "backend_class",
    "check_backend",
    "check_config_kwargs",
    "docker_status",
    "make_sandbox",
]

logger = logging.getLogger("stare_agents.sandbox")

Backend = Literal["docker", "local", "none", "auto"]
BACKENDS: tuple[str, ...] = get_args(Backend)
# every backend by name; callers ask its class what it can do (SandboxBackend), never its name. "auto" is an
# older name of "docker": it never falls back to the host
BACKEND_CLASSES: dict[str, type[SandboxBackend]] = {
    "docker": DockerSandbox,
    "local": LocalSandbox,
    "none": NoSandbox,
    "auto": DockerSandbox,
}
DEFAULT_BACKEND: Backend = "docker"  # the security boundary: what runs code when nobody chose a backend
# what only the person starting a run decides, never a config file's sandbox_kwargs: why, and what to do instead
NOT_FROM_CONFIG = {
    "allow_host_execution": (
        "a config file cannot acknowledge that model-written code runs on this host; whoever starts the run "
        f"does, with {ALLOW_LOCAL_ENV}=1 in its environment (or use the Docker sandbox)"
    ),
    "allow_unlimited_memory": (
        "a config file cannot lift the sandbox's memory limit; whoever starts the run does, with "
        "STARE_SANDBOX_UNLIMITED_MEMORY=1 in its environment (or set memory_mb)"
    ),
    "python": "the local sandbox starts this process's own interpreter; a config cannot choose what the host runs",
    "isolate_network": (
        "the local sandbox's code always gets a network namespace of its own (loopback only), or the sandbox "
        "does not start; nothing turns that off"
    ),
}


def check_config_kwargs(backend: str, kwargs: Mapping[str, Any], where: str = "sandbox_kwargs") -> None:
    """Refuse what a run's config may not pass to its sandbox (a ValueError naming `where`.key, the value and
    what is allowed): a key outside the backend's `config_kwargs`, and above all the acknowledgement of host
    execution, the executable the host starts and the network switch (NOT_FROM_CONFIG); then the backend's
    own check of the values (Docker's `limits` are built, so a limit out of its range is refused when the
    config loads)."""
    cls = backend_class(backend)
    allowed = cls.config_kwargs
    for key, value in kwargs.items():
        if key in NOT_FROM_CONFIG:
            raise ValueError(f"{where}.{key}={value!r} is not allowed: {NOT_FROM_CONFIG[key]}")
        if key not in allowed:
            raise ValueError(
                f"{where}.{key}={value!r}: not a setting of the {backend!r} sandbox a config may set; "
                f"allowed: {', '.join(sorted(allowed)) or 'none'}"
            )
    cls.check_settings(kwargs, where)


def backend_class(backend: str) -> type[SandboxBackend]:
    """The class of the backend named `backend`, to ask what it can do; a ValueError naming the others."""
    try:
        return BACKEND_CLASSES[backend]
    except (KeyError, TypeError):
        raise ValueError(f"sandbox backend must be one of {BACKENDS}, got {backend!r}") from None


def check_backend(backend: str, **kwargs: Any) -> None:
    """Fail before anything expensive starts when `backend` cannot be used as asked: a SandboxError that says
    what is missing and what to do (Docker's engine, image or runtime; the local backend's acknowledgement,
    Landlock, its namespaces, or a Docker socket its code could open), a ValueError for an unknown name. The
    local backend starts one interpreter and runs one call in it, so whatever keeps it from running shows
    here. kwargs: those make_sandbox would get (image, runtime, allow_host_execution)."""
    backend_class(backend).check(**kwargs)


def make_sandbox(backend: Backend = DEFAULT_BACKEND, *, pool_size: int = 4, **kwargs: Any) -> Any:
    """A sandbox (not started yet; use it as a context manager or call .start()).

    backend: "docker" (DockerSandbox; a SandboxError that says what is missing if no engine, image or
    runtime), "local" (LocalSandbox: model-written code on this host, refused unless acknowledged with
    `allow_host_execution=True` or STARE_ALLOW_LOCAL_SANDBOX=1), "none" (NoSandbox: every tool call is a
    tool error, nothing runs) or "auto", an older name of "docker". The backend asked for, or an error that
    says what it lacks: never another backend in its place.
    kwargs go to the chosen class (e.g. default_timeout_s, max_output_bytes, lease_timeout_s;
    image/limits/runtime for Docker, e.g. runtime="runsc" for gVisor; memory_mb for local); keys the chosen
    class does not take are an error ("none" takes and ignores any).
    """
    return backend_class(backend).create(pool_size, **kwargs)
