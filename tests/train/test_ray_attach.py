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
import socket
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
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(local_ray, "init_local_ray", lambda **kwargs: calls.append({"local": kwargs}))
    assert local_ray.init_ray("127.0.0.1:6379", num_cpus=4) == "127.0.0.1:6379"
    assert local_ray.init_ray(None, num_cpus=4) is None
    assert calls == [
        {"address": "127.0.0.1:6379", "log_to_driver": True},
        {"local": {"num_cpus": 4, "log_to_driver": True}},
    ]


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
            env = {**cluster_env(folder), **extra}
            done = subprocess.run(
                [sys.executable, "-c", DRIVER, str(tmp_path / name.replace(" ", "-")), *overrides],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{name}: {done.stderr[-4000:]}"
            seen = json.loads(done.stdout.strip().splitlines()[-1])
            assert seen == {"gcs": address, "cpus": 2.0, "answer": 42}, (name, seen)
    finally:
        remove(folder)
