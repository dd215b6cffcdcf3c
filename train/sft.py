"""Supervised fine-tuning on tool-interleaved traces (the paper's cold start), observation tokens masked.

    sft = SFTTrainer(model, SFTConfig(epochs=2), pad_token_id=tokenizer.pad_token_id)
    history = sft.fit(trajectories)      # one dict of SFT_METRICS per epoch

A fit can stop and go on: `fit(..., max_steps=n)` returns after n optimiser steps (the epochs it finished), and
while `sft.fitting` the next `fit` call continues where it stopped, also in a new process from a checkpoint
(`save_checkpoint` / `resume`): the epoch's order, its figures so far and the schedule come back with it, so a
fit cut into pieces (or killed and resumed) takes the same steps as one in a single call.

The data are `Trajectory` objects: a trace rendered into prompt ids and response ids, with `action_mask`
1 on the tokens the model should learn to write (its reasoning, code, final answer) and 0 on what the
environment inserted (tool output). The loss is the negative log-likelihood of the action tokens only,
averaged over all action tokens of an optimiser step (token-mean), with the same token-budget
micro-batches, chunked LM head, AdamW and schedule as the RL learner.
"""

from __future__ import annotations

import array
import copy
import hashlib
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stare_agents.algo import aggregate
from stare_agents.train.checkpoint import save_checkpoint
from stare_agents.train.learner import Collective
from stare_agents.train.packing import PackRows
from stare_agents.train.policy import (
    PRECISIONS,
    OptimizerConfig,
    PolicyCore,
    PolicyModel,
    load_causal_lm,
    load_policy_shards,
    optimizer_step,
    save_policy_shards,
    split_step,
    step_schedule,
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
    "grad_norm",  # mean over the epoch's steps that were taken, before clipping
    "lr",  # at the epoch's last step
    "time_s",
    "tokens_per_s",
)


def traces_fingerprint(trajectories: Sequence[Trajectory]) -> str:
    """A digest of the SFT data as the model sees it (token ids and loss mask, in order): a checkpoint taken on
    other traces must not be continued on these."""
    digest = hashlib.sha256()
    for t in trajectories:
        for part in (t.prompt_ids, t.response_ids, t.action_mask):
            values = array.array("q", part)  # 8-byte signed, little-endian: one copy, not a bytes object a token
            if sys.byteorder == "big":
                values.byteswap()
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(values.tobytes())
    return digest.hexdigest()


@dataclass
class SFTConfig:
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-5))
    epochs: int = 1
    batch_size: int = 16  # trajectories per optimiser step
    micro_batch_tokens: int = 8192
    precision: str = "fp32"  # "fp32", "bf16" or "fp16" (autocast; fp16 with a dynamic loss scale), "fast"
    gradient_checkpointing: bool = False
    pack_rows: PackRows = "auto"  # as the RL learner's (LearnerConfig.pack_rows)
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
        self.device, self.policy, self.optimizer, self.scheduler, self.scaler = PolicyCore.build(
            model, self.config, shard=shard
        )
        self.epochs_done = 0
        self.steps_done = 0
        self._fit: dict | None = None  # the fit under way: {"end_epoch": the epoch count it ends at}
        self._epoch: dict | None = None  # the epoch under way: steps taken, their totals, seconds, last lr

    @property
    def fitting(self) -> bool:
        """A fit stopped by `max_steps` (or resumed from a checkpoint taken mid-fit) is under way."""
        return self._fit is not None

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
            (loss * (self.collective.loss_scale * self.scaler.scale)).backward()  # fp16: scaled
            sums[0] += float(loss.detach()) * normalizer
            sums[1] += float(stats.entropy.detach()[mask > 0].sum())
        nll_sum, entropy_sum = self.collective.all_reduce_sum(sums).tolist()
        scale = self.scaler.scale
        grad_norm = optimizer_step(
            self.optimizer, self.model, self.config.optimizer.max_grad_norm, self.collective, self.scaler
        )
        skipped = not math.isfinite(grad_norm)
        if skipped and not self.scaler.absorbs(scale):  # fp16's overflows: the scale backs off (counted)
            warnings.warn(
                f"SFT step {self.steps_done}: gradient norm is {grad_norm}; the update is skipped",
                RuntimeWarning,
                stacklevel=2,
            )
        step_schedule(self.scheduler)
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
        self,
        trajectories: Sequence[Trajectory],
        *,
        progress: bool = False,
        on_step: Callable | None = None,
        max_steps: int | None = None,
    ) -> list[dict[str, float]]:
        """`config.epochs` epochs over the trajectories; one dict of SFT_METRICS per epoch finished in this call.
        `on_step`, when given, receives each optimiser step's figures (what `step` returns). `max_steps`: stop
        after that many optimiser steps (then `fitting` says whether the fit is over; the next call goes on)."""
        if not trajectories:
            raise ValueError("SFT needs at least one trajectory")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
        if self._fit is None:
            self._fit = {"end_epoch": self.epochs_done + self.config.epochs}
        stop_at = None if max_steps is None else self.steps_done + max_steps
        history = []
        while self.epochs_done < self._fit["end_epoch"]:
            left = None if stop_at is None else stop_at - self.steps_done
            if left == 0:
                break
            record = self.epoch(trajectories, progress=progress, on_step=on_step, max_steps=left)
            if record is None:  # stopped mid-epoch
                break
            history.append(record)
        if self.epochs_done >= self._fit["end_epoch"]:
            self._fit = None
        return history

    def _epoch_order(self, size: int) -> list[list[int]]:
        """The step batches (row indices) of the epoch under way: a new order each epoch, from the seed."""
        order = list(range(size))
        if self.config.shuffle:
            gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.epochs_done)
            order = torch.randperm(size, generator=gen).tolist()
        return [order[i : i + self.config.batch_size] for i in range(0, size, self.config.batch_size)]

    def epoch(
        self,
        trajectories: Sequence[Trajectory],
        *,
        progress: bool = False,
        on_step: Callable | None = None,
        max_steps: int | None = None,
    ) -> dict[str, float] | None:
        """The rest of the epoch under way (a whole one when none is): its SFT_METRICS, or None when
        `max_steps` stopped it before its end (the next call goes on with it)."""
        if self._epoch is None:
            totals = dict.fromkeys(("nll", "entropy", "action_tokens", "tokens", "grad_norm", "skipped"), 0.0)
            self._epoch = {"steps": 0, "totals": totals, "seconds": 0.0, "lr": float("nan")}
        part = self._epoch
        totals = part["totals"]
        batches = self._epoch_order(len(trajectories))
        todo = batches[part["steps"] :]
        if max_steps is not None:
            todo = todo[:max_steps]
        iterator: Any = todo
        if progress:
            from tqdm import tqdm

            iterator = tqdm(
                todo, desc=f"SFT epoch {self.epochs_done + 1}", unit="step", initial=part["steps"], total=len(batches)
            )
        started = time.perf_counter()
        for rows in iterator:
            out = self.step([trajectories[i] for i in rows])
            if out["action_tokens"]:
                totals["nll"] += out["loss"] * out["action_tokens"]
                totals["entropy"] += out["entropy"] * out["action_tokens"]
            for key in ("action_tokens", "tokens", "skipped"):
                totals[key] += out[key]
            if math.isfinite(out["grad_norm"]):  # a skipped step's norm is not (fp16: an overflow)
                totals["grad_norm"] += out["grad_norm"]
            part["lr"] = out["lr"]
            part["steps"] += 1
            now = time.perf_counter()
            part["seconds"] += now - started  # current at every step: a checkpoint taken now holds it
            started = now
            if on_step is not None:
                on_step(out)
        if part["steps"] < len(batches):
            return None
        self._epoch = None
        self.epochs_done += 1
        elapsed = part["seconds"]
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
            "grad_norm": totals["grad_norm"] / taken
            if (taken := len(batches) - totals["skipped"])
            else float("nan"),
            "lr": part["lr"],
            "time_s": elapsed,
            "tokens_per_s": totals["tokens"] / elapsed if elapsed > 0 else float("nan"),
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
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **self.small_state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_small_state_dict(state)

    def small_state_dict(self) -> dict:
        """The state without the model and the optimiser: the schedule, the counters, the fit under way."""
        return {
            "scheduler": self.scheduler.state_dict(),
            "epochs_done": self.epochs_done,
            "steps_done": self.steps_done,
            "fit": copy.deepcopy(self._fit),
            "epoch": copy.deepcopy(self._epoch),
            "loss_scaler": self.scaler.state_dict(),
        }

    def load_small_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.epochs_done = int(state["epochs_done"])
        self.steps_done = int(state["steps_done"])
        self._fit = copy.deepcopy(state.get("fit"))  # a state saved before fits could stop holds none
        self._epoch = copy.deepcopy(state.get("epoch"))
        self.scaler.load_state_dict(state.get("loss_scaler"))

    def save_shards(self, folder: str | Path) -> None:
        """The model and optimiser as this data-parallel worker holds them (see `save_policy_shards`)."""
        save_policy_shards(self.policy, self.optimizer, folder)

    def load_shards(self, folder: str | Path) -> None:
        load_policy_shards(self.policy, self.optimizer, folder)

    def save_checkpoint(self, state: dict[str, Any], path: Path, *, tokenizer_dir: Path) -> None:
        """Model, optimiser and the fit under way in one checkpoint folder (the model as a Hugging Face folder)."""
        save_checkpoint({**state, "learner": self.state_dict()}, path, model=self.model, tokenizer_dir=tokenizer_dir)

    def resume(self, checkpoint: Path, state: dict[str, Any]) -> None:
        """Read back what `save_checkpoint` wrote (`state`: `load_checkpoint(checkpoint)`)."""
        self.load_state_dict(state["learner"])

    def hf_model(self, model_dir: Path) -> nn.Module:
        return self.model  # this process holds it

    def close(self) -> None:
        pass
