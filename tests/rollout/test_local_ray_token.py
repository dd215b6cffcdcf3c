"""A local run's Ray token is readable by its user only (issue 32): Ray 2.60 writes `~/.ray/auth_token` with
mode 0644 when it makes one, and then any local user can authenticate to the run's Ray."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # the private Ray folders init_local_ray makes go here
    for name in AUTH_ENV:
        monkeypatch.delenv(name, raising=False)
    import ray

    started = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.append(kwargs))
    return tmp_path


def test_the_token_is_made_private_before_ray_starts(home) -> None:
    from stare_agents.rollout.local_ray import init_local_ray

    previous = os.umask(0o022)  # the usual umask, under which Ray's own file is 0644
    try:
        init_local_ray(num_cpus=1)
    finally:
        os.umask(previous)
    token = home / ".ray" / "auth_token"
    assert mode(token) == 0o600 and mode(token.parent) == 0o700
    assert len(token.read_text()) == 64 and int(token.read_text(), 16) >= 0  # 32 random bytes in hex


def test_an_existing_token_is_kept_and_made_private(home, monkeypatch) -> None:
    from stare_agents.rollout.local_ray import init_local_ray

    token = home / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("a" * 64)
    token.chmod(0o644)
    init_local_ray(num_cpus=1)
    assert mode(token) == 0o600 and token.read_text() == "a" * 64
    elsewhere = home / "token"  # RAY_AUTH_TOKEN_PATH: that file instead
    elsewhere.write_text("b" * 64)
    elsewhere.chmod(0o640)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(elsewhere))
    init_local_ray(num_cpus=1)
    assert mode(elsewhere) == 0o600 and elsewhere.read_text() == "b" * 64


def test_no_token_file_where_ray_uses_none(home, monkeypatch) -> None:
    from stare_agents.rollout.local_ray import init_local_ray

    for name, value in (("RAY_AUTH_MODE", "disabled"), ("RAY_AUTH_TOKEN", "c" * 64)):
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            init_local_ray(num_cpus=1)
    assert not (home / ".ray").exists()


@pytest.mark.ray
def test_a_real_local_ray_keeps_the_token_private(tmp_path) -> None:
    """Ray itself, started as the rollout workers start it, uses the private file and leaves it 0600."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH_ENV}
    env["HOME"] = str(tmp_path)
    code = (
        "import os, stat, ray\n"
        "from stare_agents.rollout.local_ray import init_local_ray\n"
        "os.umask(0o022)\n"
        "init_local_ray(num_cpus=1, log_to_driver=False)\n"
        "assert ray.get(ray.remote(lambda: 42).remote()) == 42\n"
        "token = os.path.expanduser('~/.ray/auth_token')\n"
        "print(oct(stat.S_IMODE(os.stat(token).st_mode)), os.environ.get('RAY_AUTH_MODE'))\n"
        "ray.shutdown()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["0o600", "token"], result.stdout
