"""A rollout worker starts its sandbox while its engine loads, and whichever of the two fails, the other is closed:
no interpreter and no engine outlives a worker that could not start."""

from __future__ import annotations

import threading

import psutil
import pytest

from stare_agents.rollout import env_pool, workers
from stare_agents.rollout.workers import RolloutWorker, WorkerSpec


def spec(model, **overrides) -> WorkerSpec:
    fields = dict(model=str(model), engine="hf", dtype="float32", max_model_len=256, sandbox="local")
    return WorkerSpec(**{**fields, "sandbox_pool_size": 2, **overrides})


def interpreters() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def test_the_sandbox_starts_on_its_own_thread_while_the_engine_loads(tiny_model, monkeypatch):
    monkeypatch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")
    started_on: list[str] = []
    real = env_pool.start_sandbox

    def recording(*args, **kwargs):
        started_on.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(env_pool, "start_sandbox", recording)
    before = interpreters()
    worker = RolloutWorker(spec(tiny_model))
    try:
        assert worker.ping()["sandbox"] == "LocalSandbox"
        assert len(started_on) == 1 and started_on[0].startswith("sandbox-start")
        assert interpreters() - before  # the pool's interpreters are up
    finally:
        worker.close()
    assert not interpreters() - before


def test_an_engine_that_fails_to_load_closes_the_started_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")
    before = interpreters()
    with pytest.raises(Exception) as error:
        RolloutWorker(spec(tmp_path / "no-such-model"))
    assert "no-such-model" in str(error.value)
    assert not interpreters() - before, "the sandbox's interpreters outlived the failed worker"


def test_a_sandbox_that_fails_to_start_closes_the_loaded_engine(tiny_model, monkeypatch):
    """The local sandbox refused (host execution not acknowledged): the engine that loaded meanwhile is closed."""
    monkeypatch.delenv("STARE_ALLOW_LOCAL_SANDBOX", raising=False)
    engines = []
    real = workers.make_engine

    def keeping(*args, **kwargs):
        engines.append(real(*args, **kwargs))
        return engines[-1]

    monkeypatch.setattr(workers, "make_engine", keeping)
    with pytest.raises(Exception, match="STARE_ALLOW_LOCAL_SANDBOX"):
        RolloutWorker(spec(tiny_model))
    [engine] = engines
    with pytest.raises(RuntimeError, match="shutdown"):  # HFEngine.close shut its executor
        engine._executor.submit(int)
