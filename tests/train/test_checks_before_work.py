"""No usable sandbox stops `train` before it writes its run folder and `rollout` before it prepares a model or
starts Ray (issue 32, item 8): a clear error, nothing written, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import stare_agents.models
import stare_agents.rollout
import stare_agents.train.trainer
from stare_agents.cli import app
from stare_agents.sandbox import ALLOW_LOCAL_ENV, SandboxError
from stare_agents.train.config import load_config
from stare_agents.train.trainer import train

NO_IMAGE = "rollout.sandbox_kwargs={image: stare-agents/no-such-image:0}"


def test_train_checks_the_sandbox_before_it_writes_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_LOCAL_ENV, raising=False)
    for override, message in (
        (NO_IMAGE, r"no-such-image|no Docker engine"),
        ("rollout.sandbox=local", ALLOW_LOCAL_ENV),
    ):
        run = tmp_path / "run"
        config = load_config(recipe="tiny", overrides=[f"out_dir={run}", override])
        with pytest.raises(SandboxError, match=message):
            train(config)
        assert not run.exists()  # not even config.yaml


def test_the_train_command_says_so_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_LOCAL_ENV, raising=False)
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["train", "--recipe", "tiny", "--out", str(run), "rollout.sandbox=local"]
    )
    assert result.exit_code == 2 and ALLOW_LOCAL_ENV in result.output, result.output
    assert not run.exists()


@pytest.fixture
def nothing_may_start(monkeypatch) -> list[str]:
    """Preparing a model, starting rollout workers or Ray is recorded, and refused."""
    started: list[str] = []

    def refuse(what: str):
        def call(*args, **kwargs):
            started.append(what)
            raise AssertionError(f"{what} started before the sandbox was checked")

        return call

    import ray

    for module in (stare_agents.models, stare_agents.train.trainer):  # where defined, and where the trainer uses it
        monkeypatch.setattr(module, "prepare_model", refuse("prepare_model"))
    for module in (stare_agents.rollout, stare_agents.train.trainer):
        monkeypatch.setattr(module, "RolloutWorkerGroup", refuse("RolloutWorkerGroup"))
    monkeypatch.setattr(ray, "init", refuse("ray.init"))
    return started


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_rollout_checks_the_sandbox_before_a_model_or_ray(tmp_path, monkeypatch, nothing_may_start, backend):
    monkeypatch.delenv(ALLOW_LOCAL_ENV, raising=False)
    if backend == "docker":  # an engine that is not there
        from stare_agents.sandbox import docker_backend

        monkeypatch.setattr(
            docker_backend, "docker_status", lambda *args: (False, "no Docker engine answers")
        )
    out = tmp_path / "episodes.jsonl"
    arguments = ["--env", "stare_agents/ArithmeticTIR-v0", "--model", "tiny", "--out", str(out)]
    result = CliRunner().invoke(app, ["rollout", *arguments, "--sandbox", backend])
    assert result.exit_code == 2, result.output
    assert (ALLOW_LOCAL_ENV if backend == "local" else "no Docker engine answers") in result.output
    assert nothing_may_start == [] and not Path(out).exists()
