"""Supervised fine-tuning on tool-interleaved traces (the paper's cold start), observation tokens masked.

    sft = SFTTrainer(model, SFTConfig(epochs=2), pad_token_id=tokenizer.pad_token_id)
    history = sft.fit(trajectories)      # one dict of SFT_METRICS per epoch

The data are `Trajectory` objects: a trace rendered into prompt ids and response ids, with `action_mask`
1 on the tokens the model should learn to write (its reasoning, code, final answer) and 0 on what the
environment inserted (tool output). The loss is the negative log-likelihood of the action tokens only,
averaged over all action tokens of an optimiser step (token-mean), with the same token-budget
micro-batches, chunked LM head, AdamW and schedule as the RL learner.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from stare_agents.algo import aggregate
from stare_agents.train.learner import Collective
from stare_agents.train.policy import (
    PRECISIONS,
    OptimizerConfig,
    PolicyCore,
    PolicyModel,
    load_causal_lm,
    optimizer_step,
    split_step,
)
from stare_agents.trajectory import Trajectory, collate

SFT_METRICS = (
    "epoch",  # 1-based
    "loss",  # mean NLL per action token over the epoch (each step's value from its forward, before its update)
    "entropy",  # mean entropy of the policy at the action tokens, same weighting
    "steps",  # optimiser steps in the epoch
    "skipped_steps",  # steps skipped for a non-finite gradient norm
    "sequences",
    "tokens",  # non-padding tokens
    "action_tokens",  # tokens in the loss
    "grad_norm",  # mean over the epoch's steps, before clipping
    "lr",  # at the epoch's last step
    "time_s",
    "tokens_per_s",
)


@dataclass
class SFTConfig:
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-5))
    epochs: int = 1
    batch_size: int = 16  # trajectories per optimiser step
    micro_batch_tokens: int = 8192
    precision: str = "fp32"  # "fp32" or "bf16" (autocast)
    gradient_checkpointing: bool = False
    head_chunk_rows: int = 1024
    shuffle: bool = True  # a new order each epoch, from `seed` and the epoch number
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if isinstance(self.optimizer, dict):
            self.optimizer = OptimizerConfig(**self.optimizer)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.epochs < 1 or self.batch_size < 1 or self.micro_batch_tokens < 1:
            raise ValueError(
                f"need epochs, batch_size and micro_batch_tokens >= 1; got {self.epochs}, {self.batch_size}, "
                f"{self.micro_batch_tokens}"
            )

    def steps_per_epoch(self, num_sequences: int) -> int:
        return math.ceil(num_sequences / self.batch_size)


class SFTTrainer:
    """See the module docstring. With a `collective` (a data-parallel worker of `SFTGroup`, train/distributed.py)
    every worker gets the same step batch, takes its share of the micro-batches and the gradients are summed
    across workers (or reduce-scattered by FSDP, `shard`), so that the update is that of one trainer."""

    def __init__(
        self,
        model: nn.Module,
        config: SFTConfig | None = None,
        *,
        pad_token_id: int = 0,
        collective: Collective | None = None,
        shard: Callable[[PolicyModel], None] | None = None,
    ) -> None:
        self.config = config or SFTConfig()
        self.pad_token_id = pad_token_id
        self.collective = collective or Collective()
        self.device, self.policy, self.optimizer, self.scheduler = PolicyCore.build(
            model, self.config, shard=shard
        )
        self.epochs_done = 0
        self.steps_done = 0

    @classmethod
    def from_pretrained(
        cls, path: str | Path, config: SFTConfig | None = None, *, pad_token_id: int = 0
    ) -> SFTTrainer:
        return cls(load_causal_lm(path), config, pad_token_id=pad_token_id)

    @property
    def model(self) -> nn.Module:
        return self.policy.model

    def step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One optimiser step on these trajectories: loss, entropy, action_tokens, tokens, grad_norm, lr,
        skipped (1 when the gradient norm was not finite and the step was skipped)."""
        if not trajectories:
            raise ValueError("an SFT step needs at least one trajectory")
        batch = collate(trajectories, self.pad_token_id)
        plan = split_step(batch, None, mini_batches=1, micro_batch_tokens=self.config.micro_batch_tokens)
        normalizer = max(float((batch.action_mask > 0).sum()), 1.0)
        sharded = self.collective.shards_gradients
        mine = plan[0]
        if self.collective.world_size > 1:  # this worker's share (FSDP: as many as every other worker)
            from stare_agents.train.distributed import deal_micro_batches

            mine = deal_micro_batches(plan, self.collective.world_size, equal_counts=sharded)[
                self.collective.rank
            ][0]
        lr = self.optimizer.param_groups[0]["lr"]
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(2, dtype=torch.float64)  # NLL and entropy over this worker's action tokens
        for mb in mine:
            mb = mb.to(self.device)
            mask = mb.batch.action_mask
            if not bool((mask > 0).any()) and not sharded:
                continue  # nothing to learn in it (under FSDP the forward and backward are collective)
            stats = self.policy(mb.batch)
            loss = -aggregate(stats.logprob, mask, "token-mean", normalizer)
            (loss * self.collective.loss_scale).backward()
            sums[0] += float(loss.detach()) * normalizer
            sums[1] += float(stats.entropy.detach()[mask > 0].sum())
        nll_sum, entropy_sum = self.collective.all_reduce_sum(sums).tolist()
        grad_norm = optimizer_step(
            self.optimizer, self.model, self.config.optimizer.max_grad_norm, self.collective
        )
        skipped = not math.isfinite(grad_norm)
        if skipped:
            warnings.warn(
                f"SFT step {self.steps_done}: gradient norm is {grad_norm}; the update is skipped",
                RuntimeWarning,
                stacklevel=2,
            )
        self.scheduler.step()
        self.steps_done += 1
        actions = float((batch.action_mask > 0).sum())
        return {
            "loss": nll_sum / actions if actions else float("nan"),
            "entropy": entropy_sum / actions if actions else float("nan"),
            "action_tokens": actions,
            "tokens": float(batch.attention_mask.sum()),
            "grad_norm": grad_norm,
            "lr": lr,
            "skipped": float(skipped),
        }

    def fit(
        self, trajectories: Sequence[Trajectory], *, progress: bool = False, on_step: Callable | None = None
    ) -> list[dict[str, float]]:
        """`config.epochs` epochs over the trajectories; one dict of SFT_METRICS per epoch. `on_step`, when
        given, receives each optimiser step's figures (what `step` returns)."""
        if not trajectories:
            raise ValueError("SFT needs at least one trajectory")
        history = []
        for _ in range(self.config.epochs):
            history.append(self.epoch(trajectories, progress=progress, on_step=on_step))
        return history

    def epoch(
        self, trajectories: Sequence[Trajectory], *, progress: bool = False, on_step: Callable | None = None
    ) -> dict[str, float]:
        start = time.perf_counter()
        order = list(range(len(trajectories)))
        if self.config.shuffle:
            gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.epochs_done)
            order = torch.randperm(len(trajectories), generator=gen).tolist()
        batches = [
            order[i : i + self.config.batch_size] for i in range(0, len(order), self.config.batch_size)
        ]
        totals = dict.fromkeys(("nll", "entropy", "action_tokens", "tokens", "grad_norm", "skipped"), 0.0)
        lr = float("nan")
        iterator = batches
        if progress:
            from tqdm import tqdm

            iterator = tqdm(batches, desc=f"SFT epoch {self.epochs_done + 1}", unit="step")
        for rows in iterator:
            out = self.step([trajectories[i] for i in rows])
            if on_step is not None:
                on_step(out)
            if out["action_tokens"]:
                totals["nll"] += out["loss"] * out["action_tokens"]
                totals["entropy"] += out["entropy"] * out["action_tokens"]
            for key in ("action_tokens", "tokens", "grad_norm", "skipped"):
                totals[key] += out[key]
            lr = out["lr"]
        self.epochs_done += 1
        elapsed = time.perf_counter() - start
        actions = totals["action_tokens"]
        metrics = {
            "epoch": float(self.epochs_done),
            "loss": totals["nll"] / actions if actions else float("nan"),
            "entropy": totals["entropy"] / actions if actions else float("nan"),
            "steps": float(len(batches)),
            "skipped_steps": totals["skipped"],
            "sequences": float(len(trajectories)),
            "tokens": totals["tokens"],
            "action_tokens": actions,
            "grad_norm": totals["grad_norm"] / len(batches),
            "lr": lr,
            "time_s": elapsed,
            "tokens_per_s": totals["tokens"] / elapsed,
        }
        return {name: float(metrics[name]) for name in SFT_METRICS}

    @torch.no_grad()
    def evaluate(self, trajectories: Sequence[Trajectory]) -> float:
        """Mean NLL per action token of the current model (no update)."""
        batch = collate(trajectories, self.pad_token_id)
        plan = split_step(batch, None, mini_batches=1, micro_batch_tokens=self.config.micro_batch_tokens)
        self.policy.eval()
        nll = 0.0
        for mb in plan[0]:
            mb = mb.to(self.device)
            stats = self.policy(mb.batch)
            nll -= float(stats.logprob[mb.batch.action_mask > 0].sum())
        self.policy.train()
        actions = float((batch.action_mask > 0).sum())
        return nll / actions if actions else float("nan")

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epochs_done": self.epochs_done,
            "steps_done": self.steps_done,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epochs_done = int(state["epochs_done"])
        self.steps_done = int(state["steps_done"])
