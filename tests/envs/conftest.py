"""Fixtures for the environment tests: one local sandbox and one grader shared by the whole session."""

from __future__ import annotations

import pytest

import stare_agents.envs  # noqa: F401  (registers the ids)
from stare_agents.envs.grading import MathGrader
from stare_agents.sandbox import LocalSandbox


@pytest.fixture(scope="session")
def local_sandbox():
    """A LocalSandbox with two warm interpreters (tests on 2 cores: more would only contend)."""
    sandbox = LocalSandbox(2, allow_host_execution=True)
    sandbox.start()
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="session")
def docker_sandbox():
    """A DockerSandbox; skips locally (fails in CI) without an engine and image."""
    from support import docker_sandbox as started

    with started(2) as sandbox:
        yield sandbox


@pytest.fixture(scope="session")
def grader():
    """A grader pool whose timeout leaves room for a loaded machine: correctness cases must not time out."""
    with MathGrader(timeout_s=10.0) as grader:
        yield grader


@pytest.fixture(scope="session")
def fast_grader():
    """A grader pool with a short timeout, so pathological-input tests stay fast."""
    with MathGrader(timeout_s=1.5) as grader:
        yield grader
