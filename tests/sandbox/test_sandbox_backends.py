"""Sandbox backends sit in a table and are asked what they can do: nothing compares a backend's name, and a
backend that cannot run here is an error that says what to do, never another backend in its place."""

from __future__ import annotations

import pytest

from stare_agents.sandbox import (
    ALLOW_LOCAL_ENV,
    BACKEND_CLASSES,
    BACKENDS,
    DEFAULT_BACKEND,
    DockerLimits,
    DockerSandbox,
    LocalSandbox,
    NoSandbox,
    SandboxError,
    backend_class,
    check_backend,
    docker_backend,
    make_sandbox,
)


def test_every_backend_name_has_a_class_that_says_what_it_can_do():
    assert set(BACKEND_CLASSES) == set(BACKENDS)
    can = {name: (cls.runs_code, cls.pins_cpus, cls.lowers_priority) for name, cls in BACKEND_CLASSES.items()}
    assert can == {
        "docker": (True, True, True),
        "auto": (True, True, True),  # an older name of "docker"
        "local": (True, False, False),
        "none": (False, False, False),
    }
    assert backend_class(DEFAULT_BACKEND) is DockerSandbox
    with pytest.raises(
        ValueError, match=r"must be one of \('docker', 'local', 'none', 'auto'\), got 'podman'"
    ):
        backend_class("podman")


def test_cpus_and_priority_go_into_the_settings_of_a_backend_that_can_use_them():
    # Docker's containers are the engine's children: they stay on CPUs through their limits' cpuset
    assert DockerSandbox.with_cpus({"default_timeout_s": 7}, "1,3") == {
        "default_timeout_s": 7,
        "limits": DockerLimits(cpuset="1,3"),
    }
    assert DockerSandbox.with_cpus({"limits": {"memory_mb": 300}}, "2") == {
        "limits": DockerLimits(memory_mb=300, cpuset="2")
    }
    assert DockerSandbox.with_cpus({"limits": {"cpuset": "0"}}, "2") == {"limits": {"cpuset": "0"}}  # theirs
    assert DockerSandbox.with_low_priority({}, True) == {"limits": {"low_priority": True}}
    assert DockerSandbox.with_low_priority({"limits": {"pids": 9}}, False) == {
        "limits": {"pids": 9, "low_priority": False}
    }
    assert DockerSandbox.with_low_priority({"limits": {"low_priority": False}}, True) == {
        "limits": {"low_priority": False}
    }
    limits = DockerLimits(memory_mb=300)
    assert DockerSandbox.with_low_priority({"limits": limits}, True) == {"limits": limits}  # it says itself
    # the local backend's interpreters are this process's children: they run where and as it runs
    for cls in (LocalSandbox, NoSandbox):
        assert cls.with_cpus({"memory_mb": 700}, "1") == {"memory_mb": 700}
        assert cls.with_low_priority({"memory_mb": 700}, True) == {"memory_mb": 700}


def test_a_missing_docker_engine_is_an_error_with_the_remedy_never_another_backend(monkeypatch):
    monkeypatch.setenv(ALLOW_LOCAL_ENV, "1")  # even with the host acknowledged, Docker asked for is Docker
    monkeypatch.setattr(
        docker_backend, "docker_status", lambda *args: (False, "no Docker engine answers (here)")
    )
    for backend in ("docker", "auto"):
        for start, kwargs in ((make_sandbox, {"pool_size": 1}), (check_backend, {})):
            with pytest.raises(SandboxError) as error:
                start(backend, **kwargs)
            message = str(error.value)
            assert "the Docker sandbox is not ready: no Docker engine answers (here)" in message
            assert "provision_docker.sh" in message and "stare-agents sandbox doctor" in message
            assert ALLOW_LOCAL_ENV in message


def test_make_sandbox_gives_the_backend_asked_for(monkeypatch):
    monkeypatch.setattr(docker_backend, "docker_status", lambda *args: (True, ""))
    monkeypatch.setenv(ALLOW_LOCAL_ENV, "1")
    for name, cls in BACKEND_CLASSES.items():
        assert type(make_sandbox(name, pool_size=1)) is cls  # made, not started
    check_backend("none")  # nothing to check: it runs nothing
