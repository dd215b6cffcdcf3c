"""What the GPU smoke checks share (`stare_agents.train.gpu_smoke` runs them): the registry of checks (`check`
registers one with its tier, deadline and needs), what each tier needs (a reason to skip, or None), and the helpers
the checks use (the tiny model, a synthetic step batch, a learner, log-probs, a killed-and-resumed training run).
The checks are in `smoke_device`, `smoke_node` and `smoke_cluster`, one module per tier."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHECKOUT = (
    Path(__file__).resolve().parents[1]
)  # the repository, when this runs from a checkout (train/ is in it)
BENCH_ROLLOUT = CHECKOUT / "benchmarks" / "bench_rollout.py"  # not in the package: the node tier's last check
TIERS = ("device", "node", "cluster")


# ---- what a check needs ------------------------------------------------------------------------------------
def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def needs_device(opts: argparse.Namespace) -> str | None:
    if opts.device == "cpu":
        return None
    return None if cuda_count() >= 1 else "no CUDA device (torch.cuda.is_available() is False)"


def needs_node(opts: argparse.Namespace) -> str | None:
    """Every unmet need of the node tier, in one reason (a machine short of GPUs may also lack vLLM)."""
    gpus = cuda_count()
    reasons = [f"needs 2+ CUDA GPUs, found {gpus}"] if gpus < 2 else []
    missing = [name for name in ("vllm", "ray") if not has_module(name)]
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


def cluster_given(opts: argparse.Namespace) -> str:
    """The cluster the cluster tier checks: --ray-address, else RAY_ADDRESS ("" for none)."""
    return opts.ray_address or os.environ.get("RAY_ADDRESS", "")


def needs_cluster(opts: argparse.Namespace) -> str | None:
    if not cluster_given(opts):
        return "no cluster: give --ray-address HOST:PORT or RAY_ADDRESS"
    return None if has_module("ray") else "needs ray installed"


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
def device_of(opts: argparse.Namespace) -> str:
    return "cpu" if opts.device == "cpu" else "cuda"


def tiny_model(work: Path) -> Path:
    from stare_agents.models import prepare_model

    return prepare_model("tiny", out=work / "tiny")


def step_inputs(seed: int = 0, groups: int = 2, group_size: int = 4) -> tuple[Any, Any]:
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


def make_learner(model_dir: Path, device: str, **config: Any) -> Any:
    from stare_agents.algo import AlgorithmConfig
    from stare_agents.train.learner import Learner, LearnerConfig
    from stare_agents.train.policy import OptimizerConfig

    learner_config = LearnerConfig(optimizer=OptimizerConfig(lr=1e-3, eps=1e-5), device=device, **config)
    return Learner.from_pretrained(model_dir, AlgorithmConfig.preset("grpo"), learner_config)


def finite(metrics: dict[str, float], *names: str) -> None:
    import math

    bad = {n: metrics.get(n) for n in names if not math.isfinite(metrics.get(n, float("nan")))}
    if bad:
        raise AssertionError(f"non-finite learner figures: {bad}")


def single_rank_group(backend: str, work: Path) -> None:
    import torch.distributed as dist

    from stare_agents.train.distributed import join_process_group

    join_process_group(f"file://{work / 'pg-store'}", backend, 0, 1)
    if not dist.is_initialized():
        raise AssertionError("the process group did not start")


def model_logprobs(model: Any, prompt: list[int], sampled: list[int], device: str) -> Any:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + sampled], device=device)).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(sampled, device=device)[:, None])[:, 0].cpu()


def engine_logprobs(engine: Any, prompt: list[int]) -> tuple[list[int], Any]:
    import asyncio

    import torch

    from stare_agents.rollout.engine import SamplingParams

    generation = asyncio.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=12)))
    return list(generation.token_ids), torch.tensor(generation.logprobs)


def perturb(model: Any, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=generator) * 0.05).to(p.device))


def start_training(
    work: Path, out: Path, *overrides: str, resume: bool = False, env: dict | None = None
) -> Any:
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


def rl_records(run: Path) -> list[dict]:
    from stare_agents.records import read_records

    return read_records(run / "metrics.jsonl", "rl")


def killed_and_resumed(work: Path, run: Path, overrides: list[str], deadline_s: float) -> dict[str, Any]:
    """The tiny recipe (rl.steps=3) SIGKILLed once its step-2 checkpoint exists, then resumed to the end."""
    from stare_agents.train.checkpoint import latest_checkpoint

    started = time.monotonic()
    first = start_training(work, run, "rl.steps=3", *overrides)
    while latest_checkpoint(run) is None or latest_checkpoint(run).name < "step-00000002":
        if first.poll() is not None:
            raise AssertionError(f"the run ended (exit {first.returncode}) before its step-2 checkpoint")
        if time.monotonic() - started > deadline_s:
            raise AssertionError("no step-2 checkpoint in time")
        time.sleep(0.02)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed = time.monotonic() - started
    second = start_training(work, run, "rl.steps=3", *overrides, resume=True)
    if second.wait(timeout=max(1.0, deadline_s - killed)) != 0:
        raise AssertionError(f"the resumed run failed (exit {second.returncode}); see {work}")
    records = rl_records(run)
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


def killed_and_resumed_with(
    work: Path, run: Path, overrides: list[str], deadline_s: float, env: dict
) -> dict:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return killed_and_resumed(work, run, overrides, deadline_s)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
