"""A local run's Ray keeps its sockets, logs and session files in a folder of its own, readable by its user only
(issue 32, item 8): Ray's default, /tmp/ray, is shared by every user of the machine."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def started(tmp_path, monkeypatch) -> list[dict]:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token file: this test is about the folder
    import ray

    calls: list[dict] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    return calls


def test_each_local_ray_gets_a_fresh_private_folder(started, tmp_path) -> None:
    from stare_agents.rollout.local_ray import init_local_ray

    previous = os.umask(0o022)
    try:
        init_local_ray(num_cpus=1)
        init_local_ray(num_cpus=1)
    finally:
        os.umask(previous)
    first, second = (Path(call["_temp_dir"]).parent for call in started)  # Ray's folder is ray/ in it
    assert first != second and first.parent == second.parent == tmp_path  # under $RAY_TMPDIR
    for folder in (first, second):
        info = folder.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()


def test_a_temp_dir_asked_for_is_used_as_given(started, tmp_path) -> None:
    from stare_agents.rollout.local_ray import init_local_ray

    init_local_ray(num_cpus=1, _temp_dir=str(tmp_path / "mine"))
    assert started[0]["_temp_dir"] == str(tmp_path / "mine")
    assert list(tmp_path.iterdir()) == []  # no folder made for nothing


@pytest.mark.ray
def test_a_real_local_ray_keeps_its_session_in_the_private_folder(tmp_path) -> None:
    short = Path(tempfile.mkdtemp(prefix="srt-", dir="/tmp"))  # Ray's socket paths must fit in 107 bytes
    try:
        check_real_ray(short, tmp_path)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def check_real_ray(ray_tmpdir: Path, home: Path) -> None:
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmpdir), "HOME": str(home)}
    code = (
        "import os, stat, ray\n"
        "from stare_agents.rollout.local_ray import init_local_ray\n"
        "init_local_ray(num_cpus=1, log_to_driver=False)\n"
        "assert ray.get(ray.remote(lambda: 42).remote()) == 42\n"
        "session = ray._private.worker._global_node.get_session_dir_path()\n"
        "private = os.path.dirname(os.path.dirname(session))\n"
        "print(private, oct(stat.S_IMODE(os.stat(private).st_mode)))\n"
        "ray.shutdown()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    private, mode = result.stdout.split()[-2:]
    folder = Path(private)
    assert folder.parent == ray_tmpdir and folder.name.startswith("stare-ray-") and mode == "0o700", (
        result.stdout
    )
