"""The device tier of the GPU smoke checks (one GPU, torch only, the tiny model; `--device cpu` runs them on the
CPU with gloo): the GPU itself, the learner in each precision and sharded, a checkpoint round trip, the
collectives, the weight sync into the HF engine, three RL steps and a resume. Registered with `smoke_base.check`;
`stare_agents.train.gpu_smoke` runs them."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from stare_agents.train.smoke_base import (
    check,
    device_of,
    engine_logprobs,
    finite,
    killed_and_resumed_with,
    make_learner,
    model_logprobs,
    needs_device,
    perturb,
    single_rank_group,
    step_inputs,
    tiny_model,
)


@check("device", "device", 30, needs_device, "the device: name, memory, bf16, a matmul")
def check_device(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    device = device_of(opts)
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

    device = device_of(opts)
    model_dir = tiny_model(work)
    batch, advantages = step_inputs()
    figures: dict[str, Any] = {}
    prompt, sampled = list(range(5, 25)), list(range(30, 42))
    logps = {}
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for precision in ("fp32", "bf16", "fp16"):
        learner = make_learner(model_dir, device, precision=precision)
        with torch.autocast(device, dtype=half.get(precision, torch.bfloat16), enabled=precision in half):
            logps[precision] = model_logprobs(learner.model, prompt, sampled, device)
        metrics = learner.step(batch, advantages)
        finite(metrics, "learner/loss", "learner/grad_norm", "learner/entropy")
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

    device = device_of(opts)
    model_dir = tiny_model(work)
    batch, advantages = step_inputs()
    plain = make_learner(model_dir, device).step(batch, advantages)
    single_rank_group("nccl" if device == "cuda" else "gloo", work)
    config = LearnerConfig(optimizer=OptimizerConfig(lr=1e-3, eps=1e-5), device=device)
    sharded_learner = Learner(
        load_causal_lm(model_dir, device),
        AlgorithmConfig.preset("grpo"),
        config,
        collective=ProcessGroupCollective(shards_gradients=True),
        shard=_fully_shard,
    )
    sharded = sharded_learner.step(batch, advantages)
    finite(sharded, "learner/loss", "learner/grad_norm")
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

    device = device_of(opts)
    model_dir = tiny_model(work)
    batch, advantages = step_inputs()
    first = make_learner(model_dir, device)
    first.step(batch, advantages)
    torch.save(first.state_dict(), work / "learner.pt")
    second = make_learner(model_dir, device)
    perturb(second.model, 7)  # other weights: all must come from the file
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

    device = device_of(opts)
    single_rank_group("nccl" if device == "cuda" else "gloo", work)
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

    device = device_of(opts)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    model_dir = tiny_model(work)
    learner = make_learner(model_dir, device)
    spec = WorkerSpec(model=str(model_dir), engine="hf", dtype="float32", max_model_len=256, sandbox="none")
    group = RolloutWorkerGroup(spec, use_ray=False)
    figures: dict[str, Any] = {}
    try:
        engine = group._local.engine
        if engine.device.type != device:
            raise AssertionError(f"the HF engine is on {engine.device}, not {device}")
        prompt = list(range(5, 25))
        for version, path in ((1, "collective"), (2, "driver"), (3, "collective")):
            perturb(learner.model, version)
            started = time.perf_counter()
            if path == "collective":
                group.update_weights_from(learner.sender)
            else:
                group.update_weights(learner.model_state_dict())
            figures[f"sync_{version}_{path}_s"] = round(time.perf_counter() - started, 3)
            sampled, rollout = engine_logprobs(engine, prompt)
            now = model_logprobs(learner.model, prompt, sampled, device)
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
    return killed_and_resumed_with(work, work / "run", overrides, 170 * opts.deadline_scale, env)
