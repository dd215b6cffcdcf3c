"""The driver's NCCL and gloo settings reach every Ray worker the trainer starts (issue 29, item 6), where the
worker's node has none of its own (issue 50, item 4).

On a cluster a worker gets the environment of its node's raylet (what `ray start` had there), not the
driver's: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME set for the trainer would never reach the learner ranks and
engines that open the sockets. The trainer passes NCCL_*, TORCH_NCCL_* and GLOO_SOCKET_IFNAME with each actor
(`worker_runtime_env`), and the worker takes those its node does not set (a head with eth0 and GPU nodes whose
`ray start` had NCCL_SOCKET_IFNAME=ib0 keep ib0). The test sets them only after Ray started (so no worker inherits
them from the raylet) and reads them back inside a rollout worker and a learner worker; a value the worker's
environment has before the driver's arrive stays.
"""

from __future__ import annotations

import json
import os

import pytest

from stare_agents.rollout.local_ray import forwarded_env
from stare_agents.rollout.worker_env import DRIVER_ENV, apply_driver_env, driver_defaults, worker_runtime_env

SETTINGS = {
    "NCCL_SOCKET_IFNAME": "stare-test0",
    "GLOO_SOCKET_IFNAME": "stare-test1",
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


def test_which_variables_are_forwarded(monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith(("NCCL_", "TORCH_NCCL_", "GLOO_")):
            monkeypatch.delenv(name)
    for name, value in {**SETTINGS, "GLOO_DEVICE_TRANSPORT": "x", "OTHER_NCCL": "y"}.items():
        monkeypatch.setenv(name, value)
    assert forwarded_env() == SETTINGS


def test_a_nodes_own_value_is_kept_and_the_drivers_fill_in_the_rest(monkeypatch) -> None:
    driver = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}
    node = {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "", "PATH": "/bin"}
    assert driver_defaults(node, driver) == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}
    for name in driver:  # each restored after the test, whatever the hook sets
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.delenv("NCCL_DEBUG")
    monkeypatch.setenv(DRIVER_ENV, json.dumps(driver))
    apply_driver_env()  # what Ray runs as the worker process starts
    assert (os.environ["NCCL_SOCKET_IFNAME"], os.environ["NCCL_DEBUG"]) == ("ib0", "INFO")
    monkeypatch.delenv(DRIVER_ENV)
    apply_driver_env()  # a worker started without the driver's settings: nothing to do


def test_the_runtime_env_carries_the_drivers_settings_as_defaults_only(monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith(("NCCL_", "TORCH_NCCL_", "GLOO_")):
            monkeypatch.delenv(name)
    assert worker_runtime_env() == {} and worker_runtime_env({"A": "1"}) == {"env_vars": {"A": "1"}}
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    env = worker_runtime_env({"A": "1"})
    assert env == {"env_vars": {"A": "1", DRIVER_ENV: '{"NCCL_SOCKET_IFNAME": "eth0"}'}}  # not NCCL_* itself


@pytest.mark.ray
def test_rollout_and_learner_workers_get_the_drivers_settings(local_ray, tiny_model, monkeypatch) -> None:
    ray = local_ray
    from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec
    from stare_agents.train.distributed import DistributedConfig, _close_workers, _start_workers

    for name, value in SETTINGS.items():  # after Ray started: only forwarding can bring them to a worker
        monkeypatch.setenv(name, value)

    def seen(actor) -> dict[str, str | None]:
        return ray.get(
            actor.__ray_call__.remote(lambda _: {name: os.environ.get(name) for name in SETTINGS}),
            timeout=120,
        )

    spec = WorkerSpec(model=str(tiny_model), engine="hf", dtype="float32", max_model_len=256, sandbox="none")
    rollout = RolloutWorkerGroup(spec, num_workers=1)
    learners, placement = _start_workers(DistributedConfig(num_workers=1, num_cpus_per_worker=0.5))
    # a worker whose environment has a value of its own (as a node's `ray start` one) keeps it
    class Probe:  # takes the driver's settings as the trainer's workers do (defined here: pickled by value)
        def __init__(self) -> None:
            apply_driver_env()

    own = ray.remote(num_cpus=0)(Probe).options(runtime_env=worker_runtime_env({"NCCL_SOCKET_IFNAME": "ib0"}))
    probe = own.remote()
    try:
        assert seen(rollout._actors[0]) == SETTINGS
        assert seen(learners[0]) == SETTINGS
        assert seen(probe) == {**SETTINGS, "NCCL_SOCKET_IFNAME": "ib0"}
    finally:
        rollout.close()
        _close_workers(learners, placement, "")
