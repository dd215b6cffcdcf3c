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
