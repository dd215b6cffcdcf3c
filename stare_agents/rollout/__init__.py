"""Rollouts: inference engines, the token-in-token-out agent loop, and Ray rollout workers.

from stare_agents.rollout import RolloutConfig, RolloutTask, collect, make_engine

engine = make_engine("vllm", model_dir, dtype="bfloat16")
tasks = [RolloutTask("stare_agents/ArithmeticTIR-v0", seed=i, group_id=str(i)) for i in range(8)]
trajectories = collect(engine, tasks, RolloutConfig(max_tokens_per_turn=256), sandbox=sandbox)
"""

from stare_agents.rollout.agent_loop import (
    RolloutConfig,
    RolloutTask,
    collect,
    collect_async,
    make_env,
    run_episode,
)
from stare_agents.rollout.engine import (
    ENGINES,
    FINISH_REASONS,
    Engine,
    Generation,
    SamplingParams,
    StopOnToolCall,
    make_engine,
)
from stare_agents.rollout.env_pool import EnvProcessDied, EnvProcessPool, RemoteEnv
from stare_agents.rollout.render import ChatRenderer, InlineRenderer, TemplateError, make_renderer
from stare_agents.rollout.workers import RolloutWorker, RolloutWorkerGroup, WorkerSpec

__all__ = [
    "ENGINES",
    "FINISH_REASONS",
    "ChatRenderer",
    "Engine",
    "EnvProcessDied",
    "EnvProcessPool",
    "Generation",
    "InlineRenderer",
    "RemoteEnv",
    "RolloutConfig",
    "RolloutTask",
    "RolloutWorker",
    "RolloutWorkerGroup",
    "SamplingParams",
    "StopOnToolCall",
    "TemplateError",
    "WorkerSpec",
    "collect",
    "collect_async",
    "make_engine",
    "make_env",
    "make_renderer",
    "run_episode",
]
