"""The RL loop of one algorithm, as in the paper's algorithm box:

    loop = RLLoop(config, workers, learner, algorithm, folder=folder, start_dir=sft_dir, ...)
    loop.run(start=0)              # steps, evaluation every eval.every, a checkpoint every checkpoint.every

One step (`RLLoop.step`):

    sampled = pipeline.take(step)                          # groups + advantages (sampled ahead when pipelined)
    result  = learner.step(collate(sampled.kept), ...)     # entropy gate, token weights, clipped update
    workers.update_weights(learner)                        # weight sync, version + 1
    record  = step_record(...)                             # one metrics.jsonl line

`GroupSampler` draws the step's prompts from the run's data position and rolls them out (refilling under
dynamic sampling); `OneStepPipeline` wraps it, so that with `rl.pipeline=one-step` the next step's rollouts
run on a thread while this step's update does.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stare_agents.algo import AlgorithmConfig, compute_advantages
from stare_agents.algo.importance import mismatch_warning
from stare_agents.completions_table import log_completions
from stare_agents.envs.registration import split_kwargs
from stare_agents.eval import reflection_counts
from stare_agents.rollout import RolloutConfig, RolloutTask, RolloutWorkerGroup
from stare_agents.rollout.summary import check_failed_share, summarize_episodes
from stare_agents.rollout_log import RolloutLog
from stare_agents.train.checkpoint import checkpoint_path, prune_checkpoints
from stare_agents.train.config import TrainConfig
from stare_agents.train.evaluation import RunEvaluation
from stare_agents.train.learner import LEARNER_METRICS, StepResult, TrainingLearner
from stare_agents.train.run_folder import RunLog, StageTimer
from stare_agents.train.run_summary import accuracy_estimate
from stare_agents.trajectory import Trajectory, collate, learning_trajectories, policy_text

logger = logging.getLogger("stare_agents.train")
Timed = Callable[[str, float], None]  # adds seconds to a named stage of the run (progress.json)


# -- sampling -------------------------------------------------------------------------------------------------
@dataclass
class SampledStep:
    """What one RL step sampled: every trajectory that ran (all sampling rounds), those that can enter the loss,
    the ones it trains on with their advantages, and the sampling figures."""

    trajectories: list[Trajectory] = field(default_factory=list)
    usable: list[Trajectory] = field(default_factory=list)
    kept: list[Trajectory] = field(default_factory=list)
    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    rounds: int = 0
    groups: int = 0
    dropped_groups: int = 0
    position: int = 0  # prompts drawn by the run once this batch was sampled
    seconds: dict[str, float] = field(default_factory=dict)  # rollout and advantages, as they took

    def to_state(self) -> dict[str, Any]:
        """For a checkpoint (the batch a pipelined run sampled ahead): trajectories as dicts, the others as
        indices into them."""
        index = {id(t): i for i, t in enumerate(self.trajectories)}
        return {
            "trajectories": [t.to_dict() for t in self.trajectories],
            "usable": [index[id(t)] for t in self.usable],
            "kept": [index[id(t)] for t in self.kept],
            "advantages": self.advantages.clone(),
            "figures": [self.rounds, self.groups, self.dropped_groups, self.position],
            "seconds": dict(self.seconds),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SampledStep:
        trajectories = [Trajectory.from_dict(d) for d in state["trajectories"]]
        rounds, groups, dropped, position = (int(x) for x in state["figures"])
        return cls(
            trajectories=trajectories,
            usable=[trajectories[i] for i in state["usable"]],
            kept=[trajectories[i] for i in state["kept"]],
            advantages=state["advantages"],
            rounds=rounds,
            groups=groups,
            dropped_groups=dropped,
            position=position,
            seconds={k: float(v) for k, v in state["seconds"].items()},
        )


def training_tasks(config: TrainConfig, position: int, prompts: int | None = None) -> list[RolloutTask]:
    """`prompts` (default `rl.prompts_per_step`) prompts x samples from the data position: training prompt i
    of the run is the task `reset(seed=env.train_seed + i)` draws. Without refills, step s starts at
    s * prompts_per_step."""
    c = config
    first = c.env.train_seed + position
    return [
        RolloutTask(
            c.env.id,
            seed=first + i,
            env_kwargs=split_kwargs(c.env.id, c.env.make_kwargs(), "train"),
            group_id=f"{first + i}",
            sample_index=j,
        )
        for i in range(c.rl.prompts_per_step if prompts is None else prompts)
        for j in range(c.rl.samples_per_prompt)
    ]


class GroupSampler:
    """Rolls out a step's groups from the run's data position (`position`: prompts drawn so far; refills of
    dynamic sampling draw more than one batch) and computes their advantages."""

    def __init__(
        self,
        config: TrainConfig,
        workers: RolloutWorkerGroup,
        algorithm: AlgorithmConfig,
        rollout_config: RolloutConfig,
        position: int = 0,
    ) -> None:
        self.config, self.workers, self.algorithm = config, workers, algorithm
        self.rollout_config, self.position = rollout_config, position

    def sample(self, step: int) -> SampledStep:
        """Roll out rl.prompts_per_step prompts x samples and compute advantages; with dynamic sampling, draw
        rounds of rl.sampling_batch_factor x rl.prompts_per_step prompts (up to rl.sampling_rounds of them) until
        that many groups have reward variance (DAPO), and train on the first that many; a step left with fewer
        says so. Infrastructure failures leave the loss (a group keeps its other members); more than
        rl.max_failed_fraction of them stop the run."""
        c, algorithm, timer = self.config, self.algorithm, StageTimer()
        out = SampledStep()
        kept_advantages: list[torch.Tensor] = []
        per_round = c.rl.prompts_per_step * (c.rl.sampling_batch_factor if algorithm.dynamic_sampling else 1)
        while (
            out.rounds < c.rl.sampling_rounds and len({t.group_id for t in out.kept}) < c.rl.prompts_per_step
        ):
            with timer("rollout"):
                tasks = training_tasks(c, self.position, per_round)
                batch = self.workers.collect(tasks, self.rollout_config)
            self.position += per_round
            out.rounds += 1
            with timer("advantages"):
                out.trajectories += batch
                usable = learning_trajectories(batch)  # a policy_error stays in, reward 0
                if c.rl.drop_void_turns:  # SimpleTIR: trajectories with a void turn leave the loss
                    usable = [
                        t for t in usable if t.stop_reason != "void_turn" and not t.info.get("void_turns")
                    ]
                out.usable += usable
                if usable:
                    result = compute_advantages(
                        torch.tensor([t.reward for t in usable]),
                        [t.group_id for t in usable],
                        algorithm,
                        response_lengths=torch.tensor([float(len(t.response_ids)) for t in usable]),
                        max_response_length=c.rollout.max_total_tokens,
                    )
                    out.kept += result.kept(usable)
                    kept_advantages.append(result.advantages[result.keep])
                    out.dropped_groups += result.dropped_groups
                    out.groups += result.num_groups
            if not algorithm.dynamic_sampling:
                break  # nothing is dropped, so nothing needs refilling
        check_failed_share(out.trajectories, c.rl.max_failed_fraction, step=step)
        out.seconds, out.position = dict(timer.seconds), self.position
        out.advantages = torch.cat(kept_advantages) if kept_advantages else torch.zeros(0)
        groups = set(list(dict.fromkeys(t.group_id for t in out.kept))[: c.rl.prompts_per_step])
        if len(groups) < len({t.group_id for t in out.kept}):  # a refill overshot: train on the first groups
            chosen = [i for i, t in enumerate(out.kept) if t.group_id in groups]
            out.kept, out.advantages = [out.kept[i] for i in chosen], out.advantages[chosen]
        if algorithm.dynamic_sampling and len(groups) < c.rl.prompts_per_step:
            logger.warning(
                "RL step %d trains %d of rl.prompts_per_step=%d groups: %d sampling round(s) of %d prompts left "
                "the rest without reward variance; raise rl.sampling_rounds or rl.sampling_batch_factor",
                step,
                len(groups),
                c.rl.prompts_per_step,
                out.rounds,
                per_round,
            )
        return out


class OneStepPipeline:
    """The steps' batches, in order. Off (`rl.pipeline=none`), `take(step)` samples the step's batch then. On
    (`one-step`), `take(step)` also starts sampling step + 1's batch on a thread, with the engines' current
    weights (one version behind the learner's once this step's update is synced), and `wait()` collects it
    after the update. `ahead` (the batch sampled for the next step) goes into checkpoints."""

    def __init__(self, sampler: GroupSampler, steps: int, *, on: bool, ahead: SampledStep | None = None) -> None:
        self.sampler, self.steps, self.on, self.ahead = sampler, steps, on, ahead
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._future: concurrent.futures.Future[SampledStep] | None = None

    def take(self, step: int) -> SampledStep:
        sampled, self.ahead = self.ahead, None
        if sampled is None:
            sampled = self.sampler.sample(step)
        if self.on and step + 1 < self.steps:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead")
            self._future = self._pool.submit(self.sampler.sample, step + 1)
        return sampled

    @property
    def sampling(self) -> bool:
        """Whether the next step's batch is being sampled (`take` started it; `wait` collects it)."""
        return self._future is not None

    def wait(self) -> None:
        """The next step's batch, once sampled (what it takes beyond the update is the step's wait)."""
        if self._future is not None:
            future, self._future = self._future, None
            self.ahead = future.result()

    def state(self) -> dict[str, Any] | None:
        return self.ahead.to_state() if self.ahead is not None else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


# -- the step's figures ---------------------------------------------------------------------------------------
def entropy_of_all(
    config: TrainConfig,
    learner: TrainingLearner,
    trajectories: list[Trajectory],
    kept: list[Trajectory],
    algorithm: AlgorithmConfig,
) -> tuple[float, float]:
    """(sum, count) of the current policy's entropy over the action tokens of every trajectory that ran.
    With token-mean aggregation the kept ones are left out here (the learner's pre-update pass measures
    them). (nan, 0) unless `logging.entropy_all`, and for a learner that does not score batches (the
    data-parallel group)."""
    stare = algorithm.stare
    gate_needs_it = stare is not None and stare.gate_input != "trained"
    if not (config.logging.entropy_all or gate_needs_it) or not learner.scores_batches:
        return float("nan"), 0.0
    token_mean = algorithm.loss.aggregation == "token-mean"
    kept_ids = {id(t) for t in kept} if token_mean else set()
    others = [t for t in trajectories if not t.failed and t.num_action_tokens and id(t) not in kept_ids]
    if not others:
        return 0.0, 0.0
    batch = collate(others, pad_token_id=0)
    stats = learner.token_stats(batch)
    mask = batch.action_mask.to(stats.entropy.device).bool()
    return float(stats.entropy[mask].sum()), float(mask.sum())


def step_record(
    config: TrainConfig,
    step: int,
    algorithm: AlgorithmConfig,
    sampled: SampledStep,
    metrics: dict[str, float],
    entropy_all: tuple[float, float],
    seconds: dict[str, float],
) -> dict[str, Any]:
    """The step's metrics.jsonl record: the learner's metrics, the rollouts' summary, the data figures and
    the stage times."""
    trajectories, kept = sampled.trajectories, sampled.kept
    summary = summarize_episodes(trajectories, seconds.get("rollout", 0.0))
    action = [t for t in trajectories if t.num_action_tokens]
    sampler_entropy = -sum(
        sum(lp for lp, m in zip(t.rollout_logprobs, t.action_mask, strict=True) if m) for t in action
    ) / max(1, sum(t.num_action_tokens for t in action))
    reflections: dict[str, int] = {}
    for t in sampled.usable:  # every sampling round's
        for category, count in reflection_counts(policy_text(t)).items():
            reflections[category] = reflections.get(category, 0) + count
    kept_entropy = metrics.get("learner/entropy", float("nan"))
    gate_reads_all = algorithm.stare is not None and algorithm.stare.gate_input != "trained"
    wanted = config.logging.entropy_all or gate_reads_all
    if kept and wanted and algorithm.loss.aggregation == "token-mean":  # kept + others
        kept_tokens = sum(t.num_action_tokens for t in kept)
        total, count = entropy_all
        entropy_all = (
            (total + kept_entropy * kept_tokens, count + kept_tokens)
            if math.isfinite(kept_entropy)
            else (float("nan"), 0.0)  # the kept batch's entropy was not measured: neither is all of it
        )
    record: dict[str, Any] = {"kind": "rl", "step": step, "algorithm": algorithm.name, **metrics}
    record.update(
        {
            # the entropy the gate sees is learner/entropy (the kept, filtered batch, as the official
            # code has it); this one is over every trajectory that ran, so a step that keeps 4 of 32
            # does not make the curve jump
            "learner/entropy_all": entropy_all[0] / entropy_all[1] if entropy_all[1] else float("nan"),
            "rollout/accuracy": summary["accuracy"],
            "rollout/mean_reward": summary["mean_reward"],
            "rollout/response_tokens": summary["response_tokens_mean"],
            "rollout/action_tokens": summary["action_tokens"],
            "rollout/turns": summary["turns_mean"],
            "rollout/tool_calls": summary["tool_calls_per_response"],
            "rollout/tool_error_rate": summary["tool_error_rate"],
            "rollout/void_turns": sum(int(t.info.get("void_turns", 0)) for t in trajectories)
            / max(1, len(trajectories)),
            "rollout/failed": summary["failed"],
            "rollout/sampler_entropy": sampler_entropy,  # mean surprisal of sampled tokens: an estimate of H
            "rollout/weight_version": trajectories[0].weight_version if trajectories else -1,
            "rollout/tokens_per_s": summary.get("action_tokens_per_s", 0.0),
            "rollout/wasted_tokens": summary["wasted_tokens"],
            "data/kept_trajectories": len(kept),
            "data/sampling_rounds": sampled.rounds,
            "data/position": sampled.position,
            "data/dropped_groups": sampled.dropped_groups,
            "data/groups": sampled.groups,
            "stop_reasons": summary["stop_reasons"],
            "reflection_words": {k: v / max(1, len(sampled.usable)) for k, v in reflections.items()},
        }
    )
    record.update({f"time/{stage}_s": value for stage, value in seconds.items()})
    return record


# -- the loop -------------------------------------------------------------------------------------------------
class RLLoop:
    """The steps of one algorithm's RL from `start_dir` into `folder`: `run(start)` goes from step `start` to
    rl.steps with evaluation and checkpoints as two `if` blocks; `step(step)` is one step. `sync(learner)` sends
    the learner's weights to the workers (`sync_weights`, the trainer's) and `timed` adds seconds to the run's
    stage times."""

    def __init__(
        self,
        config: TrainConfig,
        workers: RolloutWorkerGroup,
        learner: TrainingLearner,
        algorithm: AlgorithmConfig,
        *,
        folder: Path,
        start_dir: Path,
        key: str,
        evaluation: RunEvaluation,
        sync_weights: Callable[[TrainingLearner], float],
        timed: Timed,
        position: int = 0,
        ahead: SampledStep | None = None,
    ) -> None:
        c = config
        self.config, self.workers, self.learner, self.algorithm = config, workers, learner, algorithm
        self.folder, self.start_dir, self.key = folder, start_dir, key
        self.evaluation, self.sync_weights, self.timed = evaluation, sync_weights, timed
        self.sampler = GroupSampler(config, workers, algorithm, c.rollout_config(), position)
        self.pipeline = OneStepPipeline(self.sampler, c.rl.steps, on=c.rl.pipeline == "one-step", ahead=ahead)
        self.rollout_log = (
            RolloutLog(folder, tokenizer_dir=start_dir, fraction=c.logging.rollouts) if c.logging.rollouts else None
        )
        self.mismatch_warned = False

    def run(self, start: int) -> Path:
        """Steps `start` .. rl.steps - 1; returns the metrics file they were logged to."""
        c = self.config
        log = RunLog(self.folder, c, purge_from=start)
        bar = None
        if c.logging.progress:
            from tqdm import tqdm

            bar = tqdm(total=c.rl.steps, initial=start, desc=f"RL ({self.algorithm.name})", unit="step")
        try:
            for step in range(start, c.rl.steps):
                record = self.step(step)
                if c.eval.num_tasks and c.eval.every and (step + 1) % c.eval.every == 0 and step + 1 < c.rl.steps:
                    record.update(self.heldout_figures(step + 1))
                if c.eval.benchmarks and (
                    (c.eval.every and (step + 1) % c.eval.every == 0) or step + 1 == c.rl.steps
                ):
                    record.update(
                        self.evaluation.evaluate_benchmarks(
                            self.workers, step + 1, self.folder, self.start_dir, self.key
                        )
                    )
                log.log(record)
                if self.rollout_log is not None:  # the step's completions as a table in TensorBoard / W&B
                    log_completions(step, self.rollout_log.last_saved, writer=log.writer, wandb_run=log.wandb)
                if bar is not None:
                    bar.set_postfix(
                        reward=f"{record['rollout/mean_reward']:.2f}",
                        H=f"{record['learner/entropy']:.3f}",
                        gate=int(record["stare/gate_on"]) if math.isfinite(record["stare/gate_on"]) else "-",
                    )
                    bar.update(1)
                if c.checkpoint.every and ((step + 1) % c.checkpoint.every == 0 or step + 1 == c.rl.steps):
                    self.checkpoint(step + 1)
            return log.path
        finally:
            self.pipeline.close()
            if bar is not None:
                bar.close()
            log.close()

    def heldout_figures(self, steps_done: int) -> dict[str, float]:
        """Held-out accuracy on eval.every_num_tasks tasks after `steps_done` steps, as the figures of a step's
        record (the samples kept as point "<key>-step-NNNNNN")."""
        c = self.config
        point = f"{self.key}-step-{steps_done:06d}"
        result = self.evaluation.evaluate(self.workers, c.eval.every_num_tasks, point=point)
        score = accuracy_estimate(result["per_task"], c.eval.bootstrap)
        return {
            "eval/accuracy": score.value,
            "eval/accuracy_ci_low": score.ci_low,
            "eval/accuracy_ci_high": score.ci_high,
            "eval/tasks": score.problems,
        }

    def checkpoint(self, next_step: int) -> None:
        started = time.perf_counter()
        state = {
            "next_step": next_step,
            "data_position": self.sampler.position,
            "weight_version": self.workers.weight_version,
            "ahead": self.pipeline.state(),
        }
        path = checkpoint_path(self.folder, next_step)
        self.learner.save_checkpoint(state, path, tokenizer_dir=self.start_dir)
        prune_checkpoints(self.folder, self.config.checkpoint.keep_last)
        self.timed("checkpoint", time.perf_counter() - started)

    def step(self, step: int) -> dict[str, Any]:
        """One RL step, as named stages: sample groups (refilled under dynamic sampling) and their advantages
        -> the learner's update (gate, token weights, loss) -> weight sync -> saved rollouts -> the record."""
        c, algorithm, learner = self.config, self.algorithm, self.learner
        timer = StageTimer()
        sampled = self.pipeline.take(step)
        timer.seconds.update(sampled.seconds)  # the rollout's own time (overlapped with the last update if ahead)
        staleness = [self.workers.weight_version - t.weight_version for t in sampled.kept]
        with timer("update"):
            entropy_all = entropy_of_all(c, learner, sampled.trajectories, sampled.kept, algorithm)
            if sampled.kept:  # padding is masked out of attention and loss: any pad id works
                batch = collate(sampled.kept, pad_token_id=0)
                # a gate reading every sampled trajectory gets the others' entropy (the learner adds the kept)
                reads_all = algorithm.stare is not None and algorithm.stare.gate_input != "trained"
                metrics = learner.step(
                    batch,
                    sampled.advantages,
                    others_entropy=entropy_all if reads_all else None,
                    record_tokens=c.logging.rollouts > 0,  # per-token learner outputs for rollouts/
                )
            else:  # every group had equal rewards (or failed): nothing to learn from this step
                metrics = StepResult(dict.fromkeys(LEARNER_METRICS, float("nan")), gate_on=learner.gate_on)
        warning = mismatch_warning(metrics, corrected=c.rl.learner.importance.active, fp32_head=c.model.fp32_lm_head)
        if warning and (not self.mismatch_warned or step % 10 == 0):
            logger.warning("RL step %d: %s", step, warning)
            self.mismatch_warned = True
        if self.pipeline.sampling:
            with timer("wait_rollout"):  # what the next step's rollout took beyond this update
                self.pipeline.wait()
        with timer("sync"):
            if sampled.kept:
                self.sync_weights(learner)
        if self.rollout_log is not None:  # rollouts/step-NNNNNN.jsonl.gz, for `show`
            with timer("save_rollouts"):
                self.rollout_log.write(
                    step,
                    sampled.trajectories,
                    sampled.kept,
                    sampled.advantages,
                    metrics.token_records,
                    gate_on=metrics.gate_on,
                    void_dropped=c.rl.drop_void_turns,
                )
        for stage, value in timer.seconds.items():
            self.timed(f"rl_{stage}", value)
        record = step_record(c, step, algorithm, sampled, metrics, entropy_all, timer.seconds)
        # how many weight versions the trained trajectories' sampler was behind the learner (0 unless pipelined)
        record["rollout/staleness_max"] = float(max(staleness, default=0))
        record["rollout/staleness_mean"] = sum(staleness) / len(staleness) if staleness else 0.0
        return record
