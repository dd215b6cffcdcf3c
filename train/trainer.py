"""A training run: base accuracy -> SFT cold start -> accuracy -> RL with STARE -> accuracy.

    summary = train(load_config(recipe="smollm2-arith"))        # = stare-agents train --recipe smollm2-arith

`Trainer.run` is the list of stages. Each has its room: the SFT cold start here (`train/sft.py` fits it), the
RL loop in `train/rl_loop.py` (one step, as in the paper's algorithm box:

    tasks        = training_tasks(config, position)       # prompts x samples, from the data position
    trajectories = workers.collect(tasks)                 # rollout: vLLM/HF engines + sandboxed tools
    advantages   = compute_advantages(rewards, groups)    # GRPO, overlong shaping, dynamic sampling
    metrics      = learner.step(batch, advantages)        # entropy gate, STARE weights, clipped update
    workers.update_weights(learner weights)               # weight sync, version + 1

), held-out and benchmark evaluation in `train/evaluation.py`, the run folder and its writer in
`train/run_folder.py`, the summary and plots in `train/run_summary.py`.

Everything a run writes lives in its folder: `config.yaml`, `metrics.jsonl` (one record per RL step and per
evaluation), TensorBoard events, `checkpoints/`, the SFT model, `summary.json` and `training.png`. A run
killed at any point (SIGKILL included) continues from its last checkpoint with `resume=True`.

Every evaluation names the weights it scored: the engines' weight version and a digest of the weights they hold
(`weight_version`, `weights_digest` in its metrics.jsonl record and in progress.json). Before a point is
evaluated the engines are made to hold its weights (`_hold`): the base model as loaded (version 0), the SFT
model (version 1), an RL arm's final weights (the version its last step reached, from `final_model/` when the
run was resumed after the arm ended), so that a resumed run scores the same weights as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from stare_agents._quiet_progress import quiet_progress_bars
from stare_agents.algo import AlgorithmConfig
from stare_agents.envs.registration import split_kwargs
from stare_agents.models import prepare_model
from stare_agents.rollout import RolloutTask, RolloutWorkerGroup, make_env
from stare_agents.rollout.engine import eos_token_ids
from stare_agents.rollout.local_ray import init_ray
from stare_agents.sandbox import check_backend, make_sandbox
from stare_agents.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
)
from stare_agents.train.config import (
    TrainConfig,
    check_run,
    resolved_weight_sync,
    save_config,
)
from stare_agents.train.distributed import DistributedConfig, LearnerGroup, SFTGroup
from stare_agents.train.evaluation import RunEvaluation
from stare_agents.train.learner import Learner, TrainingLearner
from stare_agents.train.memory_plan import MemoryPlan, plan_run
from stare_agents.train.model_export import save_trained_model
from stare_agents.train.policy import load_causal_lm
from stare_agents.train.preflight import driver_runs_code, node_preflight
from stare_agents.train.rl_loop import RLLoop, SampledStep
from stare_agents.train.run_folder import (
    FINAL_MODEL,
    SFT_CHECKPOINT,
    SFT_MODEL,
    RunLog,
    RunState,
    check_same_run,
)
from stare_agents.train.run_summary import accuracy_estimate, write_summary
from stare_agents.train.sft import SFTTrainer, traces_fingerprint
from stare_agents.train.traces import conversation_traces, seeds_per_kind, solver_traces
from stare_agents.trajectory import Trajectory

logger = logging.getLogger("stare_agents.train")
# the engines' weight versions of the weights every run holds: the base model as the engines load it, the SFT
# model; an RL arm starts one past the weights it starts from, and each synced step adds one
BASE_VERSION, SFT_VERSION = 0, 1


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
        self.state = RunState(self.folder, resume=resume)  # progress.json: what is done, stage times
        self.progress = self.state.progress
        if resume and (self.folder / "config.yaml").exists():
            check_same_run(self.folder / "config.yaml", config)
        save_config(config, self.folder / "config.yaml")
        self.workers: RolloutWorkerGroup | None = None
        self.evaluation = RunEvaluation(config, self.state.timer)
        self._run_logs: dict[Path, RunLog] = {}  # each run folder's one writer (`run_log`)
        self.memory_plans: dict[str, MemoryPlan] | None = None  # by stage, from `memory_plan`

    def run_log(self, folder: Path | None = None, *, purge_from: int | None = None) -> RunLog:
        """The one writer of a run folder's records (evaluation, SFT, RL; `folder`: this run's, or a compared
        algorithm's), opened on first use and closed when `run()` ends. `purge_from` (where RL starts): opened
        anew without what a killed attempt logged from that step on."""
        folder = folder or self.folder
        logs = self._run_logs
        if purge_from is not None and folder in logs:
            logs.pop(folder).close()
        if folder not in logs:
            logs[folder] = RunLog(folder, self.config, purge_from=purge_from)
        return logs[folder]

    # ---- the run ----
    def run(self, *, compare: str | None = None, checked: bool = False) -> dict[str, Any]:
        """All stages. `compare`: also train this algorithm preset (e.g. "grpo-ds") from the same SFT model.
        `checked`: the caller ran `preflight` (as `train` and the CLI do), else it runs first."""

        config = self.config
        if not checked:  # the environment, its kwargs, sft.data, --compare and the sandbox: before any work
            preflight(config, compare=compare)
        self.evaluation.benchmarks()  # eval.benchmarks that cannot load (a Hugging Face id offline) stop the run now
        self.evaluation.check_heldout()  # a held-out evaluation that would draw training problems stops the run now
        with self.state.timer("prepare_model"):
            base_dir = prepare_model(config.model.name)
        self.evaluation.tokenizer_dir = base_dir
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
        node_preflight(config, self.folder, base_dir)  # every worker's node: storage, model, data, CUDA, sandbox
        self.workers = self._start_workers(base_dir)
        self.engines_hold = "base"  # whose weights the engines sample with (a point's name)
        try:
            self.memory_plan("rl", base_dir)  # a learner that cannot fit stops here, before anything loads
            if "base" not in self.progress.get("accuracy", {}):
                self._record_accuracy("base", num_tasks=config.eval.base_num_tasks)
            rl_start, start_version = base_dir, BASE_VERSION
            if config.sft.enabled:
                rl_start, start_version = self.folder / SFT_MODEL, SFT_VERSION
                if not self.progress.get("sft_done"):
                    self.supervised_fine_tuning(base_dir, rl_start)
                if "sft" not in self.progress.get("accuracy", {}):
                    self._hold("sft", rl_start, SFT_VERSION)
                    self._record_accuracy("sft")
            for name, folder in runs.items():
                algorithm = (
                    config.algorithm() if name == config.rl.algorithm else AlgorithmConfig.preset(name)
                )
                key = "rl" if folder == self.folder else f"rl-{name}"
                if not self.progress.get(f"{key}_done"):
                    self.reinforce(rl_start, algorithm, folder, key, start_version + 1)
                if key not in self.progress.get("accuracy", {}):
                    self._hold(key, folder / FINAL_MODEL, self.progress.get("weight_versions", {}).get(key))
                    self._record_accuracy(key)
            return self.write_summary(compare)
        finally:
            self.workers.close()
            self.workers = None
            for log in self._run_logs.values():
                log.close()
            self._run_logs.clear()

    def _start_workers(self, model_dir: Path) -> RolloutWorkerGroup:
        c = self.config
        spec = c.worker_spec(model_dir)
        with self.state.timer("start_workers"):
            workers = RolloutWorkerGroup(
                spec, c.rollout.workers, use_ray=c.rollout.use_ray, ray_address=c.rollout.ray_address
            )
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

    def _sync_from_dir(self, model_dir: Path, version: int | None = None) -> None:
        assert self.workers is not None
        self.workers.update_weights(load_causal_lm(model_dir).state_dict(), version=version)

    def _hold(self, point: str, model_dir: Path, version: int | None) -> None:
        """Make the engines hold the weights of `point` (saved in `model_dir`, weight version `version`) before
        it is evaluated, unless they hold them already: a run resumed after the SFT model was saved, or after an
        RL arm ended, starts its engines on the base model. Nothing is synced when nothing reads the engines
        (eval.num_tasks=0)."""
        if not self.config.eval.num_tasks or self.engines_hold == point:
            return
        if point != "sft":  # only a resumed run gets here for an RL arm: say so
            logger.info(
                "resumed after %s ended: its final weights (%s) go to the engines first", point, model_dir
            )
        self._sync_from_dir(model_dir, version)
        self.engines_hold = point

    # ---- evaluation (train/evaluation.py) ----
    def _record_accuracy(self, point: str, step: int | None = None, num_tasks: int | None = None) -> dict:
        if not self.config.eval.num_tasks:  # eval.num_tasks=0: benchmarks only (eval.benchmarks)
            self.progress.setdefault("accuracy", {})[point] = None
            self.state.save()
            return {}
        assert self.workers is not None
        result = self.evaluation.evaluate(self.workers, num_tasks, point=point)
        score = accuracy_estimate(result["per_task"], self.config.eval.bootstrap)
        logger.info("accuracy (%s): %s on %d held-out tasks", point, score.format(), result["tasks"])
        self.progress.setdefault("accuracy", {})[point] = score.value
        self.progress.setdefault("evaluations", {})[point] = result
        self.state.save()
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
        with self.state.timer("sft_data"):
            tokenizer = AutoTokenizer.from_pretrained(base_dir)
            model = load_causal_lm(base_dir)
            eos_ids = eos_token_ids(tokenizer, model.generation_config)
            if c.sft.data == "solver":

                start = c.env.train_seed + 10_000_000  # apart from RL's seeds
                seeds = [start + i for i in range(c.sft.num_examples)]
                # the solver's code must run to be verified: "none" still uses Docker here, never the host
                backend, sandbox_kwargs = c.rollout.code_sandbox()  # the rollout workers' kwargs
                with make_sandbox(backend, pool_size=4, **sandbox_kwargs) as sandbox:
                    if c.sft.per_kind:
                        seeds = seeds_per_kind(
                            c.env.id,
                            start,
                            c.sft.per_kind,
                            env_kwargs=split_kwargs(c.env.id, c.env.make_kwargs(), "train"),
                            sandbox=sandbox,
                        )
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
        with self.state.timer("sft"):
            sft_config = self.memory_plan("sft", base_dir).applied(
                c.sft.sft_config(seed=c.seed, device="cuda" if torch.cuda.is_available() else "cpu")
            )
            pad = tokenizer.pad_token_id or 0
            if c.rl.learner_workers > 1:  # the same data-parallel (FSDP) workers as RL: a model one device cannot fit

                del model
                sft: Any = SFTGroup(base_dir, sft_config, self._distributed_config(), pad_token_id=pad)
            else:
                sft = SFTTrainer(model, sft_config, pad_token_id=pad)
            try:
                self._fit_sft(sft, traces, base_dir)
                save_trained_model(sft, base_dir, out)  # a data-parallel group's from its workers' shards
            finally:
                sft.close()
        self.progress["sft_done"] = True
        self.progress["sft_traces"] = len(traces)
        self.state.save()
        shutil.rmtree(self.folder / SFT_CHECKPOINT, ignore_errors=True)

    def _fit_sft(self, sft: Any, traces: list[Trajectory], base_dir: Path) -> None:
        """Fit `sft` (an SFTTrainer or SFTGroup) on the traces with a checkpoint every sft.checkpoint_every steps,
        going on from the last one under `--resume`."""
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
                return
            sft.save_checkpoint({"traces": fingerprint}, path, tokenizer_dir=base_dir)

    # ---- RL ----
    def memory_plan(self, stage: str, model_dir: Path) -> MemoryPlan:
        """The learner's memory plan for `stage` ("sft", "rl") on this machine's device. Both stages are planned
        at the first call, from the model's config alone (train/memory_plan.py), and said in the log; a learner
        that cannot fit raises MemoryPlanError with the numbers."""
        if self.memory_plans is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            self.memory_plans = plan_run(self.config, model_dir, device=device)
            for name, plan in self.memory_plans.items():
                (logger.warning if plan.changes else logger.info)("%s %s", name, plan.summary())
        return self.memory_plans[stage]

    def make_learner(self, model_dir: Path, algorithm: AlgorithmConfig) -> TrainingLearner:
        c = self.config
        learner_config = dataclasses.replace(c.rl.learner, device="cuda" if torch.cuda.is_available() else "cpu")
        learner_config = self.memory_plan("rl", model_dir).applied(learner_config)
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

    def reinforce(
        self, start_dir: Path, algorithm: AlgorithmConfig, folder: Path, key: str, version: int | None = None
    ) -> None:
        """The RL loop of one algorithm (`rl_loop.RLLoop`), from `start_dir` (the engines get its weights as
        weight version `version`; default: one past theirs), resumable from its checkpoints. The engines end on
        the arm's final weights, whose version progress.json keeps (`weight_versions`)."""
        assert self.workers is not None
        folder.mkdir(parents=True, exist_ok=True)
        learner = self.make_learner(start_dir, algorithm)
        start, position, ahead = 0, 0, None
        latest = latest_checkpoint(folder) if self.resume else None
        if latest is not None:
            state = load_checkpoint(latest)
            learner.resume(latest, state)  # model, optimiser, schedule, gate, RNG states
            start, version = int(state["next_step"]), int(state["weight_version"])
            position = int(state["data_position"])  # prompts drawn so far
            if state.get("ahead") is not None:  # a pipelined run's next batch, sampled before the checkpoint
                ahead = SampledStep.from_state(state["ahead"])
            logger.info("resuming %s from %s (step %d)", key, latest, start)
        try:
            self._sync(learner, version)  # the workers start from the learner's weights (SFT model or checkpoint)
            self.engines_hold = key
            loop = RLLoop(
                self.config,
                self.workers,
                learner,
                algorithm,
                folder=folder,
                start_dir=start_dir,
                key=key,
                evaluation=self.evaluation,
                sync_weights=self._sync,
                timer=self.state.timer,
                position=position,
                ahead=ahead,
            )
            metrics_path = loop.run(start, self.run_log(folder, purge_from=start))
            with self.state.timer("save_model"):  # a model folder for `eval --model`
                save_trained_model(learner, start_dir, folder / FINAL_MODEL)
            self.progress[f"{key}_done"] = True
            self.progress.setdefault("weight_versions", {})[key] = self.workers.weight_version
            self.progress.setdefault("rl_logs", {})[key] = str(metrics_path)
            self.state.save()
        finally:
            learner.close()

    def _sync(self, learner: TrainingLearner, version: int | None = None) -> float:
        """Send the learner's weights to the rollout workers (straight from the learner when rollout.weight_sync
        resolves to "collective": `stare_agents.rollout.weight_sync`)."""
        assert self.workers is not None
        with self.state.timer("sync") as took:
            if resolved_weight_sync(self.config, driver_has_gpu=torch.cuda.is_available()) == "collective":
                bucket_mb = self.config.rollout.weight_sync_bucket_mb
                self.workers.update_weights_from(learner.sender, version=version, bucket_mb=bucket_mb)
            else:
                self.workers.update_weights(learner.model_state_dict(), version=version)
        return took.seconds

    # ---- summary and plot ----

    def write_summary(self, compare: str | None) -> dict[str, Any]:
        """summary.json and training.png (`run_summary.write_summary`)."""
        return write_summary(
            self.config,
            self.folder,
            self.progress,
            stage_seconds=self.state.stage_seconds,
            wall_time_s=self.state.wall_time_s(),
            compare=compare,
        )


def preflight(config: TrainConfig, *, compare: str | None = None) -> None:
    """The checks before any work, each run once: the environment, its kwargs, sft.data and --compare
    (`check_run`), and a usable sandbox (`check_backend`) where this process runs code itself; the nodes' own
    checks (the rollout nodes' sandbox among them) come once the run folder exists (`node_preflight`)."""
    check_run(config, compare=compare)
    if driver_runs_code(config):
        check_backend(config.rollout.sandbox, **config.rollout.sandbox_kwargs)


def train(
    config: TrainConfig, *, resume: bool = False, compare: str | None = None, checked: bool = False
) -> dict[str, Any]:
    """Run (or resume) a training run; returns its summary (also in summary.json). A config or a sandbox that
    cannot be used stops it before the run folder is written (`preflight`; `checked`: the caller ran it)."""
    if not checked:
        preflight(config, compare=compare)
    return Trainer(config, resume=resume).run(compare=compare, checked=True)
