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
from stare_agents.records import read_records
from stare_agents.rollout import RolloutConfig, RolloutTask, RolloutWorkerGroup
from stare_agents.rollout.summary import check_failed_share, summarize_episodes
from stare_agents.rollout_log import RolloutLog
from stare_agents.train.checkpoint import checkpoint_path, prune_checkpoints
from stare_agents.train.config import TrainConfig
from stare_agents.train.evaluation import RunEvaluation
from stare_agents.train.learner import TrainingLearner
from stare_agents.train.run_folder import RunLog, StageTimer
from stare_agents.train.run_summary import accuracy_estimate
from stare_agents.trajectory import Trajectory, collate, learning_trajectories, policy_text

logger = logging.getLogger("stare_agents.train")


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
    budget_exhausted: bool = False  # every round of rl.sampling_rounds was drawn and the step is still short
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
            "figures": [
                self.rounds,
                self.groups,
                self.dropped_groups,
                self.position,
                int(self.budget_exhausted),
            ],
            "seconds": dict(self.seconds),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SampledStep:
        trajectories = [Trajectory.from_dict(d) for d in state["trajectories"]]
        rounds, groups, dropped, position, *exhausted = (int(x) for x in state["figures"])
        return cls(
            trajectories=trajectories,
            usable=[trajectories[i] for i in state["usable"]],
            kept=[trajectories[i] for i in state["kept"]],
            advantages=state["advantages"],
            rounds=rounds,
            groups=groups,
            dropped_groups=dropped,
            position=position,
            budget_exhausted=bool(exhausted and exhausted[0]),
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


class NoLearningSignal(RuntimeError):
    """Steps in a row found no group with reward variance within their whole refill budget."""


class GroupSampler:
    """Rolls out a step's groups from the run's data position (`position`: prompts drawn so far; refills of
    dynamic sampling draw more than one batch) and computes their advantages. A step short of its batch after
    the whole budget says so once (naming the knob); rl.max_empty_steps steps in a row with no group at all stop
    the run (`NoLearningSignal`)."""

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
        self.empty_steps = 0  # steps in a row whose whole budget found no group with reward variance
        self.short_warned = False

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
        out.budget_exhausted = algorithm.dynamic_sampling and len(groups) < c.rl.prompts_per_step
        if out.budget_exhausted and not self.short_warned:
            self.short_warned = True  # once a run: each step's record says it (data/budget_exhausted)
            logger.warning(
                "RL step %d trains %d of rl.prompts_per_step=%d groups: its budget of rl.sampling_rounds=%d "
                "round(s) of %d prompts left the rest without reward variance; raise rl.sampling_rounds (or "
                "rl.sampling_batch_factor). Later short steps are counted in data/budget_exhausted, not said again",
                step,
                len(groups),
                c.rl.prompts_per_step,
                c.rl.sampling_rounds,
                per_round,
            )
        self.empty_steps = self.empty_steps + 1 if algorithm.dynamic_sampling and not groups else 0
        if c.rl.max_empty_steps and self.empty_steps >= c.rl.max_empty_steps:
            rewards = [t.reward for t in out.usable]
            mean = sum(rewards) / len(rewards) if rewards else 0.0
            raise NoLearningSignal(
                f"RL stopped at step {step}: {self.empty_steps} step(s) in a row drew their whole budget "
                f"(rl.sampling_rounds={c.rl.sampling_rounds} x {per_round} prompts) and no group had reward variance "
                f"(every sample of a prompt scored alike; mean reward of the last step {mean:.2f}: "
                + ("the tasks are solved" if mean >= 0.5 else "the model solves none of them")
                + "). Give tasks the model solves sometimes (an easier or harder env.kwargs, a cold start), raise "
                "rl.samples_per_prompt, or set rl.max_empty_steps=0 to go on without learning"
            )
        return out


class OneStepPipeline:
    """The steps' batches, in order. Off (`rl.pipeline=none`), `take(step)` samples the step's batch then. On
    (`one-step`), `take(step)` also starts sampling step + 1's batch on a thread, with the engines' current
    weights (one version behind the learner's once this step's update is synced), and `wait()` collects it
    after the update. `ahead` (the batch sampled for the next step) goes into checkpoints."""

    def __init__(
        self, sampler: GroupSampler, steps: int, *, on: bool, ahead: SampledStep | None = None
    ) -> None:
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
def untrained(trajectories: list[Trajectory], kept: list[Trajectory]) -> list[Trajectory]:
    """The trajectories of a step that ran and are not trained on: the learner scores them (learner/entropy_all,
    their per-token statistics in rollouts/)."""
    kept_ids = {id(t) for t in kept}
    return [t for t in trajectories if not t.failed and t.num_action_tokens and id(t) not in kept_ids]


def step_record(
    config: TrainConfig,
    step: int,
    algorithm: AlgorithmConfig,
    sampled: SampledStep,
    metrics: dict[str, float],
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
    record: dict[str, Any] = {"kind": "rl", "step": step, "algorithm": algorithm.name, **metrics}
    record.update(
        {
            "rollout/accuracy": summary["accuracy"],
            "rollout/mean_reward": summary["mean_reward"],
            "rollout/response_tokens": summary["response_tokens_mean"],
            "rollout/action_tokens": summary["action_tokens"],
            "rollout/turns": summary["turns_mean"],
            "rollout/tool_calls": summary["tool_calls_per_response"],
            "rollout/tool_error_rate": summary["tool_error_rate"],
            "rollout/tool_use_share": summary["tool_use_share"],  # responses with at least one tool call
            "rollout/tool_error_share": summary[
                "tool_error_share"
            ],  # responses with a call that did not end ok
            "rollout/void_turns": sum(int(t.info.get("void_turns", 0)) for t in trajectories)
            / max(1, len(trajectories)),
            "rollout/failed": summary["failed"],
            "rollout/sampler_entropy": sampler_entropy,  # mean surprisal of sampled tokens: an estimate of H
            "rollout/weight_version": trajectories[0].weight_version if trajectories else -1,
            "rollout/tokens_per_s": summary.get("action_tokens_per_s", 0.0),
            "rollout/wasted_tokens": summary["wasted_tokens"],
            "data/kept_trajectories": len(kept),
            "data/kept_groups": len({t.group_id for t in kept}),
            "data/sampling_rounds": sampled.rounds,
            "data/budget_exhausted": int(sampled.budget_exhausted),
            "data/position": sampled.position,
            "data/dropped_groups": sampled.dropped_groups,
            "data/groups": sampled.groups,
            "stop_reasons": summary["stop_reasons"],
            "reflection_words": {k: v / max(1, len(sampled.usable)) for k, v in reflections.items()},
        }
    )
    record.update({f"time/{stage}_s": value for stage, value in seconds.items()})
    return record


class ToolUseWatch:
    """Tool-use collapse (a known failure of agentic RL: the policy stops calling its tool): warns once, naming
    the figure, when the share of responses that call the tool (rollout/tool_use_share) falls below half of the
    run's first step's."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.warned = False

    def resume(self, records: list[dict[str, Any]]) -> None:
        first = next((r for r in records if r.get("step") == 0), None)
        if first is not None and "rollout/tool_use_share" in first:
            self.start = float(first["rollout/tool_use_share"])

    def check(self, record: dict[str, Any]) -> str | None:
        share = record.get("rollout/tool_use_share")
        if share is None:
            return None
        if self.start is None:
            self.start = float(share)
            return None
        if self.warned or not share < self.start / 2:
            return None
        self.warned = True
        message = (
            f"RL step {record['step']}: tool-use collapse? rollout/tool_use_share (responses with at least one tool "
            f"call) fell to {share:.2f}, under half of the first step's {self.start:.2f}; the policy is learning to "
            "answer without its tool (check rollout/tool_error_share and the rewards of answers without a call)"
        )
        logger.warning(message)
        return message


# -- the loop -------------------------------------------------------------------------------------------------
class RLLoop:
    """The steps of one algorithm's RL from `start_dir` into `folder`: `run(start)` goes from step `start` to
    rl.steps with evaluation and checkpoints as two `if` blocks; `step(step)` is one step. `sync(learner)` sends
    the learner's weights to the workers (`sync_weights`, the trainer's) and `timer` (the run's) times the run's
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
        timer: StageTimer,
        position: int = 0,
        ahead: SampledStep | None = None,
    ) -> None:
        c = config
        self.config, self.workers, self.learner, self.algorithm = config, workers, learner, algorithm
        self.folder, self.start_dir, self.key = folder, start_dir, key
        self.evaluation, self.sync_weights, self.timer = evaluation, sync_weights, timer
        self.sampler = GroupSampler(config, workers, algorithm, c.rollout_config(), position)
        self.pipeline = OneStepPipeline(self.sampler, c.rl.steps, on=c.rl.pipeline == "one-step", ahead=ahead)
        self.rollout_log = (
            RolloutLog(folder, tokenizer_dir=start_dir, fraction=c.logging.rollouts)
            if c.logging.rollouts
            else None
        )
        self.mismatch_warned = False
        self.tool_use = ToolUseWatch()

    def run(self, start: int, log: RunLog) -> Path:
        """Steps `start` .. rl.steps - 1, logged to `log` (the run folder's one writer, the trainer's, opened
        without what a killed attempt logged from `start` on); returns its metrics file."""
        c = self.config
        if start:  # the run's first step sets the tool-use level that collapse is judged against
            self.tool_use.resume(read_records(log.path, "rl"))
        bar = None
        if c.logging.progress:
            from tqdm import tqdm

            bar = tqdm(total=c.rl.steps, initial=start, desc=f"RL ({self.algorithm.name})", unit="step")
        try:
            for step in range(start, c.rl.steps):
                record = self.step(step)
                self.tool_use.check(record)
                if (
                    c.eval.num_tasks
                    and c.eval.every
                    and (step + 1) % c.eval.every == 0
                    and step + 1 < c.rl.steps
                ):
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

    def heldout_figures(self, steps_done: int) -> dict[str, Any]:
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
            "eval/weight_version": result["weight_version"],  # the weights scored
            "eval/weights_digest": result["weights_digest"],
        }

    def checkpoint(self, next_step: int) -> None:
        with self.timer("checkpoint"):
            state = {
                "next_step": next_step,
                "data_position": self.sampler.position,
                "weight_version": self.workers.weight_version,
                "ahead": self.pipeline.state(),
            }
            path = checkpoint_path(self.folder, next_step)
            self.learner.save_checkpoint(state, path, tokenizer_dir=self.start_dir)
            prune_checkpoints(self.folder, self.config.checkpoint.keep_last)

    def step(self, step: int) -> dict[str, Any]:
        """One RL step, as named stages: sample groups (refilled under dynamic sampling) and their advantages
        -> the learner's update (gate, token weights, loss) -> weight sync -> saved rollouts -> the record."""
        c, algorithm, learner = self.config, self.algorithm, self.learner
        timer = StageTimer()
        sampled = self.pipeline.take(step)
        timer.seconds.update(
            sampled.seconds
        )  # the rollout's own time (overlapped with the last update if ahead)
        staleness = [self.workers.weight_version - t.weight_version for t in sampled.kept]
        with timer("update"):  # padding is masked out of attention and loss: any pad id works
            batch = collate(sampled.kept, pad_token_id=0) if sampled.kept else None  # None: nothing to learn
            others = untrained(sampled.trajectories, sampled.kept)
            metrics = learner.step(
                batch,
                sampled.advantages,
                others=collate(others, pad_token_id=0) if others else None,
                record_tokens=c.logging.rollouts > 0,  # per-token learner outputs for rollouts/
            )
        warning = mismatch_warning(
            metrics, corrected=c.rl.learner.importance.active, fp32_head=c.model.fp32_lm_head
        )
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
                    others=others,
                    other_data=metrics.other_records,
                )
        for stage, value in timer.seconds.items():
            self.timer.add(f"rl_{stage}", value)
        record = step_record(c, step, algorithm, sampled, metrics, timer.seconds)
        # how many weight versions the trained trajectories' sampler was behind the learner (0 unless pipelined)
        record["rollout/staleness_max"] = float(max(staleness, default=0))
        record["rollout/staleness_mean"] = sum(staleness) / len(staleness) if staleness else 0.0
        return record
