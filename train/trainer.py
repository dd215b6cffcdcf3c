"""The training loop: base accuracy -> SFT cold start -> accuracy -> RL with STARE -> accuracy.

    summary = train(load_config(recipe="smollm2-arith"))        # = stare-agents train --recipe smollm2-arith

One RL step, as in the paper's algorithm box:

    tasks        = training_tasks(step)                   # prompts x samples, from the data position
    trajectories = workers.collect(tasks)                 # rollout: vLLM/HF engines + sandboxed tools
    advantages   = compute_advantages(rewards, groups)    # GRPO, overlong shaping, dynamic sampling
    metrics      = learner.step(batch, advantages)        # entropy gate, STARE weights, clipped update
    workers.update_weights(learner weights)               # weight sync, version + 1

Everything a run writes lives in its folder: `config.yaml`, `metrics.jsonl` (one record per RL step and per
evaluation), TensorBoard events, `checkpoints/`, the SFT model, `summary.json` and `training.png`. A run
killed at any point (SIGKILL included) continues from its last checkpoint with `resume=True`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stare_agents._quiet_progress import quiet_progress_bars
from stare_agents.algo import AlgorithmConfig, compute_advantages
from stare_agents.algo.importance import mismatch_warning
from stare_agents.completions_table import log_completions
from stare_agents.envs.registration import split_kwargs
from stare_agents.eval import (
    reflection_counts,
)
from stare_agents.jsonl import dumps
from stare_agents.models import prepare_model
from stare_agents.rollout import RolloutConfig, RolloutTask, RolloutWorkerGroup, make_env
from stare_agents.rollout.engine import eos_token_ids
from stare_agents.rollout.local_ray import init_ray
from stare_agents.rollout.summary import check_failed_share, summarize_episodes
from stare_agents.rollout_log import RolloutLog
from stare_agents.sandbox import check_backend, make_sandbox
from stare_agents.train.checkpoint import checkpoint_path as checkpoint_file
from stare_agents.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
)
from stare_agents.train.config import (
    TrainConfig,
    check_run,
    resolved_weight_sync,
    save_config,
)
from stare_agents.train.distributed import DistributedConfig, LearnerGroup, SFTGroup
from stare_agents.train.evaluation import RunEvaluation
from stare_agents.train.learner import LEARNER_METRICS, Learner, StepResult, TrainingLearner
from stare_agents.train.policy import load_causal_lm
from stare_agents.train.run_folder import (
    FINAL_MODEL,
    PROGRESS_FILE,
    SFT_CHECKPOINT,
    SFT_MODEL,
    RunLog,
    StageTimer,
    check_same_run,
    save_hf_model,
)
from stare_agents.train.run_summary import accuracy_estimate, write_summary
from stare_agents.train.sft import SFTTrainer, traces_fingerprint
from stare_agents.train.traces import conversation_traces, solver_traces
from stare_agents.trajectory import Trajectory, collate, learning_trajectories, policy_text

logger = logging.getLogger("stare_agents.train")

# -- stages ---------------------------------------------------------------------------------------------------
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


class Trainer:
    """One run (see the module docstring). `run()` does every stage that is not done yet."""

    def __init__(self, config: TrainConfig, *, resume: bool = False) -> None:
        quiet_progress_bars()
        self.config = config
        self.folder = Path(config.out_dir)
        if self.folder.exists() and any(self.folder.iterdir()) and not resume:
            raise FileExistsError(
                f"{self.folder} already holds a run: pass --resume to continue it, or choose another --out"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.resume = resume
        self.progress: dict[str, Any] = self._load_progress()
        if resume and (self.folder / "config.yaml").exists():
            check_same_run(self.folder / "config.yaml", config)
        save_config(config, self.folder / "config.yaml")
        self.workers: RolloutWorkerGroup | None = None
        self.started = time.perf_counter()
        self.previous_wall_s = float(self.progress.get("wall_time_s", 0.0))
        self.stage_seconds: dict[str, float] = dict(self.progress.get("stage_seconds", {}))
        self.evaluation = RunEvaluation(config, self._timed)

    # ---- bookkeeping ----
    def _load_progress(self) -> dict[str, Any]:
        path = self.folder / PROGRESS_FILE
        return json.loads(path.read_text()) if self.resume and path.exists() else {}

    def _save_progress(self) -> None:
        self.progress["stage_seconds"] = self.stage_seconds
        # wall time of this run so far, earlier (killed) attempts included up to their last save
        self.progress["wall_time_s"] = self.previous_wall_s + time.perf_counter() - self.started
        tmp = self.folder / (PROGRESS_FILE + ".tmp")
        tmp.write_text(dumps(self.progress, indent=2))
        tmp.replace(self.folder / PROGRESS_FILE)

    def run_log(self) -> RunLog:
        """The run folder's log of evaluation and SFT records (opened once, closed when `run()` ends)."""
        if getattr(self, "_run_log", None) is None:
            self._run_log = RunLog(self.folder, self.config)
        return self._run_log

    def _timed(self, stage: str, seconds: float) -> None:
        self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds

    # ---- the run ----
    def run(self, *, compare: str | None = None) -> dict[str, Any]:
        """All stages. `compare`: also train this algorithm preset (e.g. "grpo-ds") from the same SFT model."""

        config = self.config
        check_run(
            config, compare=compare
        )  # the environment, its kwargs, sft.data and --compare: before any work
        check_backend(config.rollout.sandbox, **config.rollout.sandbox_kwargs)  # no usable sandbox: stop now
        self.evaluation.benchmarks()  # eval.benchmarks that cannot load (a Hugging Face id offline) stop the run now
        self.evaluation.check_heldout()  # a held-out evaluation that would draw training problems stops the run now
        started = time.perf_counter()
        base_dir = prepare_model(config.model.name)
        self._timed("prepare_model", time.perf_counter() - started)
        runs = {config.rl.algorithm: self.folder}
        if compare:
            runs[compare] = self.folder / compare
        points = [
            "base",
            *(["sft"] if config.sft.enabled else []),
            "rl",
            *(f"rl-{n}" for n in list(runs)[1:]),
        ]
        if all(p in self.progress.get("accuracy", {}) for p in points):
            return self.write_summary(compare)  # a finished run: nothing to do but report
        self.workers = self._start_workers(base_dir)
        try:
            if "base" not in self.progress.get("accuracy", {}):
                self._record_accuracy("base", num_tasks=config.eval.base_num_tasks)
            rl_start = base_dir
            if config.sft.enabled:
                rl_start = self.folder / SFT_MODEL
                if not self.progress.get("sft_done"):
                    self.supervised_fine_tuning(base_dir, rl_start)
                if "sft" not in self.progress.get("accuracy", {}):
                    if config.eval.num_tasks:  # else nothing reads the engines before RL's first sync
                        self._sync_from_dir(rl_start)
                    self._record_accuracy("sft")
            for name, folder in runs.items():
                algorithm = (
                    config.algorithm() if name == config.rl.algorithm else AlgorithmConfig.preset(name)
                )
                key = "rl" if folder == self.folder else f"rl-{name}"
                if not self.progress.get(f"{key}_done"):
                    self.reinforce(rl_start, algorithm, folder, key)
                if key not in self.progress.get("accuracy", {}):
                    self._record_accuracy(key)
            return self.write_summary(compare)
        finally:
            self.workers.close()
            self.workers = None
            if getattr(self, "_run_log", None) is not None:
                self._run_log.close()
                self._run_log = None

    def _start_workers(self, model_dir: Path) -> RolloutWorkerGroup:
        c = self.config
        spec = c.worker_spec(model_dir)
        started = time.perf_counter()
        workers = RolloutWorkerGroup(
            spec, c.rollout.workers, use_ray=c.rollout.use_ray, ray_address=c.rollout.ray_address
        )
        self._timed("start_workers", time.perf_counter() - started)
        for worker in workers.ping():
            logger.info(
                "rollout worker %d: %s engine%s, %s",
                worker["index"],
                c.rollout.engine,
                f" on CPUs {worker['engine_cpus']}" if worker.get("engine_cpus") else "",
                f"environments in processes {worker['env_processes']} with their own {c.rollout.sandbox} sandbox"
                + (f" on CPUs {worker['env_cpus']}" if worker.get("env_cpus") else "")
                if worker.get("env_processes")
                else f"environments on threads, sandbox {worker['sandbox']}"
                + (" at low CPU priority" if worker.get("sandbox_low_priority") else ""),
            )
        return workers

    def _sync_from_dir(self, model_dir: Path) -> None:

        assert self.workers is not None
        self.workers.update_weights(load_causal_lm(model_dir).state_dict())

    # ---- evaluation (train/evaluation.py) ----
    def _record_accuracy(self, point: str, step: int | None = None, num_tasks: int | None = None) -> dict:
        if not self.config.eval.num_tasks:  # eval.num_tasks=0: benchmarks only (eval.benchmarks)
            self.progress.setdefault("accuracy", {})[point] = None
            self._save_progress()
            return {}
        assert self.workers is not None
        result = self.evaluation.evaluate(self.workers, num_tasks)
        score = accuracy_estimate(result["per_task"], self.config.eval.bootstrap)
        logger.info("accuracy (%s): %s on %d held-out tasks", point, score.format(), result["tasks"])
        self.progress.setdefault("accuracy", {})[point] = score.value
        self.progress.setdefault("evaluations", {})[point] = result
        self._save_progress()
        record = {k: v for k, v in result.items() if k != "per_task"}
        record.update({"ci_low": score.ci_low, "ci_high": score.ci_high})
        self.run_log().log({"kind": "eval", "point": point, "step": step or 0, **record})
        return result

    # ---- SFT cold start ----
    def _observation_format(self) -> str:
        """How the training environment splices tool output into an inline episode (its own setting)."""

        c = self.config
        with make_sandbox("none") as sandbox:
            kwargs = split_kwargs(c.env.id, c.env.make_kwargs(), "train")
            env = make_env(RolloutTask(c.env.id, env_kwargs=kwargs), sandbox)
            try:
                return str(getattr(env.unwrapped, "observation_format", "output_block"))
            finally:
                env.close()

    def supervised_fine_tuning(self, base_dir: Path, out: Path) -> None:
        from transformers import AutoTokenizer

        c = self.config
        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(base_dir)
        model = load_causal_lm(base_dir)
        eos_ids = eos_token_ids(tokenizer, model.generation_config)
        if c.sft.data == "solver":

            seeds = [c.env.train_seed + 10_000_000 + i for i in range(c.sft.num_examples)]  # apart from RL's
            # the solver's code must run to be verified: "none" still uses Docker here, never the host
            backend, sandbox_kwargs = c.rollout.code_sandbox()  # the rollout workers' kwargs
            with make_sandbox(backend, pool_size=4, **sandbox_kwargs) as sandbox:
                traces = solver_traces(
                    c.env.id,
                    seeds,
                    tokenizer,
                    eos_ids,
                    env_kwargs=split_kwargs(c.env.id, c.env.make_kwargs(), "train"),
                    sandbox=sandbox,
                    rendering=c.rollout.rendering,
                )
        else:
            traces = conversation_traces(
                c.sft.data,
                tokenizer,
                eos_ids,
                rendering=c.rollout.rendering,
                observation_format=self._observation_format(),
            )[: c.sft.num_examples]
        if not traces:
            raise RuntimeError(f"SFT: no usable traces from {c.sft.data!r} for {c.env.id}")
        self._timed("sft_data", time.perf_counter() - started)
        started = time.perf_counter()
        sft_config = c.sft.sft_config(seed=c.seed, device="cuda" if torch.cuda.is_available() else "cpu")
        pad = tokenizer.pad_token_id or 0
        if c.rl.learner_workers > 1:  # the same data-parallel (FSDP) workers as RL: a model one device cannot fit

            del model
            sft: Any = SFTGroup(base_dir, sft_config, self._distributed_config(), pad_token_id=pad)
        else:
            sft = SFTTrainer(model, sft_config, pad_token_id=pad)
        try:
            trained = self._fit_sft(sft, traces, base_dir)
        finally:
            sft.close()
        save_hf_model(trained, base_dir, out)
        self._timed("sft", time.perf_counter() - started)
        self.progress["sft_done"] = True
        self.progress["sft_traces"] = len(traces)
        self._save_progress()
        shutil.rmtree(self.folder / SFT_CHECKPOINT, ignore_errors=True)

    def _fit_sft(self, sft: Any, traces: list[Trajectory], base_dir: Path) -> Any:
        """Fit `sft` (an SFTTrainer or SFTGroup) on the traces with a checkpoint every sft.checkpoint_every steps,
        going on from the last one under `--resume`; returns the fine-tuned Hugging Face model."""
        c = self.config
        log, path = self.run_log(), self.folder / SFT_CHECKPOINT
        fingerprint, done_steps = traces_fingerprint(traces), 0
        if self.resume and path.is_dir():
            state = load_checkpoint(path)
            if state.get("traces") == fingerprint:
                sft.resume(path, state)
                done_steps = int(state["learner"]["steps_done"])
                log.forget("sft-step", done_steps)
                log.forget("sft", int(state["learner"]["epochs_done"]))
                logger.info("SFT goes on from its checkpoint after step %d", done_steps)
            else:  # the traces came out otherwise this time (a solver trace that failed to verify, new data)
                logger.warning(
                    "%s was taken on other SFT traces than this run's %d: SFT starts over", path, len(traces)
                )
        steps = iter(range(done_steps + 1, 1 << 62))  # sft-step: one record per optimiser step

        def log_step(out: dict[str, float]) -> None:
            log.log({"kind": "sft-step", "step": next(steps), **out})

        every = c.sft.checkpoint_every or None
        while True:
            for record in sft.fit(traces, on_step=log_step, max_steps=every):
                log.log({"kind": "sft", "step": int(record["epoch"]), "traces": len(traces), **record})
                logger.info("SFT epoch %d: loss %.4f", record["epoch"], record["loss"])
            if not sft.fitting:
                return sft.hf_model(base_dir)
            sft.save_checkpoint({"traces": fingerprint}, path, tokenizer_dir=base_dir)

    # ---- RL ----
    def training_tasks(self, position: int, prompts: int | None = None) -> list[RolloutTask]:
        """`prompts` (default `rl.prompts_per_step`) prompts x samples from the data position: training prompt i
        of the run is the task `reset(seed=env.train_seed + i)` draws. Without refills, step s starts at
        s * prompts_per_step."""
        c = self.config
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

    def make_learner(self, model_dir: Path, algorithm: AlgorithmConfig) -> TrainingLearner:
        c = self.config
        learner_config = dataclasses.replace(c.rl.learner, device="cuda" if torch.cuda.is_available() else "cpu")
        if c.rl.learner_workers > 1:

            return LearnerGroup(model_dir, algorithm, learner_config, self._distributed_config())
        return Learner.from_pretrained(model_dir, algorithm, learner_config)

    def _distributed_config(self) -> Any:
        """The learner group's settings; attaches to the Ray cluster (rollout.ray_address) or starts a local Ray
        (loopback only) when this process has none yet, e.g. with rollout.use_ray=false."""

        c = self.config
        init_ray(c.rollout.ray_address)
        return DistributedConfig(
            num_workers=c.rl.learner_workers,
            num_gpus_per_worker=c.rl.learner_gpus_per_worker,
            fsdp=c.rl.fsdp,
            placement=c.rl.learner_placement,
            resources=dict(c.rl.learner_resources_per_worker),
        )

    def reinforce(self, start_dir: Path, algorithm: AlgorithmConfig, folder: Path, key: str) -> None:
        """The RL loop of one algorithm, from `start_dir`, resumable from its checkpoints."""
        c = self.config
        assert self.workers is not None
        folder.mkdir(parents=True, exist_ok=True)
        learner = self.make_learner(start_dir, algorithm)
        start, version = 0, None
        self.data_position = 0  # prompts drawn so far (refills of dynamic sampling draw more than one batch)
        self._ahead: SampledStep | None = None  # rl.pipeline=one-step: the next step's batch, sampled ahead
        latest = latest_checkpoint(folder) if self.resume else None
        if latest is not None:
            state = load_checkpoint(latest)
            learner.resume(latest, state)  # model, optimiser, schedule, gate, RNG states
            start, version = int(state["next_step"]), int(state["weight_version"])
            self.data_position = int(state["data_position"])
            if state.get("ahead") is not None:  # a pipelined run's next batch, sampled before the checkpoint
                self._ahead = SampledStep.from_state(state["ahead"])
            logger.info("resuming %s from %s (step %d)", key, latest, start)
        self._sync(
            learner, version
        )  # the workers start from the learner's weights (the SFT model, or the checkpoint)
        log = RunLog(folder, c, purge_from=start)

        self.rollout_log = (
            RolloutLog(folder, tokenizer_dir=start_dir, fraction=c.logging.rollouts)
            if c.logging.rollouts
            else None
        )
        rollout_config = c.rollout_config()
        bar = None
        if c.logging.progress:
            from tqdm import tqdm

            bar = tqdm(total=c.rl.steps, initial=start, desc=f"RL ({algorithm.name})", unit="step")
        try:
            for step in range(start, c.rl.steps):
                record = self.rl_step(step, learner, algorithm, rollout_config)
                if (
                    c.eval.num_tasks
                    and c.eval.every
                    and (step + 1) % c.eval.every == 0
                    and step + 1 < c.rl.steps
                ):
                    score = accuracy_estimate(
                        self.evaluation.evaluate(self.workers, c.eval.every_num_tasks)["per_task"], c.eval.bootstrap
                    )
                    record.update(
                        {
                            "eval/accuracy": score.value,
                            "eval/accuracy_ci_low": score.ci_low,
                            "eval/accuracy_ci_high": score.ci_high,
                            "eval/tasks": score.problems,
                        }
                    )
                if c.eval.benchmarks and (
                    (c.eval.every and (step + 1) % c.eval.every == 0) or step + 1 == c.rl.steps
                ):
                    record.update(self.evaluation.evaluate_benchmarks(self.workers, step + 1, folder, start_dir, key))
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
                    started = time.perf_counter()
                    state = {
                        "next_step": step + 1,
                        "data_position": self.data_position,
                        "weight_version": self.workers.weight_version,
                        "ahead": self._ahead.to_state() if self._ahead is not None else None,
                    }
                    learner.save_checkpoint(state, checkpoint_file(folder, step + 1), tokenizer_dir=start_dir)
                    prune_checkpoints(folder, c.checkpoint.keep_last)
                    self._timed("checkpoint", time.perf_counter() - started)
            started = time.perf_counter()
            save_hf_model(learner.hf_model(start_dir), start_dir, folder / FINAL_MODEL)  # for `eval --model`
            self._timed("save_model", time.perf_counter() - started)
            self.progress[f"{key}_done"] = True
            self.progress.setdefault("rl_logs", {})[key] = str(log.path)
            self._save_progress()
        finally:
            if getattr(self, "_pool", None) is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
            if bar is not None:
                bar.close()
            log.close()
            learner.close()

    def _sync(self, learner: TrainingLearner, version: int | None = None) -> float:
        assert self.workers is not None
        started = time.perf_counter()
        if (
            self.weight_sync_mode() == "collective"
        ):  # straight from the learner (stare_agents.rollout.weight_sync)
            bucket_mb = self.config.rollout.weight_sync_bucket_mb
            self.workers.update_weights_from(learner, version=version, bucket_mb=bucket_mb)
        else:
            self.workers.update_weights(learner.model_state_dict(), version=version)
        seconds = time.perf_counter() - started
        self._timed("sync", seconds)
        return seconds

    def weight_sync_mode(self) -> str:
        """rollout.weight_sync resolved (see `resolved_weight_sync`)."""
        return resolved_weight_sync(self.config, driver_has_gpu=torch.cuda.is_available())

    def _entropy_of_all(
        self,
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
        if not (self.config.logging.entropy_all or gate_needs_it) or not learner.scores_batches:
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

    def rl_step(
        self, step: int, learner: TrainingLearner, algorithm: AlgorithmConfig, rollout_config: RolloutConfig
    ) -> dict:
        """One RL step, as named stages: sample groups (refilled under dynamic sampling) and their advantages
        -> the learner's update (gate, STARE weights, loss) -> weight sync -> saved rollouts -> the record."""
        c = self.config
        timer = StageTimer()
        sampled, self._ahead = getattr(self, "_ahead", None), None
        if sampled is None:
            sampled = self._sample_groups(step, algorithm, rollout_config, StageTimer())
        timer.seconds.update(
            sampled.seconds
        )  # the rollout's own time (overlapped with the last update if ahead)
        ahead = None
        if c.rl.pipeline == "one-step" and step + 1 < c.rl.steps:
            # the next step's rollouts now, with the engines' weights (one version behind the learner's after
            # this update), while the learner updates
            ahead = self._pipeline_pool().submit(
                self._sample_groups, step + 1, algorithm, rollout_config, StageTimer()
            )
        assert self.workers is not None
        staleness = [self.workers.weight_version - t.weight_version for t in sampled.kept]
        with timer("update"):
            entropy_all = self._entropy_of_all(learner, sampled.trajectories, sampled.kept, algorithm)
            if sampled.kept:  # padding is masked out of attention and loss: any pad id works
                batch = collate(sampled.kept, pad_token_id=0)
                # a gate reading every sampled trajectory gets the others' entropy (the learner adds the kept)
                reads_all = algorithm.stare is not None and algorithm.stare.gate_input != "trained"
                others = entropy_all if reads_all else None
                # per-token learner outputs for rollouts/ when rollouts are saved
                metrics = learner.step(
                    batch,
                    sampled.advantages,
                    others_entropy=others,
                    record_tokens=self.config.logging.rollouts > 0,
                )
            else:  # every group had equal rewards (or failed): nothing to learn from this step
                metrics = StepResult(dict.fromkeys(LEARNER_METRICS, float("nan")), gate_on=learner.gate_on)
        warning = mismatch_warning(
            metrics, corrected=c.rl.learner.importance.active, fp32_head=c.model.fp32_lm_head
        )
        if warning and (not getattr(self, "_mismatch_warned", False) or step % 10 == 0):
            logger.warning("RL step %d: %s", step, warning)
            self._mismatch_warned = True
        if ahead is not None:
            with timer("wait_rollout"):  # what the next step's rollout took beyond this update
                self._ahead = ahead.result()
        with timer("sync"):
            if sampled.kept:
                self._sync(learner)
        if getattr(self, "rollout_log", None) is not None:  # rollouts/step-NNNNNN.jsonl.gz, for `show`
            with timer("save_rollouts"):
                void_dropped = self.config.rl.drop_void_turns
                self.rollout_log.write(
                    step,
                    sampled.trajectories,
                    sampled.kept,
                    sampled.advantages,
                    metrics.token_records,
                    gate_on=metrics.gate_on,
                    void_dropped=void_dropped,
                )
        for stage, value in timer.seconds.items():
            self._timed(f"rl_{stage}", value)
        record = self._step_record(step, algorithm, sampled, metrics, entropy_all, timer.seconds)
        # how many weight versions the trained trajectories' sampler was behind the learner (0 unless pipelined)
        record["rollout/staleness_max"] = float(max(staleness, default=0))
        record["rollout/staleness_mean"] = sum(staleness) / len(staleness) if staleness else 0.0
        return record

    def _pipeline_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if getattr(self, "_pool", None) is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead")
        return self._pool

    def _sample_groups(
        self, step: int, algorithm: AlgorithmConfig, rollout_config: RolloutConfig, timer: StageTimer
    ) -> SampledStep:
        """Roll out rl.prompts_per_step prompts x samples and compute advantages; with dynamic sampling, draw
        rounds of rl.sampling_batch_factor x rl.prompts_per_step prompts (up to rl.sampling_rounds of them) until
        that many groups have reward variance (DAPO), and train on the first that many; a step left with fewer
        says so. Infrastructure failures leave the loss (a group keeps its other members); more than
        rl.max_failed_fraction of them stop the run."""
        c = self.config
        assert self.workers is not None
        out = SampledStep()
        kept_advantages: list[torch.Tensor] = []
        per_round = c.rl.prompts_per_step * (c.rl.sampling_batch_factor if algorithm.dynamic_sampling else 1)
        while (
            out.rounds < c.rl.sampling_rounds and len({t.group_id for t in out.kept}) < c.rl.prompts_per_step
        ):
            with timer("rollout"):
                tasks = self.training_tasks(self.data_position, per_round)
                batch = self.workers.collect(tasks, rollout_config)
            self.data_position += per_round
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
        out.seconds, out.position = dict(timer.seconds), self.data_position
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

    def _step_record(
        self,
        step: int,
        algorithm: AlgorithmConfig,
        sampled: SampledStep,
        metrics: dict[str, float],
        entropy_all: tuple[float, float],
        seconds: dict[str, float],
    ) -> dict[str, Any]:
        """The step's metrics.jsonl record: the learner's metrics, the rollouts' summary, the data figures and
        the stage times."""
        c = self.config
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
        wanted = c.logging.entropy_all or gate_reads_all
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

    # ---- summary and plot ----

    def write_summary(self, compare: str | None) -> dict[str, Any]:
        """summary.json and training.png (`run_summary.write_summary`)."""
        wall_time_s = self.previous_wall_s + time.perf_counter() - self.started
        return write_summary(
            self.config,
            self.folder,
            self.progress,
            stage_seconds=self.stage_seconds,
            wall_time_s=wall_time_s,
            compare=compare,
        )


def train(config: TrainConfig, *, resume: bool = False, compare: str | None = None) -> dict[str, Any]:
    """Run (or resume) a training run; returns its summary (also in summary.json). A sandbox that cannot be
    used stops it before the run folder is written."""

    check_backend(config.rollout.sandbox, **config.rollout.sandbox_kwargs)
    return Trainer(config, resume=resume).run(compare=compare)
