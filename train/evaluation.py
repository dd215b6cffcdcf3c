"""Evaluation during training: the held-out tasks (drawn once per run, never training problems) scored on the
rollout workers' current weights, and `eval.benchmarks` through the eval harness on the same workers."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from stare_agents.envs.registration import split_kwargs
from stare_agents.envs.tasks import Task, unique_tasks
from stare_agents.eval import DATA_DIR_ENV, evaluate_on_workers, get_protocol, load_benchmark
from stare_agents.rollout import RolloutTask, RolloutWorkerGroup
from stare_agents.rollout.summary import summarize_episodes
from stare_agents.rollout_log import write_heldout
from stare_agents.sandbox import backend_class
from stare_agents.train.config import TrainConfig, benchmark_protocol
from stare_agents.train.run_folder import EVALS_DIR, StageTimer

logger = logging.getLogger("stare_agents.train")


class RunEvaluation:
    """A run's held-out tasks and benchmarks, loaded once; `timer` (the run's) gets each evaluation's time."""

    def __init__(self, config: TrainConfig, timer: StageTimer) -> None:
        self.config = config
        self.timer = timer
        self._heldout: list[Task] | None = None
        self._benchmarks: list[Any] | None = None
        self.tokenizer_dir: Path | None = None  # the trainer's model: kept held-out samples get token texts

    def heldout_tasks(self, count: int) -> list[Task]:
        """The first `count` held-out tasks: distinct problems, drawn from seeds `env.eval_seed`, ... of the
        environment's held-out split when it has one (see `split_kwargs`); the same list for every point."""
        c = self.config
        needed = max(c.eval.num_tasks, c.eval.base_num_tasks or 0, c.eval.every_num_tasks or 0)
        if self._heldout is None:
            import gymnasium as gym

            env = gym.make(c.env.id, **split_kwargs(c.env.id, c.env.make_kwargs(), "heldout"))
            try:
                self._heldout = unique_tasks(env, needed, first_seed=c.env.eval_seed)
            finally:
                env.close()
        return self._heldout[:count]

    def check_heldout(self) -> None:
        """The held-out tasks can be drawn and are not training tasks: an environment with a `split` gets
        "train" for training and "heldout" here (its own choice: a dataset environment without a held-out
        part refuses); `env.kwargs.split` would make both the same, so it is refused."""

        c = self.config
        if "split" in c.env.kwargs and "split" in split_kwargs(c.env.id, {}, "train"):
            raise ValueError(
                f"env.kwargs.split = {c.env.kwargs['split']!r}: the trainer draws training tasks from split "
                "'train' and held-out ones from 'heldout', and a fixed split would evaluate on training "
                "problems; remove env.kwargs.split"
            )
        if c.eval.num_tasks:
            self.heldout_tasks(c.eval.num_tasks)

    def evaluate(
        self, workers: RolloutWorkerGroup, num_tasks: int | None = None, point: str | None = None
    ) -> dict[str, Any]:
        """Accuracy (and tool use) of `workers`' current weights on the first `num_tasks` held-out tasks;
        `per_task` maps each task id to its score (the mean correctness of its samples); `weight_version` and
        `weights_digest` name the weights scored (`RolloutWorkerGroup.weights`). With `point` ("base", "sft", "rl",
        "rl-step-000010", ...) the samples are kept in <run>/heldout/<point>.jsonl.gz for the viewer's
        across-training view."""
        c = self.config
        scored = workers.weights()
        heldout = self.heldout_tasks(num_tasks or c.eval.num_tasks)
        tasks = [
            RolloutTask(
                c.env.id,
                options={**task.data, "problem": task.problem, "answer": task.answer, "id": task.id},
                env_kwargs=c.env.make_kwargs(),
                group_id=task.id,
                sample_index=j,
            )
            for task in heldout
            for j in range(c.eval.samples)
        ]
        with self.timer("eval") as took:
            trajectories = workers.collect(
                tasks, c.rollout_config(evaluation=True), progress=c.logging.progress
            )
        seconds = took.seconds
        if point is not None:
            write_heldout(c.out_dir, point, trajectories, self.tokenizer_dir)
        per_task: dict[str, float] = {task.id: 0.0 for task in heldout}
        for trajectory in trajectories:  # a failed episode scores 0 here (it answered nothing)
            per_task[trajectory.group_id] += float(bool(trajectory.correct)) / c.eval.samples
        summary = summarize_episodes(trajectories, seconds)
        return {**summary, **scored, "tasks": len(heldout), "per_task": per_task}

    def evaluate_benchmarks(
        self, workers: RolloutWorkerGroup, steps_done: int, folder: Path, tokenizer_dir: Path, key: str
    ) -> dict:
        """`eval.benchmarks` on `workers`' current weights (the policy after `steps_done` RL steps), each with
        the eval harness into `folder/evals/step-NNNNNN/<name>/` (samples.jsonl, results.json, ...); returns
        the figures for the step's record: `benchmark/<name>/avg@k` with its 95% interval, pass@1, pass@k."""

        c = self.config
        figures: dict[str, Any] = {}
        with self.timer("eval_benchmarks"):
            for entry, benchmark in zip(c.eval.benchmarks, self.benchmarks(), strict=True):
                config = entry.eval_config(c)
                out = folder / EVALS_DIR / f"step-{steps_done:06d}" / benchmark.name
                shutil.rmtree(out, ignore_errors=True)  # a repeated step (resume) evaluates afresh
                identity = {
                    "path": str(out),
                    "name": f"{c.name} ({key}) after {steps_done} RL steps",
                    "fingerprint": None,
                    **workers.weights(),  # weight_version and weights_digest: the weights scored
                }
                metrics = evaluate_on_workers(
                    workers,
                    benchmark_protocol(entry),
                    config,
                    tokenizer_dir,
                    benchmark,
                    out=out,
                    identity=identity,
                    progress=c.logging.progress,
                )
                k, prefix = entry.k, f"benchmark/{benchmark.name}"
                figures.update(
                    {
                        f"{prefix}/avg@{k}": metrics.avg.value,
                        f"{prefix}/avg@{k}_ci_low": metrics.avg.ci_low,
                        f"{prefix}/avg@{k}_ci_high": metrics.avg.ci_high,
                        **{
                            f"{prefix}/pass@{n}": metrics.pass_at[n].value for n in {1, k} if n in metrics.pass_at
                        },
                        f"{prefix}/error_rate": metrics.error_rate,
                        f"{prefix}/problems": metrics.problems,
                    }
                )
                logger.info(
                    "%s after %d RL steps: avg@%d %s", benchmark.name, steps_done, k, metrics.avg.format()
                )
        return figures

    def benchmarks(self) -> list[Any]:
        """The loaded `eval.benchmarks` (read once per run; a Hugging Face id is fetched here)."""
        if self._benchmarks is None:

            c = self.config
            runs_code = backend_class(c.rollout.sandbox).runs_code
            for i, entry in enumerate(c.eval.benchmarks):
                if not runs_code and not get_protocol(entry.protocol).single_turn:
                    raise ValueError(
                        f"eval.benchmarks[{i}].protocol = {entry.protocol!r} runs the Python tool, but "
                        f"rollout.sandbox is {c.rollout.sandbox!r}, which runs no code: use a sandbox, or a "
                        "single-turn protocol (cot)"
                    )
            self._benchmarks = [self._load(i) for i in range(len(c.eval.benchmarks))]
        return self._benchmarks

    def _load(self, index: int) -> Any:
        """eval.benchmarks[index] read (a name in the data folder, a file, a Hugging Face id), or a ValueError
        naming the entry and the key that points at the data."""
        c = self.config
        entry = c.eval.benchmarks[index]
        try:
            return load_benchmark(entry.benchmark, data_dir=c.eval.data_dir, limit=entry.limit)
        except (ValueError, FileNotFoundError, KeyError, RuntimeError) as error:
            raise ValueError(
                f"eval.benchmarks[{index}].benchmark = {entry.benchmark!r}: {error} (a training run's data "
                f"folder: eval.data_dir=DIR, else ${DATA_DIR_ENV})"
            ) from None
