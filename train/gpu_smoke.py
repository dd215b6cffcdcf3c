"""GPU smoke checks for a lent machine: one command, one JSON report, every check with a deadline.

    stare-agents gpu-smoke --tier device --out gpu_smoke.json     # one GPU, <= 8 minutes; torch + transformers
    stare-agents gpu-smoke --tier node                            # 2+ GPUs, vLLM and Ray
    RAY_ADDRESS=HEAD:6379 stare-agents gpu-smoke --tier cluster   # a Ray cluster of 2+ nodes

It ships in the package (`python -m stare_agents.train.gpu_smoke` is the same command), so an installed wheel runs
it on a machine that has only torch and transformers besides the package's pure-Python dependencies; what such a
machine cannot run is skipped with the reason (vLLM or Ray missing, one GPU, no checkout for a benchmark script).

Tiers (each runs only its own checks; `--tier all` runs the three):
- device (torch only, the tiny model, the deadlines add up to 8 minutes): the GPU itself; the learner in fp32
  and bf16; the learner sharded with FSDP2 against the same step unsharded; a checkpoint round trip; the
  collectives the project uses (all-reduce, all-gather, broadcast on the device's backend, and the weight-sync
  group's bucketed broadcast); the weight sync into the HF engine on the GPU; three RL steps of the tiny recipe
  and a resume after SIGKILL.
- node (2+ GPUs, vLLM and Ray): the NCCL weight sync from a learner on one GPU into vLLM on another; a replaced
  rollout worker catching up; the pipelined (one-step off-policy) RL step; the agent loop against plain
  generation (benchmarks/bench_rollout.py).
- cluster (RAY_ADDRESS or --ray-address; 2+ nodes): every node runs CUDA and imports the project; the tiny
  recipe with learners on one node and engines on another (pass the custom resources with --train-args).

Each check runs in a process of its own, killed at its deadline (status "timeout"); a check whose needs are not
met (no CUDA, one GPU, no vLLM, no cluster) is "skipped" with the reason. Status words: passed, failed,
skipped, timeout. `--device cpu` runs the device tier's checks on the CPU (gloo instead of NCCL): a rehearsal
on a machine without a GPU (tests/test_gpu_smoke.py runs it from a built wheel). The exit status is 0 when nothing
failed or timed out.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

CHECKOUT = (
    Path(__file__).resolve().parents[1]
)  # the repository, when this runs from a checkout (train/ is in it)
BENCH_ROLLOUT = CHECKOUT / "benchmarks" / "bench_rollout.py"  # not in the package: the node tier's last check
MODULE = "stare_agents.train.gpu_smoke"  # each check runs as `python -m MODULE --child NAME`
STATUSES = ("passed", "failed", "skipped", "timeout")
TIERS = ("device", "node", "cluster")


# ---- what a check needs ------------------------------------------------------------------------------------
def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def needs_device(opts: argparse.Namespace) -> str | None:
    if opts.device == "cpu":
        return None
    return None if _cuda_count() >= 1 else "no CUDA device (torch.cuda.is_available() is False)"


def needs_node(opts: argparse.Namespace) -> str | None:
    """Every unmet need of the node tier, in one reason (a machine short of GPUs may also lack vLLM)."""
    gpus = _cuda_count()
    reasons = [f"needs 2+ CUDA GPUs, found {gpus}"] if gpus < 2 else []
    missing = [name for name in ("vllm", "ray") if not _module(name)]
    reasons += [f"needs {' and '.join(missing)} installed"] if missing else []
    return "; ".join(reasons) or None


def needs_node_and_checkout(opts: argparse.Namespace) -> str | None:
    reasons = [r for r in (needs_node(opts),) if r]
    if not BENCH_ROLLOUT.is_file():
        reasons.append(
            "needs benchmarks/bench_rollout.py, which is in the repository, not the installed package: run it "
            "from a checkout"
        )
    return "; ".join(reasons) or None


def needs_cluster(opts: argparse.Namespace) -> str | None:
    if not (opts.ray_address or os.environ.get("RAY_ADDRESS")):
        return "no cluster: give --ray-address HOST:PORT or RAY_ADDRESS"
    return None if _module("ray") else "needs ray installed"


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    tier: str
    deadline_s: float
    needs: Callable[[argparse.Namespace], str | None]
    run: Callable[[argparse.Namespace, Path], dict[str, Any]]  # figures; raises on failure
    what: str


CHECKS: list[Check] = []


def check(name: str, tier: str, deadline_s: float, needs: Callable, what: str) -> Callable:
    def register(run: Callable) -> Callable:
        CHECKS.append(Check(name, tier, deadline_s, needs, run, what))
        return run

    return register


# ---- helpers shared by the checks --------------------------------------------------------------------------
def _device(opts: argparse.Namespace) -> str:
    return "cpu" if opts.device == "cpu" else "cuda"


def _tiny(work: Path) -> Path:
    from stare_agents.models import prepare_model

    return prepare_model("tiny", out=work / "tiny")


def _step_inputs(seed: int = 0, groups: int = 2, group_size: int = 4) -> tuple[Any, Any]:
    """A step batch of synthetic trajectories (varied lengths, an observation span, binary rewards) and its
    GRPO advantages."""
    import torch

    from stare_agents.algo import AlgorithmConfig, compute_advantages
    from stare_agents.trajectory import Trajectory, collate

    gen = torch.Generator().manual_seed(seed)
    trajectories = []
    for g in range(groups):
        prompt = torch.randint(1, 500, (8 + g,), generator=gen).tolist()
        for i in range(group_size):
            length = 12 + 5 * i
            mask = [0 if 4 <= j < 7 else 1 for j in range(length)]
            trajectories.append(
                Trajectory(
                    prompt_ids=prompt,
                    response_ids=torch.randint(1, 500, (length,), generator=gen).tolist(),
                    action_mask=mask,
                    rollout_logprobs=[-3.0 * bit for bit in mask],
                    reward=float((g + i) % 2),
                    group_id=f"g{g}",
                    sample_index=i,
                    task_id=f"t{g}",
                )
            )
    batch = collate(trajectories, pad_token_id=0)
    groups_ = [t.group_id for t in trajectories]
    return batch, compute_advantages(batch.rewards, groups_, AlgorithmConfig.preset("grpo")).advantages


def _learner(model_dir: Path, device: str, **config: Any) -> Any:
    from stare_agents.algo import AlgorithmConfig
    from stare_agents.train.learner import Learner, LearnerConfig
    from stare_agents.train.policy import OptimizerConfig

    learner_config = LearnerConfig(optimizer=OptimizerConfig(lr=1e-3, eps=1e-5), device=device, **config)
    return Learner.from_pretrained(model_dir, AlgorithmConfig.preset("grpo"), learner_config)


def _finite(metrics: dict[str, float], *names: str) -> None:
    import math

    bad = {n: metrics.get(n) for n in names if not math.isfinite(metrics.get(n, float("nan")))}
    if bad:
        raise AssertionError(f"non-finite learner figures: {bad}")


def _single_rank_group(backend: str, work: Path) -> None:
    import torch.distributed as dist

    from stare_agents.train.distributed import join_process_group

    join_process_group(f"file://{work / 'pg-store'}", backend, 0, 1)
    if not dist.is_initialized():
        raise AssertionError("the process group did not start")


def _logprobs(model: Any, prompt: list[int], sampled: list[int], device: str) -> Any:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + sampled], device=device)).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(sampled, device=device)[:, None])[:, 0].cpu()


def _engine_logprobs(engine: Any, prompt: list[int]) -> tuple[list[int], Any]:
    import asyncio

    import torch

    from stare_agents.rollout.engine import SamplingParams

    generation = asyncio.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=12)))
    return list(generation.token_ids), torch.tensor(generation.logprobs)


def _perturb(model: Any, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=generator) * 0.05).to(p.device))


def _train(work: Path, out: Path, *overrides: str, resume: bool = False, env: dict | None = None) -> Any:
    command = [sys.executable, "-m", "stare_agents.cli", "train", "--recipe", "tiny", "--out", str(out)]
    command += ["sft.enabled=false", "rollout.sandbox=none", "eval.num_tasks=2", *overrides]
    command += ["--resume"] if resume else []
    log = (work / f"{out.name}{'-resumed' if resume else ''}.log").open("w")
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def _rl_records(run: Path) -> list[dict]:
    from stare_agents.records import read_records

    return read_records(run / "metrics.jsonl", "rl")


def _killed_and_resumed(work: Path, run: Path, overrides: list[str], deadline_s: float) -> dict[str, Any]:
    """The tiny recipe (rl.steps=3) SIGKILLed once its step-2 checkpoint exists, then resumed to the end."""
    from stare_agents.train.checkpoint import latest_checkpoint

    started = time.monotonic()
    first = _train(work, run, "rl.steps=3", *overrides)
    while latest_checkpoint(run) is None or latest_checkpoint(run).name < "step-00000002":
        if first.poll() is not None:
            raise AssertionError(f"the run ended (exit {first.returncode}) before its step-2 checkpoint")
        if time.monotonic() - started > deadline_s:
            raise AssertionError("no step-2 checkpoint in time")
        time.sleep(0.02)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed = time.monotonic() - started
    second = _train(work, run, "rl.steps=3", *overrides, resume=True)
    if second.wait(timeout=max(1.0, deadline_s - killed)) != 0:
        raise AssertionError(f"the resumed run failed (exit {second.returncode}); see {work}")
    records = _rl_records(run)
    steps = [r["step"] for r in records]
    if steps != [0, 1, 2] or latest_checkpoint(run).name != "step-00000003":
        raise AssertionError(f"after the resume: steps {steps}, last checkpoint {latest_checkpoint(run)}")
    return {
        "seconds_to_kill": round(killed, 1),
        "rollout_s": [r.get("time/rollout_s") for r in records],
        "update_s": [r.get("time/update_s") for r in records],
        "sync_s": [r.get("time/sync_s") for r in records],
        "weight_versions": [r.get("rollout/weight_version") for r in records],
    }


# ---- device tier (one GPU, torch only) ---------------------------------------------------------------------
@check("device", "device", 30, needs_device, "the device: name, memory, bf16, a matmul")
def check_device(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    device = _device(opts)
    a = torch.randn(1024, 1024, device=device)
    started = time.perf_counter()
    for _ in range(10):
        (a @ a).sum().item()
    figures: dict[str, Any] = {
        "torch": torch.__version__,
        "matmul_1024_ms": 100 * (time.perf_counter() - started),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        figures.update(
            name=props.name,
            capability=list(torch.cuda.get_device_capability(0)),
            memory_gib=round(props.total_memory / 2**30, 1),
            bf16=torch.cuda.is_bf16_supported(),
            cuda=torch.version.cuda,
            gpus=torch.cuda.device_count(),
        )
    return figures


@check(
    "learner_precision",
    "device",
    60,
    needs_device,
    "a learner step in fp32, bf16 and fp16 (with its loss scale); their log-prob distances",
)
def check_learner_precision(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    device = _device(opts)
    model_dir = _tiny(work)
    batch, advantages = _step_inputs()
    figures: dict[str, Any] = {}
    prompt, sampled = list(range(5, 25)), list(range(30, 42))
    logps = {}
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for precision in ("fp32", "bf16", "fp16"):
        learner = _learner(model_dir, device, precision=precision)
        with torch.autocast(device, dtype=half.get(precision, torch.bfloat16), enabled=precision in half):
            logps[precision] = _logprobs(learner.model, prompt, sampled, device)
        metrics = learner.step(batch, advantages)
        _finite(metrics, "learner/loss", "learner/grad_norm", "learner/entropy")
        figures[f"{precision}_loss"] = metrics["learner/loss"]
        figures[f"{precision}_grad_norm"] = metrics["learner/grad_norm"]
    figures["fp16_loss_scale"] = metrics["learner/loss_scale"]
    for precision in half:
        distance = float((logps["fp32"] - logps[precision]).abs().max())
        figures[f"{precision}_vs_fp32_max_logprob_diff"] = distance
        # bf16 keeps 8 significant bits, fp16 11: a tiny model's log-probs agree to a few hundredths
        if not distance < 0.25:
            raise AssertionError(f"{precision} log-probs {distance:.3f} nats from fp32's")
    return figures


@check("learner_sharding", "device", 60, needs_device, "FSDP2 over one rank against the same step unsharded")
def check_learner_sharding(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    from stare_agents.algo import AlgorithmConfig
    from stare_agents.train.distributed import ProcessGroupCollective, _fully_shard
    from stare_agents.train.learner import Learner, LearnerConfig
    from stare_agents.train.policy import OptimizerConfig, load_causal_lm

    device = _device(opts)
    model_dir = _tiny(work)
    batch, advantages = _step_inputs()
    plain = _learner(model_dir, device).step(batch, advantages)
    _single_rank_group("nccl" if device == "cuda" else "gloo", work)
    config = LearnerConfig(optimizer=OptimizerConfig(lr=1e-3, eps=1e-5), device=device)
    sharded_learner = Learner(
        load_causal_lm(model_dir, device),
        AlgorithmConfig.preset("grpo"),
        config,
        collective=ProcessGroupCollective(shards_gradients=True),
        shard=_fully_shard,
    )
    sharded = sharded_learner.step(batch, advantages)
    _finite(sharded, "learner/loss", "learner/grad_norm")
    diff = {k: abs(plain[k] - sharded[k]) for k in ("learner/loss", "learner/grad_norm", "learner/entropy")}
    if max(diff.values()) > 1e-3 * max(1.0, abs(plain["learner/grad_norm"])):
        raise AssertionError(f"the sharded step differs from the plain one: {diff}")
    return {"differences": diff}


@check(
    "checkpoint_round_trip",
    "device",
    45,
    needs_device,
    "a learner's state saved, loaded into another, same step",
)
def check_checkpoint(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    device = _device(opts)
    model_dir = _tiny(work)
    batch, advantages = _step_inputs()
    first = _learner(model_dir, device)
    first.step(batch, advantages)
    torch.save(first.state_dict(), work / "learner.pt")
    second = _learner(model_dir, device)
    _perturb(second.model, 7)  # other weights: all must come from the file
    second.load_state_dict(torch.load(work / "learner.pt", weights_only=False))
    a, b = first.step(batch, advantages), second.step(batch, advantages)
    sa, sb = first.model.state_dict(), second.model.state_dict()
    diff = max(float((sa[k] - sb[k]).abs().max()) for k in sa)
    if diff > 1e-5 or abs(a["learner/loss"] - b["learner/loss"]) > 1e-5:
        raise AssertionError(
            f"after the round trip: weights {diff:.2e} apart, losses {a['learner/loss']}, {b['learner/loss']}"
        )
    return {"max_weight_diff": diff}


@check(
    "collectives",
    "device",
    45,
    needs_device,
    "all-reduce, all-gather, broadcast; the sync group's bucketed broadcast",
)
def check_collectives(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    import threading

    import torch
    import torch.distributed as dist

    from stare_agents.rollout.weight_sync import (
        SyncGroup,
        WeightsPlan,
        open_group,
        receive_weights,
        send_weights,
    )

    device = _device(opts)
    _single_rank_group("nccl" if device == "cuda" else "gloo", work)
    x = torch.arange(4.0, device=device)
    dist.all_reduce(x)
    gathered = [torch.empty_like(x)]
    dist.all_gather(gathered, x)
    dist.broadcast(x, src=0)
    if not torch.equal(gathered[0].cpu(), torch.arange(4.0)):
        raise AssertionError(f"all_gather gave {gathered[0]}")
    # the weight-sync group: two ranks in this process (gloo: NCCL refuses two ranks on one GPU)
    tensors = {f"w{i}": torch.randn(1024, 1024, device=device) for i in range(16)}  # 64 MiB in fp32
    plan = WeightsPlan.of(
        ((n, t.shape) for n, t in tensors.items()), dtype=torch.float32, version=1, bucket_mb=16
    )
    address, store = open_group("127.0.0.1", 2, "gloo", 60.0)
    received: dict[str, torch.Tensor] = {}

    def receive() -> None:
        member = SyncGroup(address, 1)
        received.update((n, t.clone()) for n, t in receive_weights(member, plan))
        member.close()

    thread = threading.Thread(target=receive)
    thread.start()
    sender = SyncGroup(address, 0, store=store)
    started = time.perf_counter()
    send_weights(sender, plan, tensors.values())
    thread.join(60)
    seconds = time.perf_counter() - started
    sender.close()
    if set(received) != set(tensors) or any(not torch.equal(received[n], tensors[n].cpu()) for n in tensors):
        raise AssertionError("the bucketed broadcast delivered other tensors than were sent")
    return {"sync_broadcast_gib_per_s": round(64 / 1024 / seconds, 3), "buckets": len(plan.buckets)}


@check(
    "sync_into_hf_engine",
    "device",
    60,
    needs_device,
    "learner -> HF engine on the device, collective and driver paths",
)
def check_sync_into_hf(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec

    device = _device(opts)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    model_dir = _tiny(work)
    learner = _learner(model_dir, device)
    spec = WorkerSpec(model=str(model_dir), engine="hf", dtype="float32", max_model_len=256, sandbox="none")
    group = RolloutWorkerGroup(spec, use_ray=False)
    figures: dict[str, Any] = {}
    try:
        engine = group._local.engine
        if engine.device.type != device:
            raise AssertionError(f"the HF engine is on {engine.device}, not {device}")
        prompt = list(range(5, 25))
        for version, path in ((1, "collective"), (2, "driver"), (3, "collective")):
            _perturb(learner.model, version)
            started = time.perf_counter()
            if path == "collective":
                group.update_weights_from(learner.sender)
            else:
                group.update_weights(learner.model_state_dict())
            figures[f"sync_{version}_{path}_s"] = round(time.perf_counter() - started, 3)
            sampled, rollout = _engine_logprobs(engine, prompt)
            now = _logprobs(learner.model, prompt, sampled, device)
            gap = float((rollout - now).abs().max())
            figures[f"sync_{version}_max_logprob_diff"] = gap
            if gap > 1e-2 or engine.weight_version != version:
                raise AssertionError(
                    f"after sync {version} ({path}): version {engine.weight_version}, gap {gap:.2e}"
                )
    finally:
        group.close()
    return figures


@check(
    "rl_steps_and_resume", "device", 180, needs_device, "three RL steps of the tiny recipe, SIGKILL, resume"
)
def check_rl_steps(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    overrides = ["rollout.use_ray=false", "rollout.engine=hf"]
    env = {"CUDA_VISIBLE_DEVICES": ""} if opts.device == "cpu" else {}
    return _killed_and_resumed_env(work, work / "run", overrides, 170 * opts.deadline_scale, env)


def _killed_and_resumed_env(
    work: Path, run: Path, overrides: list[str], deadline_s: float, env: dict
) -> dict:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _killed_and_resumed(work, run, overrides, deadline_s)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- node tier (2+ GPUs, vLLM and Ray) ---------------------------------------------------------------------
def _node_ray() -> Any:
    from stare_agents.rollout.local_ray import init_ray

    init_ray("local")
    import ray

    return ray


def _vllm_pair(work: Path) -> tuple[Any, Any, Any]:
    """A learner on one GPU (a Ray actor) and a vLLM rollout worker on another, NCCL between them."""
    from stare_agents.algo import AlgorithmConfig
    from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec
    from stare_agents.train.distributed import DistributedConfig, LearnerGroup
    from stare_agents.train.learner import LearnerConfig

    ray = _node_ray()
    model_dir = _tiny(work)
    learner = LearnerGroup(
        model_dir,
        AlgorithmConfig.preset("grpo"),
        LearnerConfig(),
        DistributedConfig(num_workers=1, num_gpus_per_worker=1),
    )
    spec = WorkerSpec(
        model=str(model_dir),
        engine="vllm",
        dtype="float32",
        max_model_len=256,
        sandbox="none",
        num_gpus=1,
        engine_kwargs={"gpu_memory_utilization": 0.3},
    )
    return ray, learner, RolloutWorkerGroup(spec, use_ray=True)


def _remote_gap(ray: Any, learner: Any, group: Any) -> float:
    """The largest difference between the engine's sampling log-probs and the learner's for the same tokens."""
    prompt = list(range(5, 25))
    sampled, rollout = ray.get(
        group._actors[0].__ray_call__.remote(lambda w: _engine_logprobs(w.engine, prompt))
    )
    now = ray.get(
        learner.workers[0].__ray_call__.remote(
            lambda w: _logprobs(
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
            ray.get(learner.workers[0].__ray_call__.remote(lambda w, v=version: _perturb(w.learner.model, v)))
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
        ray.get(learner.workers[0].__ray_call__.remote(lambda w: _perturb(w.learner.model, 1)))
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
    figures = _killed_and_resumed(work, work / "run", overrides, 410 * opts.deadline_scale)
    stale = [r.get("rollout/staleness_mean") for r in _rl_records(work / "run")]
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


# ---- cluster tier (2+ nodes) -------------------------------------------------------------------------------
@check(
    "cluster_nodes", "cluster", 120, needs_cluster, "every node: alive, its GPUs, CUDA and the project import"
)
def check_cluster_nodes(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    from stare_agents.rollout.local_ray import init_ray

    init_ray(opts.ray_address)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) < 2:
        raise AssertionError(f"{len(nodes)} node(s) alive; the cluster tier needs 2+")

    def probe() -> dict[str, Any]:
        import torch

        import stare_agents

        return {"cuda": torch.cuda.device_count(), "project": stare_agents.__file__}

    remote = ray.remote(num_cpus=0.1)(probe)
    answers = {
        n["NodeManagerAddress"]: ray.get(
            remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(),
            timeout=100,
        )
        for n in nodes
    }
    return {"nodes": answers, "gpus": {n["NodeManagerAddress"]: n["Resources"].get("GPU", 0) for n in nodes}}


@check(
    "cluster_tiny_run",
    "cluster",
    900,
    needs_cluster,
    "the tiny recipe on vLLM with learners and engines on the cluster",
)
def check_cluster_run(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = Path(opts.shared_dir or work) / f"gpu-smoke-{os.getpid()}"
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
    figures = _killed_and_resumed_env(work, out, overrides, 880 * opts.deadline_scale, env)
    logs = "".join(p.read_text() for p in work.glob("*.log"))
    figures["sync_lines"] = [line for line in logs.splitlines() if "weight sync:" in line]
    return figures


# ---- the runner --------------------------------------------------------------------------------------------
def run_child(opts: argparse.Namespace) -> None:
    """One check, in this (child) process: its figures or its error, as JSON in --result."""
    found = next(c for c in CHECKS if c.name == opts.child)
    work = Path(opts.work)
    try:
        result = {"status": "passed", "figures": found.run(opts, work)}
    except Exception as error:  # the report says what failed; the runner goes on with the next check
        result = {
            "status": "failed",
            "reason": f"{type(error).__name__}: {error}",
            "trace": traceback.format_exc()[-3000:],
        }
    from stare_agents.jsonl import dumps

    Path(opts.result).write_text(dumps(result))
    os._exit(0)  # no waiting on threads a check left behind (engines, process groups)


def run_check(found: Check, opts: argparse.Namespace, root: Path) -> dict[str, Any]:
    deadline_s = found.deadline_s * opts.deadline_scale
    record: dict[str, Any] = {
        "name": found.name,
        "tier": found.tier,
        "what": found.what,
        "deadline_s": deadline_s,
    }
    reason = found.needs(opts)
    if reason is not None:
        return {**record, "status": "skipped", "reason": reason}
    work = root / found.name
    work.mkdir(parents=True)
    result = work / "result.json"
    command = [
        sys.executable,
        "-m",
        MODULE,
        "--child",
        found.name,
        "--work",
        str(work),
        "--result",
        str(result),
    ]
    command += [
        "--device",
        opts.device,
        "--ray-address",
        opts.ray_address or "",
        f"--deadline-scale={opts.deadline_scale}",
    ]
    command += ["--shared-dir", opts.shared_dir or ""] + [f"--train-arg={a}" for a in opts.train_args]
    started = time.monotonic()
    with (work / "output.log").open("w") as log:
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work
        )
        try:
            child.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    record["seconds"] = round(time.monotonic() - started, 1)
    with_children = _end_descendants()
    if result.is_file():
        record.update(json.loads(result.read_text()))
    elif record["seconds"] >= deadline_s:
        record.update(status="timeout", reason=f"not done within {deadline_s:g} s (killed)")
    else:
        tail = (work / "output.log").read_text()[-3000:]
        record.update(
            status="failed", reason=f"the check's process ended with {child.returncode}", output_tail=tail
        )
    if with_children:
        record["processes_left_and_ended"] = with_children
    return record


def _become_subreaper() -> bool:
    """Make this process the one that inherits whatever a check leaves behind.

    A check starts processes in sessions of their own (a training run it kills as a machine would die, an engine
    core, a Ray worker). Killing the check's process group does not reach them, and once the check is dead they
    would be re-parented to init, out of sight. As a child subreaper (Linux), this process inherits them instead,
    so `_end_descendants` finds and ends them after each check. Returns False where the kernel has no such flag.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER


def _end_descendants() -> int:
    """SIGKILL every process below this one (checks run one at a time, so all are the last check's) and reap
    them; returns how many there were. Repeats until none is left, for a process that forked while its parent
    was being killed."""
    ended: set[int] = set()
    for _ in range(100):
        left = []
        for process in psutil.Process().children(recursive=True):
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    process.kill()
                    left.append(process)
            except psutil.NoSuchProcess:
                pass
        if not left:
            break
        ended |= {p.pid for p in left}
        psutil.wait_procs(left, timeout=5)
    while True:  # reap the inherited ones that psutil did not wait for
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return len(ended)


def machine() -> dict[str, Any]:
    import torch

    import stare_agents

    info: dict[str, Any] = {
        "host": platform.node(),
        "package": str(Path(stare_agents.__file__).parent),  # a checkout's or an installed wheel's
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "gpus": _cuda_count(),
        "cpus": os.cpu_count(),
    }
    for name in ("vllm", "ray", "transformers"):
        try:
            info[name] = __import__(name).__version__
        except Exception as error:
            info[name] = f"not importable: {type(error).__name__}"
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stare-agents gpu-smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", choices=[*TIERS, "all"], default="device")
    parser.add_argument(
        "--device", choices=["auto", "cpu"], default="auto", help="cpu: the device tier on the CPU"
    )
    parser.add_argument("--out", type=Path, help="the JSON report (default: printed only)")
    parser.add_argument("--only", action="append", default=[], help="run only this check (repeatable)")
    parser.add_argument("--ray-address", default="", help="cluster tier: the cluster (default: RAY_ADDRESS)")
    parser.add_argument(
        "--shared-dir", default="", help="cluster tier: a folder every node reaches (run folder)"
    )
    parser.add_argument(
        "--train-arg", dest="train_args", action="append", default=[], help="cluster tier: an override"
    )
    parser.add_argument(
        "--deadline-scale", type=float, default=1.0, help="multiply every deadline (a slow machine: 2)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the checks' work folders")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    opts.ray_address = opts.ray_address or None
    opts.shared_dir = opts.shared_dir or None
    if opts.child:
        run_child(opts)
    tiers = TIERS if opts.tier == "all" else (opts.tier,)
    chosen = [c for c in CHECKS if c.tier in tiers and (not opts.only or c.name in opts.only)]
    unknown = set(opts.only) - {c.name for c in CHECKS}
    if unknown:
        parser.error(f"no check named {sorted(unknown)}; known: {[c.name for c in CHECKS]}")
    _become_subreaper()
    root = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    started = time.monotonic()
    report: dict[str, Any] = {
        "report": "gpu_smoke",
        "version": 1,
        "tiers": list(tiers),
        "device": opts.device,
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "checks": [],
    }
    for found in chosen:
        record = run_check(found, opts, root)
        report["checks"].append(record)
        print(
            f"{record['status']:>8}  {found.name} ({record.get('seconds', 0):g} s){'  ' + record['reason'] if record.get('reason') else ''}",
            file=sys.stderr,
            flush=True,
        )
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["counts"] = {s: sum(r["status"] == s for r in report["checks"]) for s in STATUSES}
    report["ok"] = report["counts"]["failed"] == report["counts"]["timeout"] == 0
    counts = ", ".join(f"{n} {status}" for status, n in report["counts"].items())
    print(
        f"{len(report['checks'])} checks: {counts} (a skipped check's reason is on its line)", file=sys.stderr
    )
    report["work"] = str(root) if opts.keep else None
    if not opts.keep:
        shutil.rmtree(root, ignore_errors=True)
    from stare_agents.jsonl import dumps

    text = dumps(report, indent=2)
    if opts.out:
        opts.out.write_text(text + "\n")
    print(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
