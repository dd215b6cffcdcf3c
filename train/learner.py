"""The RL learner: one training step of STARE (or a baseline) on a Hugging Face causal LM.

    learner = Learner.from_pretrained(model_dir, AlgorithmConfig.preset("stare"), LearnerConfig())
    metrics = learner.step(collate(kept, pad_token_id), advantages, others=collate(untrained, pad_token_id))

One step, as the official STARE code does it, planned first (`_plan`) and then applied:
  1. pre-update pass (no grad) over the step batch, micro-batch by micro-batch: log pi_old(a), entropy H and
     Phi's collision term (when the step is one micro-batch per worker and one update, the update's own forward
     is this pass); the step's totals (entropy, token counts, rollout/learner mismatch) over every worker; the
     untrained trajectories (`others`) scored alike, for the entropy over every sampled trajectory;
  2. the token reweighting's gate, once per step, on that entropy (`algo/reweighting.py` owns everything
     STARE-shaped: which entropy it reads, L+/L- per micro-batch or per step, its counts); Entrocraft, when
     configured, switches the advantages on the same entropy;
  3. for each optimiser update (`mini_batches`, 1 by default) and each token-budget micro-batch: forward with
     grad, the reweighting's L+/L- and weights, the clipped surrogate normalised over the whole update
     (`loss.normalization` "global") or as the official code does it, each micro-batch's own mean times its
     share of the update's rows ("micro-batch"), backward (gradient accumulation);
  4. gradients summed over data-parallel workers, clipped, AdamW; then the LR schedule.

Its figures are typed sums (`StepTotals`, `UpdateSums` in `train/learner_figures.py`): a new one is a field
there and the line here that computes it; LEARNER_METRICS follows from the types.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from stare_agents.algo import AlgorithmConfig, loss_normalizer, policy_loss, sensitivity_from_statistics
from stare_agents.algo.importance import importance_weights, log_ratios
from stare_agents.algo.reweighting import StepReweighting
from stare_agents.rollout.weight_sync import ModelSender, WeightSender
from stare_agents.train.checkpoint import save_checkpoint
from stare_agents.train.learner_config import LearnerConfig
from stare_agents.train.learner_figures import (
    LEARNER_METRICS,
    StepResult,
    StepRun,
    StepTotals,
    TokenRecord,
    UpdateSums,
    token_records,
)
from stare_agents.train.policy import (
    MicroBatch,
    PolicyCore,
    PolicyModel,
    TokenStats,
    load_causal_lm,
    load_policy_shards,
    optimizer_step,
    save_policy_shards,
    shared_prompt_planning,
    split_step,
    step_schedule,
)
from stare_agents.trajectory import Batch

logger = logging.getLogger(__name__)


class TrainingLearner(Protocol):
    """What the trainer asks of a learner: `Learner` (this process) and `LearnerGroup` (data-parallel workers as
    Ray actors, `stare_agents.train.distributed`) both have it, so the trainer never asks which one it holds."""

    sender: WeightSender  # its end of a weight-sync group with the rollout engines

    @property
    def gate_on(self) -> bool | None: ...

    def step(
        self,
        batch: Batch | None,
        advantages: Tensor,
        *,
        others: Batch | None = None,
        record_tokens: bool = False,
    ) -> StepResult: ...

    def model_state_dict(self) -> dict[str, Tensor]: ...

    def hf_model(self, model_dir: Path) -> nn.Module:
        """The trained policy as a Hugging Face model (its config and tokenizer from `model_dir`)."""
        ...

    def save_checkpoint(self, state: dict[str, Any], path: Path, *, tokenizer_dir: Path) -> None:
        """`state` (the trainer's) and this learner's own into the checkpoint `path`."""
        ...

    def resume(self, checkpoint: Path, state: dict[str, Any]) -> None:
        """Read back what `save_checkpoint` wrote (`state`: the checkpoint's trainer state)."""
        ...

    def close(self) -> None: ...


class Collective:
    """How the learner combines numbers across data-parallel workers. This one is a single worker;
    `stare_agents.train.distributed` has the torch.distributed one."""

    world_size = 1
    rank = 0
    shards_gradients = False  # True under FSDP: the wrapper reduces gradients itself
    loss_scale = 1.0  # what each worker's loss is multiplied by before backward (FSDP averages gradients)

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return tensor

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """1-D tensors of any length from every worker, in rank order."""
        return [tensor]

    def reduce_gradients(self, params: list[nn.Parameter]) -> None:
        return None


@dataclass
class PlannedMicroBatch:
    """One micro-batch, prepared: its pre-update statistics, its advantages and its step-wide selection."""

    mb: MicroBatch
    pre: TokenStats  # the pre-update policy's log-probs (pi_old), entropy and collision term
    advantages: Tensor  # after Entrocraft's switch, when there is one
    selection: tuple[Tensor, Tensor] | None  # L+/L- chosen over the whole step (scope "batch"), else None
    forward: TokenStats | None  # the update's own forward, when the pre-update pass was fused with it
    phi: Tensor | None  # Phi of the pre-update policy (None without diagnostics)
    normalizer: float  # what its summed loss is divided by (see `Learner._normalizer`)


@dataclass
class StepPlan:
    """A step before its updates: each update's planned micro-batches (this worker's), the step's totals
    (all workers) and what the pre-update pass measured besides."""

    updates: list[list[PlannedMicroBatch]]
    totals: StepTotals
    max_abs_log_ratio: float  # the largest |log pi_learner - log pi_rollout| of the step (all workers)
    entropy_all: float  # token mean over the trained and the scored untrained trajectories (NaN: not scored)
    pre_update_s: float


class Learner:
    """See the module docstring. The trainer calls `step(batch, advantages, others=...)` once per training step."""

    def __init__(
        self,
        model: nn.Module,
        algorithm: AlgorithmConfig,
        config: LearnerConfig | None = None,
        *,
        collective: Collective | None = None,
        shard: Callable[[PolicyModel], None] | None = None,
    ) -> None:
        """`shard`, when given, wraps the policy in place before the optimiser is built (FSDP)."""
        self.config = config or LearnerConfig()
        self.algorithm = algorithm
        self.collective = collective or Collective()
        c = self.config
        self.device, self.policy, self.optimizer, self.scheduler, self.scaler = PolicyCore.build(
            model, c, temperature=c.temperature, fp32_head=c.fp32_head, shard=shard
        )
        # everything STARE-shaped: the method (or none), its gate, L+/L- (also for the diagnostics), its counts
        self.reweighting = StepReweighting.build(algorithm, seed=c.seed, diagnostics=c.diagnostics)
        self.generator = torch.Generator().manual_seed(c.seed)
        self.step_count = 0
        self.skipped_updates = 0
        self.sender = ModelSender(self.model, device=self.device, rank=self.collective.rank)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        algorithm: AlgorithmConfig,
        config: LearnerConfig | None = None,
        *,
        collective: Collective | None = None,
    ) -> Learner:
        return cls(load_causal_lm(path), algorithm, config, collective=collective)

    @property
    def model(self) -> nn.Module:
        """The Hugging Face model being trained (its state_dict is what the rollout workers load)."""
        return self.policy.model

    @property
    def gate_on(self) -> bool | None:
        """Whether the last step was reweighted (None without a token reweighting)."""
        return self.reweighting.gate_on

    @property
    def plans_shared_prompts(self) -> bool:
        """Whether micro-batches are cut by packed tokens, each prompt once (`shared_prompt_planning`)."""
        return shared_prompt_planning(
            self.policy.share_prompts, self.config.micro_batch_packing, self.algorithm.loss.normalization
        )

    # ---- the step -------------------------------------------------------------------------------------

    def step(
        self,
        batch: Batch | None,
        advantages: Tensor,
        *,
        others: Batch | None = None,
        record_tokens: bool = False,
    ) -> StepResult:
        """One training step on a step batch (`collate(...)` of the kept trajectories; None: nothing to train on)
        with per-sequence [B] (or per-token [B, R]) advantages. `others`: the step's sampled trajectories that
        are not trained on (None: there are none), scored for learner/entropy_all and a gate that reads every
        sampled trajectory. Returns every name in LEARNER_METRICS, with each row's TokenRecord (of `batch` and
        of `others`) when `record_tokens` (for the saved rollouts)."""
        if batch is None:
            other_records: dict[int, TokenRecord] = {}
            scored = self._score_others(others, other_records if record_tokens else None)
            entropy_all = scored[0] / scored[1] if scored is not None and scored[1] else math.nan
            return StepResult.untrained(self.gate_on, entropy_all, other_records=other_records)
        plan = split_step(
            batch,
            advantages,
            mini_batches=self.config.mini_batches,
            micro_batch_tokens=self.config.micro_batch_tokens,
            packing=self.config.micro_batch_packing,
            shared_prompts=self.plans_shared_prompts,
        )
        return self.step_micro_batches(plan, others=others, record_tokens=record_tokens)

    def step_micro_batches(
        self, plan: list[list[MicroBatch]], *, others: Batch | None = None, record_tokens: bool = False
    ) -> StepResult:
        """The step on this worker's micro-batches, grouped by optimiser update (see `split_step`). With
        several workers each holds some micro-batches of every update, and all call this together (the
        token records are then this worker's rows; `others` is for a single worker)."""
        start = time.perf_counter()
        records: dict[int, TokenRecord] | None = {} if record_tokens else None
        other_records: dict[int, TokenRecord] | None = {} if record_tokens else None
        step = self._plan(plan, others, other_records, start)
        sums, grad_norms = UpdateSums(), []
        lr = self.optimizer.param_groups[0]["lr"]
        for update in step.updates:  # 3. gradient accumulation over micro-batches, then one optimiser update
            self.optimizer.zero_grad(set_to_none=True)
            for item in update:
                sums += self._update_micro_batch(item, records)
            grad_norms.append(self._apply_gradients())
        step_schedule(self.scheduler)
        self.step_count += 1
        sums = UpdateSums.of(self.collective.all_reduce_sum(sums.vector()))
        metrics = self._metrics(step, sums, StepRun(lr, grad_norms, time.perf_counter() - start))
        return StepResult(metrics, records, self.gate_on, other_records)

    def _plan(
        self,
        plan: list[list[MicroBatch]],
        others: Batch | None,
        other_records: dict[int, TokenRecord] | None,
        start: float,
    ) -> StepPlan:
        """1-2: the pre-update pass, the step's totals, the gate, the advantages and the step-wide selection."""
        plan = [[mb.to(self.device) for mb in update] for update in plan]
        micro_batches = [mb for update in plan for mb in update]
        # pi_old, entropy and Phi of the policy before this step's updates. When there is one update and no
        # worker holds more than one micro-batch, the update's own forward is that pass (nothing has changed
        # the policy yet): one forward instead of two, the same numbers.
        want = self.config.diagnostics or self.reweighting.needs_phi  # Phi: the diagnostics' or the selection's
        forward: list[TokenStats | None] = [None] * len(micro_batches)
        if (
            self.config.fuse_single_micro_batch
            and len(plan) == 1
            and self._one_micro_batch_each(micro_batches)
        ):
            self.policy.train()
            forward = [self.policy(mb.batch, want_collision=want) for mb in micro_batches]
            pre = [TokenStats(f.logprob.detach(), f.entropy.detach(), f.collision) for f in forward]
        else:
            self.policy.eval()
            with torch.no_grad():
                pre = [self.policy(mb.batch, want_collision=want) for mb in micro_batches]
            self.policy.train()
        pre_update_s = time.perf_counter() - start
        totals, normalizers, update_rows, max_abs = self._step_totals(micro_batches, pre, plan)
        scored = self._score_others(others, other_records)
        entropy_all = math.nan
        if scored is not None:
            count = scored[1] + totals.token_entropy_count
            entropy_all = (scored[0] + totals.token_entropy_sum) / count if count else math.nan
        # 2. the gate, once per step (a step without action tokens has no entropy: the gate keeps its state);
        #    Entrocraft's switch on the same entropy
        self.reweighting.gate(totals.entropy, entropy_all, measured=totals.entropy_count > 0)
        advantages = [self._switched_advantages(mb.advantages, totals.entropy) for mb in micro_batches]
        masks = [mb.batch.action_mask > 0 for mb in micro_batches]
        selections = self.reweighting.step_selection(
            [-stats.logprob for stats in pre], advantages, masks, self.collective, self.device
        )
        items = iter(
            PlannedMicroBatch(
                mb,
                pre[i],
                advantages[i],
                selections[i] if selections else None,
                forward[i],
                self._phi(pre[i]) if want else None,
                self._normalizer(mb, normalizer, rows),
            )
            for i, (mb, normalizer, rows) in enumerate(
                (mb, n, r)
                for update, n, r in zip(plan, normalizers, update_rows, strict=True)
                for mb in update
            )
        )
        updates = [[next(items) for _ in update] for update in plan]
        return StepPlan(updates, totals, max_abs, entropy_all, pre_update_s)

    @staticmethod
    def _phi(stats: TokenStats) -> Tensor:
        return sensitivity_from_statistics(
            {"logprob": stats.logprob, "entropy": stats.entropy, "collision": stats.collision}
        )

    def _score_others(
        self, others: Batch | None, records: dict[int, TokenRecord] | None
    ) -> tuple[float, float] | None:
        """(sum, count) of the current policy's entropy over the action tokens of the untrained trajectories,
        micro-batch by micro-batch (no grad), with their TokenRecords into `records`; None when they are not
        scored (score_untrained off and a gate that reads the trained batch only)."""
        if not (self.config.score_untrained or self.reweighting.reads_all_sampled):
            return None
        if others is None:
            return 0.0, 0.0
        total = count = 0.0
        self.policy.eval()
        with torch.no_grad():
            budget = self.config.micro_batch_tokens
            shared = self.plans_shared_prompts
            for update in split_step(others, None, mini_batches=1, micro_batch_tokens=budget, shared_prompts=shared):
                for mb in update:
                    mb = mb.to(self.device)
                    stats = self.policy(mb.batch, want_collision=records is not None)
                    mask = mb.batch.action_mask > 0
                    total += float(stats.entropy[mask].sum())
                    count += float(mask.sum())
                    if records is not None:
                        records.update(token_records(mb, stats, self._phi(stats), trained=False))
        self.policy.train()
        return total, count

    def _one_micro_batch_each(self, micro_batches: list[MicroBatch]) -> bool:
        more = torch.tensor([float(len(micro_batches) > 1)], dtype=torch.float64)
        return float(self.collective.all_reduce_sum(more)) == 0.0

    def _switched_advantages(self, advantages: Tensor, entropy: float) -> Tensor:
        switch = self.algorithm.entrocraft
        if switch is None or not math.isfinite(entropy):
            return advantages
        return switch.apply(advantages, entropy, self.step_count)

    def _normalizer(self, mb: MicroBatch, update_normalizer: float, update_rows: float) -> float:
        """What this micro-batch's summed loss is divided by. "global": the update's count (all workers), so
        the accumulated gradient is that of the unsplit update. "micro-batch" (the official code's): the
        micro-batch's own count times rows_update / rows_mb, i.e. its own mean weighted by its share of the
        update's rows (all workers; a filler micro-batch has no rows and no loss)."""
        if self.algorithm.loss.normalization == "global":
            return update_normalizer
        own = max(loss_normalizer(mb.batch.action_mask, self.algorithm.loss.aggregation), 1.0)
        return own * update_rows / max(len(mb.rows), 1)

    def _step_totals(
        self, micro_batches: list[MicroBatch], pre: list[TokenStats], plan: list[list[MicroBatch]]
    ) -> tuple[StepTotals, list[float], list[float], float]:
        """Step-level sums over all workers, in one all-reduce: StepTotals, and each update's loss normaliser
        and row count; then the largest |log ratio| (a max, gathered)."""
        aggregation = self.algorithm.loss.aggregation
        local, max_abs = StepTotals(), 0.0
        for mb, stats in zip(micro_batches, pre, strict=True):
            measured, largest = StepTotals.measure(mb, stats, aggregation)
            local, max_abs = local + measured, max(max_abs, largest)
        normalizers = [sum(loss_normalizer(mb.batch.action_mask, aggregation) for mb in u) for u in plan]
        rows = [float(sum(len(mb.rows) for mb in u if not mb.filler)) for u in plan]
        vector = torch.cat([local.vector(), torch.tensor(normalizers + rows, dtype=torch.float64)])
        vector = self.collective.all_reduce_sum(vector).tolist()
        n = len(local.values())
        totals, counts = StepTotals.of(vector[:n]), vector[n:]
        max_abs = max(float(t) for t in self.collective.all_gather(torch.tensor([max_abs])))
        return totals, [max(c, 1.0) for c in counts[: len(plan)]], counts[len(plan) :], max_abs

    def _update_micro_batch(
        self, item: PlannedMicroBatch, records: dict[int, TokenRecord] | None
    ) -> UpdateSums:
        """Forward (unless fused with the pre-update pass) + backward of one micro-batch; its sums. `records`:
        where its rows' TokenRecords go (None: none kept)."""
        mb, pre, advantages = item.mb, item.pre, item.advantages
        mask = mb.batch.action_mask
        num_actions = int((mask > 0).sum())
        sums = UpdateSums()
        if num_actions == 0 and not self.collective.shards_gradients:
            return sums  # an all-masked micro-batch contributes exactly nothing (under FSDP: a zero backward)
        stats = item.forward if item.forward is not None else self.policy(mb.batch)
        # L+/L- (the step's, or this micro-batch's by the current policy's surprisal) and the token weights
        top_pos, top_neg, weights = self.reweighting.select(
            -stats.logprob.detach(), advantages, mask, item.selection, phi=item.phi
        )
        if records is not None and not mb.filler:
            records.update(token_records(mb, pre, item.phi, top_pos, top_neg, weights))
        old = pre.logprob if self.config.old_logprobs == "recompute" else mb.batch.rollout_logprobs
        correction = None
        if self.config.importance.active:  # pi_old / pi_rollout, truncated and/or masked
            correction, capped, masked = importance_weights(
                pre.logprob, mb.batch.rollout_logprobs, mask, self.config.importance
            )
            sums.capped, sums.masked = float(capped.sum()), float(masked.sum())
        loss, metrics = policy_loss(
            stats.logprob,
            old,
            advantages,
            mask,
            self.algorithm.loss,
            token_weights=weights,
            importance_weights=correction,
            entropy=stats.entropy,
            normalizer=item.normalizer,
            generator=self.generator,
        )
        scale = self.collective.loss_scale * self.scaler.scale  # data-parallel share, fp16's loss scale
        (loss * scale if scale != 1.0 else loss).backward()
        sums.loss = float(loss.detach())
        sums.clipfrac = float(metrics["policy/clipfrac"]) * num_actions
        sums.approx_kl = float(metrics["policy/approx_kl"]) * num_actions
        sums.ratio_mean = float(metrics["policy/ratio_mean"]) * num_actions
        sums.reweighting = self.reweighting.sums(
            top_pos,
            top_neg,
            advantages=advantages,
            action_mask=mask,
            rewards=mb.batch.rewards,
            phi=item.phi,
            abs_log_ratio=log_ratios(pre.logprob, mb.batch.rollout_logprobs, mask).abs(),
        )
        return sums

    def _apply_gradients(self) -> float:
        scale = self.scaler.scale
        grad_norm = optimizer_step(
            self.optimizer, self.model, self.config.optimizer.max_grad_norm, self.collective, self.scaler
        )
        if not math.isfinite(grad_norm):
            self.skipped_updates += 1
            if self.scaler.absorbs(scale):  # fp16: an overflow; the scale is halved
                logger.info(
                    "learner step %d: fp16 gradients overflowed at loss scale %g; update skipped, scale now %g",
                    self.step_count,
                    scale,
                    self.scaler.scale,
                )
                return grad_norm
            warnings.warn(
                f"learner step {self.step_count}: gradient norm is {grad_norm}; the optimiser update is skipped "
                f"({self.skipped_updates} so far). Lower the learning rate or check the rewards",
                RuntimeWarning,
                stacklevel=3,
            )
        return grad_norm

    def _metrics(self, step: StepPlan, sums: UpdateSums, run: StepRun) -> dict[str, float]:
        """LEARNER_METRICS from the step's plan and totals, its update sums (both over all workers) and run."""
        totals = step.totals
        per = {"action_tokens": totals.action_tokens, "updates": float(len(run.grad_norms))}
        metrics = {
            **totals.figures(),
            **sums.figures(per, self.reweighting.measured),
            **self.reweighting.figures(),
            "learner/entropy_all": step.entropy_all,
            "learner/grad_norm": run.grad_norm,
            "learner/lr": run.lr,
            "learner/tokens_per_s": totals.tokens / run.step_s,
            "learner/step_s": run.step_s,
            "learner/pre_update_s": step.pre_update_s,
            "learner/skipped_updates": float(self.skipped_updates),
            "learner/loss_scale": float(self.scaler.scale),
            "mismatch/max_abs_log_ratio": step.max_abs_log_ratio,
        }
        return {name: float(metrics[name]) for name in LEARNER_METRICS}

    # ---- other passes -------------------------------------------------------------------------------

    @torch.no_grad()
    def token_stats(self, batch: Batch) -> TokenStats:
        """log pi(a), entropy and Phi's collision term of the current policy over a whole batch (no update)."""
        self.policy.eval()
        stats = self.policy(batch.to(self.device), want_collision=True)
        self.policy.train()
        return stats

    # ---- checkpoints --------------------------------------------------------------------------------

    def save_shards(self, folder: str | Path) -> None:
        """The model and optimiser as this worker holds them (see `save_policy_shards`)."""
        save_policy_shards(self.policy, self.optimizer, folder)

    def load_shards(self, folder: str | Path) -> None:
        load_policy_shards(self.policy, self.optimizer, folder)

    def model_state_dict(self) -> dict[str, Tensor]:
        """The model's full weights (gathered from the shards under FSDP): what rollout workers load."""
        if not self.collective.shards_gradients:
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(
            self.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return {key.removeprefix("model."): value for key, value in full.items()}

    def _optimizer_state_dict(self) -> dict:
        if not self.collective.shards_gradients:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.policy, self.optimizer, options=options)

    def state_dict(self) -> dict:
        """Everything the next step depends on: model, optimiser, LR schedule, gate, RNG states, counters."""
        return {
            "model": self.model_state_dict(),
            "optimizer": self._optimizer_state_dict(),
            **self.small_state_dict(),
        }

    def small_state_dict(self) -> dict:
        """The state without the model and the optimiser (which `save_shards` writes shard by shard)."""
        state = {
            "scheduler": self.scheduler.state_dict(),
            "stare": self.reweighting.state_dict(),
            "step_count": self.step_count,
            "skipped_updates": self.skipped_updates,
            "loss_scaler": self.scaler.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def hf_model(self, model_dir: Path) -> nn.Module:
        return self.model  # this process holds it

    def save_checkpoint(self, state: dict[str, Any], path: Path, *, tokenizer_dir: Path) -> None:
        """Model, optimiser and the rest in one checkpoint, beside a model folder `stare-agents eval --model`
        takes (and resume reads)."""
        save_checkpoint(
            {**state, "learner": self.state_dict()}, path, model=self.model, tokenizer_dir=tokenizer_dir
        )

    def resume(self, checkpoint: Path, state: dict[str, Any]) -> None:
        if state.get("sharded"):
            raise ValueError(
                f"{checkpoint} holds a data-parallel learner's shards (rl.learner_workers > 1): resume it with "
                "the settings it was trained with"
            )
        self.load_state_dict(state["learner"])  # model, optimiser, schedule, gate, RNG states

    def close(self) -> None:
        """Leave the weight-sync groups this learner sends to."""
        self.sender.close()

    def load_state_dict(self, state: dict) -> None:
        if self.collective.shards_gradients:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
            model_state = {f"model.{key}": value for key, value in state["model"].items()}
            set_model_state_dict(self.policy, model_state, options=options)
            set_optimizer_state_dict(self.policy, self.optimizer, state["optimizer"], options=options)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.load_small_state_dict(state)

    def load_small_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.reweighting.load_state_dict(state["stare"], algorithm=self.algorithm.name)
        self.step_count = int(state["step_count"])
        self.skipped_updates = int(state["skipped_updates"])
        self.scaler.load_state_dict(state.get("loss_scaler"))
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
