"""The node tier of the GPU smoke checks (2+ GPUs, vLLM and Ray): the NCCL weight sync from a learner on one GPU
into vLLM on another, a replaced rollout worker catching up, an engine sharded over two GPUs (tensor parallel 2),
the pipelined RL step, and the agent loop against plain generation. Registered with `smoke_base.check`;
`stare_agents.train.gpu_smoke` runs them."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stare_agents.train.smoke_base import (
    BENCH_ROLLOUT,
    check,
    engine_logprobs,
    killed_and_resumed,
    model_logprobs,
    needs_node,
    needs_node_and_checkout,
    perturb,
    rl_records,
    tiny_model,
)


def _node_ray() -> Any:
    from stare_agents.rollout.local_ray import init_ray

    init_ray("local")
    import ray

    return ray


def gpu_engine_spec(model_dir: Path, *, gpus: int) -> Any:
    """A float32 vLLM engine of the tiny model on `gpus` GPUs (tensor parallel over them), no sandbox."""
    from stare_agents.rollout import WorkerSpec  # here: the device tier's machines may lack Ray and vLLM

    kwargs = {"tensor_parallel_size": gpus} if gpus > 1 else {}
    return WorkerSpec(
        model=str(model_dir),
        engine="vllm",
        dtype="float32",
        max_model_len=256,
        sandbox="none",
        num_gpus=gpus,
        engine_kwargs={**kwargs, "gpu_memory_utilization": 0.3},
    )


def _vllm_pair(work: Path) -> tuple[Any, Any, Any]:
    """A learner on one GPU (a Ray actor) and a vLLM rollout worker on another, NCCL between them."""
    from stare_agents.algo import AlgorithmConfig
    from stare_agents.rollout import RolloutWorkerGroup
    from stare_agents.train.distributed import DistributedConfig, LearnerGroup
    from stare_agents.train.learner import LearnerConfig

    ray = _node_ray()
    model_dir = tiny_model(work)
    learner = LearnerGroup(
        model_dir,
        AlgorithmConfig.preset("grpo"),
        LearnerConfig(),
        DistributedConfig(num_workers=1, num_gpus_per_worker=1),
    )
    return ray, learner, RolloutWorkerGroup(gpu_engine_spec(model_dir, gpus=1), use_ray=True)


def _remote_gap(ray: Any, learner: Any, group: Any) -> float:
    """The largest difference between the engine's sampling log-probs and the learner's for the same tokens."""
    prompt = list(range(5, 25))
    sampled, rollout = ray.get(
        group._actors[0].__ray_call__.remote(lambda w: engine_logprobs(w.engine, prompt))
    )
    now = ray.get(
        learner.workers[0].__ray_call__.remote(
            lambda w: model_logprobs(
                w.learner.model, prompt, sampled, str(next(w.learner.model.parameters()).device)
            )
        )
    )
    return float((rollout - now).abs().max())


@check(
    "nccl_sync_into_vllm",
    "node",
    300,
    needs_node,
    "NCCL weight sync from a learner GPU into vLLM on another GPU",
)
def check_nccl_sync(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    ray, learner, group = _vllm_pair(work)
    figures: dict[str, Any] = {}
    try:
        for version in (1, 2):
            ray.get(learner.workers[0].__ray_call__.remote(lambda w, v=version: perturb(w.learner.model, v)))
            started = time.perf_counter()
            if group.update_weights_from(learner.sender) != version:
                raise AssertionError(f"sync {version}: the group reports another version")
            figures[f"sync_{version}_s"] = round(time.perf_counter() - started, 3)
            figures[f"sync_{version}_max_logprob_diff"] = gap = _remote_gap(ray, learner, group)
            if gap > 2e-2:
                raise AssertionError(f"after sync {version} the engine is {gap:.3f} nats from the learner")
        figures["backend"] = group._sync_group.backend
        if figures["backend"] != "nccl":
            raise AssertionError(f"the sync group used {figures['backend']}, not NCCL")
    finally:
        group.close()
        learner.close()
    return figures


@check(
    "replaced_worker_catches_up",
    "node",
    300,
    needs_node,
    "a killed vLLM worker is replaced and gets the weights",
)
def check_catch_up(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    ray, learner, group = _vllm_pair(work)
    try:
        ray.get(learner.workers[0].__ray_call__.remote(lambda w: perturb(w.learner.model, 1)))
        group.update_weights_from(learner.sender)
        ray.kill(group._actors[0])
        started = time.perf_counter()
        group._replace(0)  # what a collect does for a dead worker
        seconds = time.perf_counter() - started
        version = group.ping()[0]["weight_version"]
        gap = _remote_gap(ray, learner, group)
        if version != 1 or gap > 2e-2:
            raise AssertionError(f"the replacement holds version {version}, {gap:.3f} nats from the learner")
    finally:
        group.close()
        learner.close()
    return {"replace_and_catch_up_s": round(seconds, 1), "max_logprob_diff": gap}


@check(
    "tensor_parallel_2",
    "node",
    300,
    needs_node,
    "a vLLM engine sharded over 2 GPUs in one Ray worker (multiprocessing executor), weights pushed, log-probs",
)
def check_tensor_parallel(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One rollout worker on two GPUs with tensor_parallel_size 2 (vLLM's multiprocessing executor inside the
    Ray actor: its Ray executor fails in the actor's one placement bundle); new weights reach both shards: the
    engine's sampling log-probs match the same weights' on the CPU."""
    from stare_agents.rollout import RolloutWorkerGroup
    from stare_agents.train.policy import load_causal_lm

    ray = _node_ray()
    model_dir = tiny_model(work)  # 2 attention heads: one a GPU
    model = load_causal_lm(model_dir)  # float32, on the CPU
    perturb(model, 3)  # weights the engine did not load: they must come through the push
    group = RolloutWorkerGroup(gpu_engine_spec(model_dir, gpus=2), use_ray=True)
    try:
        started = time.perf_counter()
        group.update_weights(model.state_dict(), version=1)
        sync_s = time.perf_counter() - started
        prompt = list(range(5, 25))
        sampled, rollout = ray.get(
            group._actors[0].__ray_call__.remote(lambda w: engine_logprobs(w.engine, prompt))
        )
        gap = float((rollout - model_logprobs(model, prompt, sampled, "cpu")).abs().max())
        version = group.ping()[0]["weight_version"]
        if version != 1 or gap > 2e-2:
            raise AssertionError(
                f"the sharded engine holds version {version}, {gap:.3f} nats from the weights"
            )
    finally:
        group.close()
    return {"tensor_parallel_size": 2, "sync_s": round(sync_s, 3), "max_logprob_diff": gap}


@check(
    "pipelined_step",
    "node",
    420,
    needs_node,
    "the tiny recipe on vLLM, rl.pipeline=one-step, killed and resumed",
)
def check_pipelined(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    overrides = [
        "rollout.engine=vllm",
        "rollout.use_ray=true",
        "rollout.num_gpus_per_worker=1",
        "rollout.gpu_memory_utilization=0.3",
        "rl.pipeline=one-step",
        "rl.learner.importance.cap=2.0",
    ]
    figures = killed_and_resumed(work, work / "run", overrides, 410 * opts.deadline_scale)
    stale = [r.get("rollout/staleness_mean") for r in rl_records(work / "run")]
    return {**figures, "staleness": stale}


@check(
    "loop_vs_plain_generation",
    "node",
    600,
    needs_node_and_checkout,
    "benchmarks/bench_rollout.py on SmolLM2 with vLLM on a GPU",
)
def check_loop_vs_plain(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / "bench_rollout.json"
    # the benchmark times the Docker sandbox: no quiet switch to another backend
    if not shutil.which("docker"):
        raise RuntimeError(
            "no docker command: provision Docker first (as root: bash scripts/provision_docker.sh)"
        )
    command = [sys.executable, str(BENCH_ROLLOUT), "--model", "smollm2-135m"]
    command += [
        "--dtype",
        "bfloat16",
        "--episodes",
        "64",
        "--sandbox",
        "docker",
        "--json",
        str(out),
        "--multiprocess",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=590)
    if done.returncode != 0:
        raise AssertionError(f"bench_rollout.py failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"sandbox": "docker", "bench_rollout": json.loads(out.read_text())}
