"""What every sandbox backend answers about itself, so that nothing outside the backend compares its name
("docker") to decide what it can do, or quietly puts another backend in its place.

A backend is a class with these attributes and class methods (DockerSandbox, LocalSandbox, NoSandbox), listed
by name in `stare_agents.sandbox.BACKEND_CLASSES`. A new backend is one class in sandbox/ and one line in
that table (its name also in the `Backend` word set beside it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# the interpreter program that the backends which run code start (in a container, or as a local process)
RUNNER_PATH = Path(__file__).with_name("runner.py")


class SandboxBackend:
    """The questions a caller asks a backend before it uses one, with the answers of a plain backend.

    runs_code: model-written code runs in it (NoSandbox: nothing runs; every tool call is a tool error).
    pins_cpus: its interpreters can be kept on given CPUs by its own settings (`with_cpus`). A backend
        without it needs none: its interpreters are this process's children and run where it may run.
    lowers_priority: it can run its interpreters at a low CPU weight (`with_low_priority`).
    config_kwargs: the settings a run's config may give it (rollout.sandbox_kwargs).
    """

    runs_code: bool = True
    pins_cpus: bool = False
    lowers_priority: bool = False
    config_kwargs: frozenset[str] = frozenset()

    @classmethod
    def create(cls, pool_size: int, **kwargs: Any) -> Any:
        """A sandbox of this backend, not started yet (what `make_sandbox` returns); a SandboxError that says
        what is missing and what to do where the backend cannot run here."""
        return cls(pool_size, **kwargs)

    @classmethod
    def check(cls, **kwargs: Any) -> None:
        """Fail before anything expensive starts (a SandboxError with the remedy) where the backend cannot be
        used as `kwargs` (those `make_sandbox` would get) ask; nothing to check by default."""

    @classmethod
    def check_settings(cls, kwargs: dict[str, Any], where: str) -> None:
        """Refuse a value of `kwargs` (a run's `where`, e.g. rollout.sandbox_kwargs) that this backend cannot
        take, with a ValueError naming `where`.key; which keys may be given at all is `config_kwargs`."""

    @classmethod
    def with_cpus(cls, kwargs: dict[str, Any], cpus: str) -> dict[str, Any]:
        """`kwargs` with the interpreters kept on `cpus` ("1", "0,2,3"), unless they name CPUs themselves.
        Unchanged by default: the interpreters run where the process that starts them runs."""
        return dict(kwargs)

    @classmethod
    def with_low_priority(cls, kwargs: dict[str, Any], low: bool) -> dict[str, Any]:
        """`kwargs` with the interpreters' CPU priority (low or normal), unless they set it themselves.
        Unchanged by default (a backend without `lowers_priority`)."""
        return dict(kwargs)
