"""Training fails closed: without a usable sandbox it refuses to start (before any model, engine or Ray),
unless the local backend is asked for by name and acknowledged."""

from __future__ import annotations

import logging

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


def test_a_config_file_cannot_acknowledge_host_execution(tmp_path, monkeypatch):
    """The acknowledgement is the environment's (STARE_ALLOW_LOCAL_SANDBOX=1): a recipe that says so itself
    is refused when it loads, with the variable named, and nothing runs on the host."""
    monkeypatch.delenv(ALLOW_LOCAL_ENV, raising=False)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model: {name: tiny}\nrollout: {sandbox: local, sandbox_kwargs: {allow_host_execution: true}}\n"
    )
    with pytest.raises(
        ValueError, match=rf"rollout\.sandbox_kwargs\.allow_host_execution.*{ALLOW_LOCAL_ENV}=1"
    ):
        load_config(path=str(recipe))


@pytest.mark.parametrize(
    "backend, kwargs, says",
    [
        ("local", "{python: /bin/sh}", r"sandbox_kwargs\.python='/bin/sh' is not allowed"),
        ("local", "{isolate_network: false}", r"sandbox_kwargs\.isolate_network=False is not allowed"),
        ("docker", "{allow_host_execution: true}", "cannot acknowledge"),
        ("local", "{image: evil:1}", r"not a setting of the 'local' sandbox.*allowed: default_timeout_s"),
        ("local", "{limits: {user: '0:0'}}", "not a setting of the 'local' sandbox"),
        ("docker", "{memory_mb: 9}", "not a setting of the 'docker' sandbox"),
        ("docker", "{privileged: true}", "not a setting of the 'docker' sandbox"),
        ("docker", "{limits: {seccomp: unconfined}}", r"\['seccomp'\] are not limits"),
        ("none", "{image: x}", "allowed: none"),
        ("docker", "{limits: {user: '0:0'}}", r"sandbox_kwargs\.limits: user must be a numeric uid:gid"),
        ("docker", "{limits: {pids: -1}}", r"sandbox_kwargs\.limits: pids must be an int in \[1, 4096\]"),
        ("docker", "{limits: {cpus: 0}}", r"sandbox_kwargs\.limits: cpus must be a number in"),
        ("docker", "{limits: {memory_mb: .inf}}", r"sandbox_kwargs\.limits: memory_mb must be"),
    ],
)
def test_sandbox_kwargs_are_whitelisted_per_backend(backend, kwargs, says):
    with pytest.raises(ValueError, match=says):
        load_config(
            recipe="tiny", overrides=[f"rollout.sandbox={backend}", f"rollout.sandbox_kwargs={kwargs}"]
        )
    # what a config may set still loads
    assert load_config(
        recipe="tiny", overrides=["rollout.sandbox_kwargs={runtime: runsc, limits: {cpus: 2}}"]
    )
    assert load_config(
        recipe="tiny", overrides=["rollout.sandbox=local", "rollout.sandbox_kwargs={memory_mb: 700}"]
    )


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["rollout.sandbox_kwargs={default_timeout_s: 7, limits: {memory_mb: 300}}"],
            ("docker", {"default_timeout_s": 7, "limits": {"memory_mb": 300, "low_priority": True}}),
        ),
        (["rollout.sandbox=local", "rollout.sandbox_kwargs={memory_mb: 700}"], ("local", {"memory_mb": 700})),
        (["rollout.sandbox=none"], ("docker", {})),  # the solver's code must run: Docker, never the host
    ],
)
def test_the_sft_solver_sandbox_gets_the_rollout_workers_kwargs(tmp_path, monkeypatch, overrides, expected):
    """sft.data=solver verifies its traces in a sandbox of its own: the same backend and kwargs as every
    rollout worker's (the local backend's run no longer crashes there, and Docker's limits hold there too)."""
    import stare_agents.sandbox
    from stare_agents.models import prepare_model
    from stare_agents.train.trainer import Trainer

    monkeypatch.setenv(ALLOW_LOCAL_ENV, "1")
    config = load_config(
        recipe="tiny", overrides=[f"out_dir={tmp_path / 'run'}", "sft.data=solver", *overrides]
    )
    started = []

    class Started(Exception):
        pass

    def make_sandbox(backend, *, pool_size=4, **kwargs):
        started.append((backend, kwargs))
        raise Started

    monkeypatch.setattr(stare_agents.train.trainer, "make_sandbox", make_sandbox)  # where the trainer uses it
    with pytest.raises(Started):
        Trainer(config).supervised_fine_tuning(prepare_model("tiny"), tmp_path / "sft")
    assert started == [expected]


def test_a_sandbox_that_runs_no_code_says_where_the_solver_code_runs(caplog):
    """sft.data=solver must run the solutions to verify them: with rollout.sandbox 'none' they run in the
    default backend (Docker, never the host), and the log says so; a backend that runs code is kept."""
    with caplog.at_level(logging.WARNING, logger="stare_agents.train"):
        assert load_config(recipe="tiny", overrides=["rollout.sandbox=none"]).rollout.code_sandbox() == (
            "docker",
            {},
        )
    assert "rollout.sandbox is 'none', which runs no code" in caplog.text
    assert "it runs in the 'docker' sandbox as it comes (never on the host)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stare_agents.train"):
        assert load_config(recipe="tiny").rollout.code_sandbox()[0] == "docker"
    assert caplog.text == ""
