"""Ray placement groups for the trainer's actors: rollout workers and learner workers each get a group of
bundles (one per worker), placed by a Ray strategy, so that a cluster run keeps a learner's ranks together
(PACK) or spreads rollout engines over nodes (SPREAD) as the config says, instead of wherever Ray finds room.

    group = reserve([{"CPU": 1, "GPU": 1}] * 8, "PACK", what="learner workers", timeout_s=600)
    actor_class.options(scheduling_strategy=bundle(group, i), ...)
"""

from __future__ import annotations

from typing import Any, Literal

Placement = Literal["none", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
PLACEMENTS: tuple[str, ...] = ("none", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
RAY_OWN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def check_custom_resources(resources: dict[str, float], key: str) -> None:
    """Custom Ray resources a worker asks for (`ray start --resources` names them on the nodes): names other than
    Ray's own (CPU, GPU, memory: their keys are elsewhere), amounts > 0."""
    if not isinstance(resources, dict):
        raise ValueError(
            f"{key}={resources!r}: allowed: a mapping of resource name to amount, e.g. {{node_a: 1}}"
        )
    for name, amount in resources.items():
        if not isinstance(name, str) or name in RAY_OWN_RESOURCES:
            raise ValueError(
                f"{key}: {name!r} is not a custom resource; CPUs and GPUs have their own keys "
                f"(allowed: names other than {', '.join(RAY_OWN_RESOURCES)})"
            )
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not 0 < amount < float("inf"):
            raise ValueError(f"{key}.{name}={amount!r}: allowed: an amount > 0")


def reserve(bundles: list[dict[str, float]], strategy: str, *, what: str, timeout_s: float = 600.0) -> Any:
    """A placement group of `bundles` (one per worker; zero resources left out) with Ray's `strategy`, ready to
    use; None for strategy "none". A group the cluster cannot place within `timeout_s` is removed and is an
    error that says what was asked."""
    if strategy not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {strategy!r}")
    if strategy == "none":
        return None
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    cleaned = [{k: float(v) for k, v in b.items() if v} or {"CPU": 0.01} for b in bundles]
    group = placement_group(cleaned, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise RuntimeError(
            f"Ray could not place the {what} within {timeout_s:g} s: {len(cleaned)} bundles of {cleaned[0]} with "
            f"strategy {strategy} (cluster resources: {ray.cluster_resources()}); use a strategy the cluster "
            "can satisfy (e.g. PACK instead of STRICT_SPREAD on one node) or fewer workers"
        )
    return group


def bundle(group: Any, index: int) -> Any:
    """The scheduling strategy that puts an actor in bundle `index` of `group` (None: Ray's default)."""
    if group is None:
        return None
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=index, placement_group_capture_child_tasks=True
    )


def release(group: Any) -> None:
    if group is not None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)
