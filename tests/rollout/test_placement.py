"""Ray placement groups from the config: rollout and learner workers each in a group of bundles placed by
the strategy asked for (a replaced worker goes back to its bundle), released on close; a strategy the
cluster cannot satisfy is a clear error, not a hang."""

from __future__ import annotations

import sys

import pytest

from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec
from stare_agents.rollout.placement import reserve


@pytest.fixture(scope="module")
def ray_cluster(local_ray):
    """The folder's shared local Ray (4 CPUs, one node: tests/conftest.py); _groups_of's function runs in its
    actors."""
    local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return local_ray


def _groups_of(ray, actors) -> list[str | None]:
    """The placement group each actor runs in, as the actor itself sees it."""

    def own_group(_worker):
        import ray as actor_ray

        return actor_ray.get_runtime_context().get_placement_group_id()

    return ray.get([actor.__ray_call__.remote(own_group) for actor in actors])


def _state(ray, group) -> str:
    return ray.util.placement_group_table(group)["state"]


def test_rollout_workers_live_in_their_placement_group(ray_cluster, tiny_model):
    ray = ray_cluster
    spec = WorkerSpec(
        model=str(tiny_model),
        engine="hf",
        dtype="float32",
        max_model_len=256,
        sandbox="none",
        num_cpus=0.5,
        placement="PACK",
    )
    workers = RolloutWorkerGroup(spec, num_workers=2)
    group = workers._placement
    try:
        assert _state(ray, group) == "CREATED"
        assert _groups_of(ray, workers._actors) == [group.id.hex()] * 2
        dead = workers._actors[1]
        workers._replace(1)  # a replaced worker takes its bundle back
        assert workers._actors[1] is not dead and _groups_of(ray, workers._actors) == [group.id.hex()] * 2
    finally:
        workers.close()
    assert _state(ray, group) == "REMOVED"


def test_learner_workers_live_in_their_placement_group(ray_cluster, tiny_model):
    ray = ray_cluster
    from stare_agents.algo import AlgorithmConfig
    from stare_agents.train.distributed import DistributedConfig, LearnerGroup
    from stare_agents.train.learner import LearnerConfig

    distributed = DistributedConfig(num_workers=2, num_cpus_per_worker=0.5, placement="STRICT_PACK")
    learner = LearnerGroup(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig(), distributed)
    group = learner._placement
    try:
        assert _groups_of(ray, learner.workers) == [group.id.hex()] * 2
    finally:
        learner.close()
    assert _state(ray, group) == "REMOVED"


def test_a_placement_the_cluster_cannot_satisfy_is_an_error(ray_cluster):
    with pytest.raises(RuntimeError, match=r"could not place the learner workers .* STRICT_SPREAD"):
        reserve([{"CPU": 1}] * 2, "STRICT_SPREAD", what="learner workers", timeout_s=3)  # one node here
    with pytest.raises(ValueError, match="placement must be one of"):
        reserve([{"CPU": 1}], "EVERYWHERE", what="x")
    assert reserve([{"CPU": 1}], "none", what="x") is None
