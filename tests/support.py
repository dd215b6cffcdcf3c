"""Helpers shared by the test suite.

`require(...)` is how a test that needs a real component (Docker, vLLM, Ray, the shared data folder)
declares it. Off CI the test is skipped with a message that says what to install; with CI=true it
fails, because in CI a skipped real-component test would hide a broken install.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def require(available: bool, what: str, hint: str = "", *, ci_required: bool = True) -> None:
    """Skip (locally) or fail (CI=true) when a real component the test needs is missing."""
    if available:
        return
    message = f"{what} is not available" + (f": {hint}" if hint else "")
    if IN_CI and ci_required:
        pytest.fail(f"{message} (CI=true: real-component tests must run, not skip)")
    pytest.skip(message)


def shared_data(relative: str) -> Path:
    """Path inside ../shared/data, skipping with a clear message when the folder is absent.

    The project never requires that folder, so this skips even in CI.
    """
    path = SHARED_DATA / relative
    require(
        path.exists(),
        f"shared data file {path}",
        "the benchmark/training data folder ../shared/data is optional; tests that read it skip without it",
        ci_required=False,
    )
    return path


def docker_sandbox(pool_size: int):
    """A DockerSandbox (started by `with`), or a skip (locally) / failure (CI=true) when no engine or image is there.

    Use it as a context manager: `with docker_sandbox(4) as sandbox: ...`."""
    from stare_agents.sandbox import DockerSandbox, docker_status

    available, reason = docker_status()
    require(available, "Docker sandbox", reason)
    return DockerSandbox(pool_size)  # started by `with`


def load_script(path: Path) -> ModuleType:
    """A script that is not part of the package (benchmarks/, examples/), imported as a module by its path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SharedRay:
    """One private local Ray (`init_local_ray`) for the consecutive test modules that ask for it
    (tests/conftest.py: the `local_ray` fixture and the hook that stops it): a Ray start costs ~5 s of CPU and
    more of waiting, and tests/rollout and tests/train once started eight between them.

    `start` gives the running instance when it is ours and idle; otherwise (none yet, a test shut it down,
    someone else's, or actors left holding its CPUs) it starts a fresh one."""

    NUM_CPUS = 4  # logical: room for two learner ranks beside a rollout worker

    def __init__(self) -> None:
        self._gcs: str | None = None  # the address of the instance started here

    @property
    def running(self) -> bool:
        return self._gcs is not None

    def start(self) -> ModuleType:
        require(importlib.util.find_spec("ray") is not None, "Ray", "a dependency of stare-agents")
        import ray

        if ray.is_initialized() and not (self._ours(ray) and self._idle(ray)):
            ray.shutdown()
        if not ray.is_initialized():
            from stare_agents.rollout.local_ray import init_local_ray

            init_local_ray(num_cpus=self.NUM_CPUS, log_to_driver=False)
            self._gcs = ray.get_runtime_context().gcs_address
        return ray

    def stop(self) -> None:
        import sys

        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized() and self._ours(ray):
            ray.shutdown()
        self._gcs = None

    def _ours(self, ray: ModuleType) -> bool:
        return self._gcs is not None and ray.get_runtime_context().gcs_address == self._gcs

    def _idle(self, ray: ModuleType, wait_s: float = 10.0) -> bool:
        """Every CPU free (actors a test closed give theirs back within moments)."""
        import time

        deadline = time.monotonic() + wait_s
        while ray.available_resources().get("CPU", 0.0) < self.NUM_CPUS:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True
