"""The driver's NCCL and gloo settings reach every Ray worker the trainer starts (issue 29, item 6).

On a cluster a worker gets the environment of its node's raylet (what `ray start` had there), not the
driver's: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME set for the trainer would never reach the learner ranks and
engines that open the sockets. The trainer passes NCCL_*, TORCH_NCCL_* and GLOO_SOCKET_IFNAME in each actor's
`runtime_env`. The test sets them only after Ray started (so no worker inherits them from the raylet) and reads
them back inside a rollout worker and a learner worker.
"""

from __future__ import annotations

import os

import pytest

from stare_agents.rollout.local_ray import forwarded_env

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
    try:
        assert seen(rollout._actors[0]) == SETTINGS
        assert seen(learners[0]) == SETTINGS
    finally:
        rollout.close()
        _close_workers(learners, placement, "")
