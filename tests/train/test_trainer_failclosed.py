"""Training fails closed: without a usable sandbox it refuses to start (before any model, engine or Ray),
unless the local backend is asked for by name and acknowledged."""

from __future__ import annotations

import pytest

from stare_agents.sandbox import ALLOW_LOCAL_ENV, SandboxError, check_backend
from stare_agents.train.config import TrainConfig, load_config
from stare_agents.train.trainer import train


def test_the_defaults_ask_for_docker():
    assert TrainConfig().rollout.sandbox == "docker"
    for recipe in ("tiny", "smollm2-arith"):
        assert load_config(recipe=recipe).rollout.sandbox == "docker"


def test_no_docker_image_means_no_training(tmp_path, monkeypatch):
    monkeypatch.setenv(ALLOW_LOCAL_ENV, "1")  # even acknowledged, the local backend is never a fallback
    config = load_config(
        recipe="tiny",
        overrides=[
            f"out_dir={tmp_path / 'run'}",
            "rollout.sandbox_kwargs={image: stare-agents/no-such-image:0}",
        ],
    )
    with pytest.raises(SandboxError, match=r"no-such-image|no Docker engine"):
        train(config)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_local_backend_needs_the_acknowledgement(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_LOCAL_ENV, raising=False)
    config = load_config(recipe="tiny", overrides=[f"out_dir={tmp_path / 'run'}", "rollout.sandbox=local"])
    with pytest.raises(SandboxError, match=ALLOW_LOCAL_ENV):
        train(config)
    check_backend("local", allow_host_execution=True)  # asked for by name and acknowledged: allowed
    monkeypatch.setenv(ALLOW_LOCAL_ENV, "1")
    check_backend("local")
    check_backend("none")
    with pytest.raises(ValueError, match="podman"):
        check_backend("podman")
