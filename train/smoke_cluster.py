"""The cluster tier of the GPU smoke checks (a Ray cluster of 2+ nodes with a GPU each, `--shared-dir` on storage
every node mounts): every node alive, with CUDA, the project and the shared folder; the tiny recipe with learners
and engines on the cluster, killed and resumed. An address nothing answers on fails each check in seconds, naming
it. Registered with `smoke_base.check`; `stare_agents.train.gpu_smoke` runs them."""

from __future__ import annotations

import argparse
import os
import secrets
import socket
from pathlib import Path
from typing import Any

from stare_agents.train.smoke_base import check, cluster_given, killed_and_resumed_with, needs_cluster

REACH_TIMEOUT_S = 5.0  # a cluster's head that does not answer within this is unreachable


def reach(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Connect to the head's port of `address` (HOST:PORT, ray://HOST:PORT, [IPv6]:PORT) within `timeout_s`, or
    raise naming the address: an unreachable cluster fails in seconds instead of waiting out a check's deadline
    in Ray's own retries. An address without a port (`auto`: this node's cluster) is left to Ray."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ConnectionError(
            f"cannot reach the cluster at {address} ({error}): is `ray start --head` running there, and is its port "
            "open from this machine? (--ray-address HOST:PORT or RAY_ADDRESS)"
        ) from None


def node_problems(answers: dict[str, dict[str, Any]], ray_gpus: dict[str, float]) -> list[str]:
    """What each node lacks for the cluster tier, from its probe's answer (`probe_node`) and the GPUs Ray counts
    there: a CUDA GPU (torch's count and Ray's), the shared folder."""
    problems = []
    for node, answer in sorted(answers.items()):
        lacks = []
        if answer["cuda"] < 1 or ray_gpus.get(node, 0) < 1:
            lacks.append(
                f"a GPU (torch sees {answer['cuda']}, Ray counts {ray_gpus.get(node, 0):g}; "
                "start Ray there with its GPUs: `ray start ... --num-gpus=N`)"
            )
        if not answer["shared"]:
            lacks.append(
                f"the shared folder ({answer['shared_error']}; mount it at the same path on every node)"
            )
        if lacks:
            problems.append(f"node {node} lacks " + " and ".join(lacks))
    return problems


def probe_node(marker: str, token: str) -> dict[str, Any]:
    """On one node: its CUDA devices, the project's path, and whether it reads `marker` (written by the check on
    the shared folder) with `token` in it."""
    import torch

    import stare_agents

    try:
        shared, error = Path(marker).read_text() == token, "it holds another marker"
    except OSError as failure:
        shared, error = False, f"cannot read {marker}: {failure.strerror or failure}"
    return {
        "cuda": torch.cuda.device_count(),
        "project": stare_agents.__file__,
        "shared": shared,
        "shared_error": None if shared else error,
    }


@check(
    "cluster_nodes",
    "cluster",
    120,
    needs_cluster,
    "every node: alive, a GPU, CUDA, the project import and the shared folder",
)
def check_cluster_nodes(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    reach(cluster_given(opts))
    from stare_agents.rollout.local_ray import init_ray

    init_ray(opts.ray_address)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) < 2:
        raise AssertionError(f"{len(nodes)} node(s) alive; the cluster tier needs 2+")
    token = secrets.token_hex(8)
    marker = Path(opts.shared_dir) / f".gpu-smoke-{token}"
    marker.write_text(token)
    remote = ray.remote(num_cpus=0.1)(probe_node)
    try:
        answers = {
            n["NodeManagerAddress"]: ray.get(
                remote.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                ).remote(str(marker), token),
                timeout=100,
            )
            for n in nodes
        }
    finally:
        marker.unlink(missing_ok=True)
    gpus = {n["NodeManagerAddress"]: n["Resources"].get("GPU", 0) for n in nodes}
    problems = node_problems(answers, gpus)
    if problems:
        raise AssertionError("; ".join(problems))
    return {"nodes": answers, "gpus": gpus}


@check(
    "cluster_tiny_run",
    "cluster",
    900,
    needs_cluster,
    "the tiny recipe on vLLM with learners and engines on the cluster",
)
def check_cluster_run(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    reach(cluster_given(opts))
    out = Path(opts.shared_dir) / f"gpu-smoke-{os.getpid()}"
    overrides = [
        "rollout.engine=vllm",
        "rollout.use_ray=true",
        "rollout.num_gpus_per_worker=1",
        "rollout.weight_sync=collective",
        "rl.learner_workers=2",
        "rl.learner_gpus_per_worker=1",
        *opts.train_args,
    ]
    # the cluster as RAY_ADDRESS: the key rollout.ray_address needs STARE_ALLOW_CONFIG_CODE=1 (a config's own)
    env = {"RAY_ADDRESS": opts.ray_address} if opts.ray_address else {}
    figures = killed_and_resumed_with(work, out, overrides, 880 * opts.deadline_scale, env)
    logs = "".join(p.read_text() for p in work.glob("*.log"))
    figures["sync_lines"] = [line for line in logs.splitlines() if "weight sync:" in line]
    return figures
