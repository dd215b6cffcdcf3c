"""The trainer attaches to a Ray cluster started with `ray start` (issue 29, item 1).

A driver that connects to a running cluster may not give Ray `num_cpus`/`num_gpus` (Ray refuses them: the
nodes declared their resources when `ray start` started them); the trainer used to start Ray with them always,
so `RAY_ADDRESS` (as `ray job submit` sets it) stopped it at start-up, and a cluster started on its node was
never used. `init_ray` finds the cluster in `rollout.ray_address`, `RAY_ADDRESS` or the address file `ray start`
writes on its node, and attaches without resources.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from ray_cluster_support import cluster_env, remove, short_folder, start_head

from stare_agents.rollout import local_ray
from stare_agents.rollout.local_ray import cluster_address

# the trainer's Ray start-up, in a fresh process per case, as `stare-agents train` runs it
DRIVER = r"""
import json, os, sys
import ray
from stare_agents.train.config import load_config
from stare_agents.train.trainer import Trainer

out, *overrides = sys.argv[1:]
trainer = Trainer(load_config(recipe="tiny", overrides=[f"out_dir={out}", "rl.learner_workers=2", *overrides]))
trainer._distributed_config()  # what the trainer calls before it starts a learner group
print(json.dumps({
    "gcs": ray.get_runtime_context().gcs_address,
    "cpus": ray.cluster_resources().get("CPU"),
    "answer": ray.get(ray.remote(lambda: 42).remote()),
}))
ray.shutdown()
"""


@pytest.fixture
def no_cluster_here(tmp_path, monkeypatch) -> Path:
    """Ray's default temp folder in tmp_path (no `ray start` cluster recorded there) and no RAY_ADDRESS."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path / "ray" / "ray_current_cluster"


def test_the_address_comes_from_the_key_then_ray_address_then_ray_start(no_cluster_here, monkeypatch) -> None:
    assert cluster_address(None) == (None, "no cluster to attach to")
    assert cluster_address("10.0.0.1:6379") == ("10.0.0.1:6379", "rollout.ray_address")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    assert cluster_address(None) == ("10.0.0.2:6379", "RAY_ADDRESS")
    assert cluster_address("10.0.0.1:6379")[0] == "10.0.0.1:6379"  # the key wins
    assert cluster_address("local") == (None, "rollout.ray_address=local")
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert cluster_address(None) == (None, "RAY_ADDRESS=local")
    monkeypatch.delenv("RAY_ADDRESS")
    with socket.socket() as gcs:  # a `ray start` cluster on this node: its address file and its GCS answering
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        found = f"127.0.0.1:{gcs.getsockname()[1]}"
        no_cluster_here.parent.mkdir(parents=True)
        no_cluster_here.write_text(found + "\n")
        assert cluster_address(None) == (found, f"`ray start` on this node ({no_cluster_here})")
        assert cluster_address("auto")[0] == found
        assert cluster_address("local")[0] is None


def test_a_stale_address_file_is_said_and_left(no_cluster_here, caplog) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        stale = f"127.0.0.1:{closed.getsockname()[1]}"  # nothing listens there
    no_cluster_here.parent.mkdir(parents=True)
    no_cluster_here.write_text(stale)
    with caplog.at_level(logging.WARNING, logger="stare_agents.rollout"):
        assert cluster_address(None) == (None, "no cluster to attach to")
    assert stale in caplog.text and "does not answer" in caplog.text
    with pytest.raises(ConnectionError, match=r"rollout\.ray_address=auto: no Ray cluster started"):
        cluster_address("auto")


def test_attaching_gives_ray_no_resources(no_cluster_here, monkeypatch) -> None:
    import ray

    calls: list[dict] = []
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setattr(local_ray, "answers_without_token", lambda address: False)  # a cluster with tokens
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(local_ray, "init_local_ray", lambda **kwargs: calls.append({"local": kwargs}))
    assert local_ray.init_ray("127.0.0.1:6379", num_cpus=4) == "127.0.0.1:6379"
    assert local_ray.init_ray(None, num_cpus=4) is None
    assert calls == [
        {"address": "127.0.0.1:6379", "log_to_driver": True},
        {"local": {"num_cpus": 4, "log_to_driver": True}},
    ]


@pytest.fixture
def gcs_here():
    """Something listening on loopback, as a `ray start` cluster's GCS would: its address."""
    with socket.socket() as gcs:
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        yield f"127.0.0.1:{gcs.getsockname()[1]}"


NOBODY = 65534


@pytest.mark.parametrize("plant", ["group-writable", "world-writable", "another user's", "a link"])
def test_an_address_file_someone_else_could_have_written_is_ignored(
    no_cluster_here, gcs_here, plant, caplog, tmp_path
) -> None:
    """Issue 51, item 1: any local user can write Ray's shared temp folder, so `ray_current_cluster` there may
    name their cluster; a run attaches to it only when the file is the user's own and no one else's to write."""
    no_cluster_here.parent.mkdir(parents=True)
    if plant == "a link":  # a link to a file of the user's naming the cluster: the link itself is anyone's
        target = tmp_path / "elsewhere"
        target.write_text(gcs_here)
        target.chmod(0o644)
        no_cluster_here.symlink_to(target)
    else:
        no_cluster_here.write_text(gcs_here + "\n")
        no_cluster_here.chmod({"group-writable": 0o664, "world-writable": 0o666}.get(plant, 0o644))
        if plant == "another user's":
            if os.geteuid() != 0:
                pytest.skip("planting another user's file needs root (address_file_problem is tested below)")
            os.chown(no_cluster_here, NOBODY, NOBODY)
    with caplog.at_level(logging.WARNING, logger="stare_agents.rollout"):
        assert cluster_address(None) == (None, f"{no_cluster_here} not trusted")
    said = {
        "group-writable": "others may write it (mode 0664)",
        "world-writable": "others may write it (mode 0666)",
        "another user's": f"(uid {NOBODY}), not to you (uid {os.getuid()})",
        "a link": "cannot be opened as a plain file",
    }[plant]
    assert (
        str(no_cluster_here) in caplog.text and said in caplog.text and "RAY_ADDRESS=HOST:PORT" in caplog.text
    )
    with pytest.raises(ConnectionError, match=r"rollout\.ray_address=auto: .* is not to be trusted") as error:
        cluster_address("auto")
    assert said in str(error.value)
    assert cluster_address(gcs_here) == (
        gcs_here,
        "rollout.ray_address",
    )  # named by the user: theirs to judge


def test_the_address_file_judgement() -> None:
    from stare_agents.rollout.local_ray import address_file_problem

    me = os.getuid()

    def stats(mode: int, uid: int = me, links: int = 1) -> os.stat_result:
        return os.stat_result((mode, 0, 0, links, uid, 0, 0, 0, 0, 0))

    plain = stat.S_IFREG
    assert address_file_problem(stats(plain | 0o644), me) is None  # what `ray start` writes under umask 022
    assert address_file_problem(stats(plain | 0o600), me) is None
    assert address_file_problem(stats(plain | 0o644, uid=me + 1), me).endswith(f"not to you (uid {me})")
    assert address_file_problem(stats(plain | 0o620), me) == "others may write it (mode 0620)"
    assert address_file_problem(stats(plain | 0o602), me) == "others may write it (mode 0602)"
    assert address_file_problem(stats(plain | 0o644, links=2), me) == "it has 2 hard links"
    assert address_file_problem(stats(stat.S_IFIFO | 0o644), me) == "it is not a plain file"


def test_attaching_needs_token_authentication(monkeypatch) -> None:
    """RAY_AUTH_MODE=disabled is refused before anything connects; unset, it becomes token."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ConnectionError, match=r"RAY_AUTH_MODE=disabled: a run attaches .* only with token"):
        local_ray.require_token_auth("127.0.0.1:1", "RAY_ADDRESS")
    monkeypatch.delenv("RAY_AUTH_MODE")
    local_ray.require_token_auth("127.0.0.1:1", "RAY_ADDRESS")  # nothing answers there: ray.init will say so
    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_the_key_is_typed_and_shown() -> None:
    from stare_agents.train.config import load_config

    assert load_config(recipe="tiny").rollout.ray_address is None
    config = load_config(recipe="tiny", overrides=["rollout.ray_address=10.0.0.1:6379"])
    assert config.rollout.ray_address == "10.0.0.1:6379" and "ray_address: 10.0.0.1:6379" in config.to_yaml()


@pytest.mark.ray
@pytest.mark.slow
def test_the_trainer_attaches_to_a_ray_start_cluster(tmp_path) -> None:
    """A head started with `ray start` (2 CPUs, token authentication): the trainer's Ray start-up attaches to it
    by rollout.ray_address, by RAY_ADDRESS, and by finding it on this node, and runs a task there."""
    folder = short_folder()
    try:
        address = start_head(folder, num_cpus=2)
        cases = {
            "key": ({}, [f"rollout.ray_address={address}"]),
            "RAY_ADDRESS": ({"RAY_ADDRESS": address}, []),  # as `ray job submit` runs a driver
            "ray start on this node": ({"RAY_TMPDIR": str(folder)}, []),  # Ray's default folder: folder/ray
        }
        for name, (extra, overrides) in cases.items():
            done = run_driver(tmp_path / name.replace(" ", "-"), {**cluster_env(folder), **extra}, *overrides)
            assert done.returncode == 0, f"{name}: {done.stderr[-4000:]}"
            seen = json.loads(done.stdout.strip().splitlines()[-1])
            assert seen == {"gcs": address, "cpus": 2.0, "answer": 42}, (name, seen)
        # the same cluster's address file made writable by others: the run starts a private Ray and says why
        (folder / "ray" / "ray_current_cluster").chmod(0o666)
        done = run_driver(tmp_path / "planted", {**cluster_env(folder), "RAY_TMPDIR": str(folder)})
        assert done.returncode == 0, done.stderr[-4000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["gcs"] != address and seen["answer"] == 42, seen
        assert "others may write it (mode 0666)" in done.stderr and "private local Ray starts" in done.stderr
    finally:
        remove(folder)


def run_driver(out: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.ray
@pytest.mark.slow
def test_a_cluster_without_token_authentication_is_refused(tmp_path) -> None:
    """Issue 51, item 1: a cluster that answers requests without a token runs code for whoever reaches it, and
    in the driver through it; the run refuses it by name, even when the user named it."""
    folder = short_folder()
    try:
        address = start_head(folder, num_cpus=1, token=False)
        assert local_ray.answers_without_token(address) is True
        done = run_driver(tmp_path / "run", {**cluster_env(folder), "RAY_ADDRESS": address})
        assert done.returncode != 0
        assert (
            f"the Ray cluster at {address} (from RAY_ADDRESS) answers requests without a token" in done.stderr
        )
    finally:
        remove(folder)
