"""Rollout benchmark: the multi-turn agent loop against plain single-turn generation, wasted tokens, weight
sync, and SmolLM2 on ArithmeticTIR with the Docker sandbox — side by side in one run.

    .venv/bin/python benchmarks/bench_rollout.py --model smollm2-135m --dtype bfloat16 --episodes 64

1. Multi-turn: `--episodes` ArithmeticTIR episodes (chat-template tool turns, the Docker sandbox) through the
   agent loop; action tokens per second of wall time.
2. Single-turn: the same engine generates, for each of those episodes, one request of exactly as many tokens
   as the episode's policy turns sampled (same prompts, `ignore_eos`), all at once. The ratio (1) / (2) is
   the share of the engine's plain throughput that the loop keeps (target >= 0.85).
3. Wasted tokens: sampled by the engine but not in any trajectory (target 0). Also: the wall time of the
   same environment work alone (every episode's turns replayed through fresh environments, no engine).
4. Weight sync: the model's full state dict pushed to a Ray rollout worker (pack, ray.put, reload in vLLM,
   prefix-cache reset), median of `--syncs` pushes (target <= 2 s for SmolLM2 on this CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time


def replay_environments(tasks, trajectories, sandbox) -> float:
    """Wall time of the same environment work without the engine: every episode's policy turns (their text)
    replayed through a fresh environment, all episodes at once on threads (as the agent loop runs them)."""
    import concurrent.futures

    from stare_agents.rollout import make_env

    def replay(pair) -> None:
        task, trajectory = pair
        env = make_env(task, sandbox)
        try:
            env.reset(seed=task.seed, options=task.options)
            for turn in trajectory.turns:
                _, _, terminated, truncated, _ = env.step(turn.text)
                if terminated or truncated:
                    break
        finally:
            env.close()

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(tasks)) as pool:
        list(pool.map(replay, zip(tasks, trajectories, strict=True)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--max-tokens-per-turn", type=int, default=256)
    parser.add_argument("--max-total-tokens", type=int, default=768)
    parser.add_argument("--sandbox", default="docker")
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument(
        "--env-kwargs", default="{}", help='JSON for the environment, e.g. {"stateless": true}'
    )
    parser.add_argument("--multiprocess", action="store_true", help="vLLM's engine core in its own process")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    from stare_agents.models import prepare_model
    from stare_agents.rollout import RolloutConfig, RolloutTask, SamplingParams, collect, make_engine
    from stare_agents.rollout.summary import summarize
    from stare_agents.sandbox import make_sandbox

    model = str(prepare_model(args.model))
    engine = make_engine(
        "vllm", model, dtype=args.dtype, max_model_len=2048, kv_cache_gib=2, multiprocess=args.multiprocess
    )
    config = RolloutConfig(
        temperature=1.0, max_tokens_per_turn=args.max_tokens_per_turn, max_total_tokens=args.max_total_tokens
    )
    tasks = [
        RolloutTask("stare_agents/ArithmeticTIR-v0", seed=i, group_id=str(i)) for i in range(args.episodes)
    ]
    figures: dict = {"model": args.model, "dtype": args.dtype, "episodes": args.episodes}
    with make_sandbox(args.sandbox, pool_size=8) as sandbox:
        collect(engine, tasks[:4], config, sandbox=sandbox)  # warm-up (engine kernels, sandbox pool)
        started = time.perf_counter()
        trajectories = collect(engine, tasks, config, sandbox=sandbox)
        multi_s = time.perf_counter() - started
        env_alone_s = replay_environments(tasks, trajectories, sandbox)
    summary = summarize(trajectories, multi_s)
    action = summary["action_tokens"]

    async def single_turn() -> float:
        requests = [
            engine.generate(
                t.prompt_ids, SamplingParams(1.0, 1.0, max(1, t.num_action_tokens), ignore_eos=True)
            )
            for t in trajectories
        ]
        begun = time.perf_counter()
        generations = await asyncio.gather(*requests)
        assert sum(len(g.token_ids) for g in generations) == sum(
            max(1, t.num_action_tokens) for t in trajectories
        )
        return time.perf_counter() - begun

    single_s = asyncio.run(single_turn())
    figures.update(
        multi_turn_s=round(multi_s, 2),
        multi_turn_tok_s=round(action / multi_s, 1),
        env_steps_alone_s=round(env_alone_s, 2),
        single_turn_s=round(single_s, 2),
        single_turn_tok_s=round(action / single_s, 1),
        loop_over_single_ratio=round(single_s / multi_s, 3),
        wasted_tokens=summary["wasted_tokens"],
        action_tokens=action,
        observation_tokens=summary["observation_tokens"],
        mean_turns=round(summary["mean_turns"], 2),
        tool_calls_per_episode=round(summary["tool_calls_per_episode"], 2),
        stop_reasons=summary["stop_reasons"],
        accuracy=summary["accuracy"],
        generate_s_per_turn=round(summary["generate_s_per_turn"], 3),
        env_s_per_turn=round(summary["env_s_per_turn"], 3),
    )
    engine.close()

    import ray
    from transformers import AutoModelForCausalLM

    from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    state = AutoModelForCausalLM.from_pretrained(model).state_dict()
    spec = WorkerSpec(
        model=model,
        dtype=args.dtype,
        max_model_len=2048,
        kv_cache_gib=1,
        sandbox="none",
        multiprocess=args.multiprocess,
    )
    with RolloutWorkerGroup(spec, 1) as group:
        syncs = []
        for _ in range(args.syncs):
            group.update_weights(state)
            syncs.append(group.last_sync_s)
    ray.shutdown()
    figures.update(sync_s_median=round(statistics.median(syncs), 3), sync_s_all=[round(s, 3) for s in syncs])
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)


if __name__ == "__main__":
    main()
