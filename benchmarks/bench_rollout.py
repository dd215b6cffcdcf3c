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
   And the same episodes' structure alone: each episode's turns regenerated in order (as many tokens as each
   turn sampled, `ignore_eos`) with its recorded observations inserted at once (no environment, no tool):
   what the multi-turn shape itself costs (observation prefill, turn-by-turn dependency) against (2).
   The sandbox's CPU time over the loop (its containers' cgroup) says what the tools' own code took from the
   cores the engine runs on.
   Every measurement starts with an empty prefix cache (the loops share their prompts: without the reset,
   whichever ran second found its first turns' prompts prefilled, and the structure replay found the whole
   contexts of the loop it replays).
   `prefill_tok_s`: the same engine computing every episode's whole context once (prompt, action and
   observation tokens; one token sampled), the cost of a token the engine reads rather than writes.
   `engine_steps` (in-process engine): each measurement's engine steps, split into decoded and prefilled
   tokens, the decode-only steps' time by batch size, a line through it (fixed ms + ms per token), and how
   the steps that prefilled observations compare with that line: where the loop's extra time goes.
   With `--env-processes N` (N > 0) the loop also runs with the environments in N processes of their own
   (`EnvProcessPool`), same engine, after the threaded loop (before it with `--pooled-first`), and is
   compared with plain generation of its own episodes' tokens. With `--env-cpus 1` those processes and
   every sandbox container run on CPU 1 and the engine (this process) on the others, for every measurement
   (plain generation included): what `rollout.env_cpus` does in a rollout worker, and the shape of a GPU node,
   where the model's code never runs on the device that generates. With `--low-priority` every loop's
   sandbox containers run at a low CPU weight (`DockerLimits.low_priority`, what CPU-only rollout
   workers do by default); `tool_timeouts` against `env_steps_alone_tool_timeouts` (the same calls without
   the engine) then says whether the engine's load starved any call into a timeout.
4. Weight sync: the model's full state dict pushed to a Ray rollout worker (pack, ray.put, reload in vLLM,
   prefix-cache reset), median of `--syncs` pushes (target <= 2 s for SmolLM2 on this CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time


def replay_environments(tasks, trajectories, sandbox) -> tuple[float, int]:
    """Wall time of the same environment work without the engine, and its tool timeouts: every episode's policy
    turns (their text) replayed through a fresh environment, all episodes at once on threads (as the agent
    loop runs them). Timeouts the loop had beyond these are calls the engine's load starved."""
    import concurrent.futures

    from stare_agents.rollout import make_env

    def replay(pair) -> int:
        task, trajectory = pair
        env = make_env(task, sandbox)
        info: dict = {}
        try:
            env.reset(seed=task.seed, options=task.options)
            for turn in trajectory.turns:
                _, _, terminated, truncated, info = env.step(turn.text)
                if terminated or truncated:
                    break
        finally:
            env.close()
        return int(info.get("tool_timeouts", 0))

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(tasks)) as pool:
        timeouts = sum(pool.map(replay, zip(tasks, trajectories, strict=True)))
    return time.perf_counter() - started, timeouts


def docker_cpu_s() -> float | None:
    """CPU seconds used by every Docker container so far (docker's own cgroup parent and the sandbox's
    low-priority one; cgroup v1 or v2), None where unreadable."""
    total, found = 0.0, False
    for parent in ("docker", "stare-sandbox"):
        try:
            with open(f"/sys/fs/cgroup/cpuacct/{parent}/cpuacct.usage") as handle:
                total += int(handle.read()) * 1e-9
                found = True
        except OSError:
            pass
    if found:
        return total
    try:  # cgroup v2: docker's containers live under system.slice as docker-<id>.scope
        import glob

        total = 0.0
        for stat in glob.glob("/sys/fs/cgroup/system.slice/docker-*.scope/cpu.stat") + glob.glob(
            "/sys/fs/cgroup/stare-sandbox*/*/cpu.stat"
        ):
            with open(stat) as handle:
                total += int(handle.readline().split()[1]) * 1e-6
        return total or None
    except OSError:
        return None


def structure_only(engine, trajectories) -> float:
    """Wall time of every episode's turns regenerated in order (each turn as many tokens as the episode's, the
    regenerated tokens kept in the context) with its recorded observations inserted at once."""
    from stare_agents.rollout import SamplingParams

    async def episode(trajectory) -> None:
        context = list(trajectory.prompt_ids)
        ids, mask, i = trajectory.response_ids, trajectory.action_mask, 0
        while i < len(ids):
            j = i
            while j < len(ids) and mask[j] == mask[i]:
                j += 1
            if mask[i] == 1:  # the turn's own tokens go on: the next turn finds them cached, as in the loop
                generation = await engine.generate(context, SamplingParams(1.0, 1.0, j - i, ignore_eos=True))
                context.extend(generation.token_ids)
            else:
                context.extend(ids[i:j])
            i = j

    async def run() -> float:
        begun = time.perf_counter()
        await asyncio.gather(*(episode(t) for t in trajectories))
        return time.perf_counter() - begun

    return asyncio.run(run())


class StepLog:
    """Every engine step of an in-process vLLM engine: its wall time, the requests it ran, and how many of its
    tokens were decoded (one new token of a running request) or prefilled (prompts, observations, the part
    of a context the prefix cache did not hold). Wraps the engine core's `step_fn` and its scheduler."""

    def __init__(self, engine) -> None:
        core = engine.llm.llm_engine.engine_core.engine_core  # in-process only (not --multiprocess)
        scheduler = core.scheduler
        self.steps: list[
            tuple[float, int, int, int]
        ] = []  # (seconds, requests, decode tokens, prefill tokens)
        self._scheduled: tuple[int, int, int] | None = None
        schedule, step_fn = scheduler.schedule, core.step_fn

        def logged_schedule(*args, **kwargs):
            out = schedule(*args, **kwargs)
            new = {request.req_id for request in out.scheduled_new_reqs}
            decode = prefill = 0
            for request_id, tokens in out.num_scheduled_tokens.items():
                if tokens == 1 and request_id not in new:
                    decode += 1
                else:
                    prefill += tokens
            self._scheduled = (len(out.num_scheduled_tokens), decode, prefill)
            return out

        def logged_step(*args, **kwargs):
            self._scheduled = None
            started = time.perf_counter()
            result = step_fn(*args, **kwargs)
            if self._scheduled is not None and self._scheduled[0]:
                self.steps.append((time.perf_counter() - started, *self._scheduled))
            return result

        scheduler.schedule, core.step_fn = logged_schedule, logged_step

    def take(self) -> dict:
        """Figures of the steps since the last call (and forget them)."""
        steps, self.steps = self.steps, []
        if not steps:
            return {}
        decode_only = [s for s in steps if s[3] == 0]
        mixed = [s for s in steps if s[3] > 0]
        figures = {
            "steps": len(steps),
            "step_s": round(sum(s[0] for s in steps), 2),
            "decode_tokens": sum(s[2] for s in steps),
            "prefill_tokens": sum(s[3] for s in steps),
            "steps_with_prefill": len(mixed),
            "steps_with_prefill_s": round(sum(s[0] for s in mixed), 2),
            "mean_decode_batch": round(sum(s[2] for s in steps) / len(steps), 1),
        }
        # decode-only steps by batch size (requests): how many, median ms
        buckets: dict[str, list[float]] = {}
        for seconds, requests, _, _ in decode_only:
            low = 1 if requests < 8 else requests // 8 * 8
            key = f"{low}-{requests // 8 * 8 + 7}" if requests >= 8 else "1-7"
            buckets.setdefault(key, []).append(seconds)
        figures["decode_step_ms_by_batch"] = {
            key: [len(v), round(1000 * statistics.median(v), 1)]
            for key, v in sorted(buckets.items(), key=lambda kv: int(kv[0].split("-")[0]))
        }
        # a least-squares line through the decode-only steps, ms = fixed + per_token * tokens, and what it
        # predicts for the steps with prefill (their tokens counted alike): measured / predicted says whether a
        # prefilled token costs the engine more than a decoded one
        if len(decode_only) >= 2:
            xs, ys = [s[2] for s in decode_only], [1000 * s[0] for s in decode_only]
            mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
            var = sum((x - mean_x) ** 2 for x in xs)
            if var > 0:
                per_token = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
                fixed = mean_y - per_token * mean_x
                figures["decode_step_ms_fit"] = {"fixed": round(fixed, 1), "per_token": round(per_token, 2)}
                small = [s for s in mixed if s[3] <= 512]  # not the first wave of prompts
                if small:
                    predicted = sum(fixed + per_token * (s[2] + s[3]) for s in small)
                    figures["small_prefill_steps_measured_over_fit"] = round(
                        1000 * sum(s[0] for s in small) / predicted, 2
                    )
        return figures


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
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--env-processes", type=int, default=0, help="also run the loop with environments in N processes"
    )
    parser.add_argument("--block-size", type=int, help="vLLM KV-cache block size (default: the engine's)")
    parser.add_argument(
        "--kv-cache-gib", type=float, default=2.0, help="the engine's KV cache (the default job's: 2)"
    )
    parser.add_argument(
        "--pooled-first",
        action="store_true",
        help="run the loop with environment processes before the threaded loop (order effects)",
    )
    parser.add_argument(
        "--env-cpus",
        default="",
        help="comma-separated CPUs for the environments and the sandbox containers; the engine (this process) "
        "is pinned to the others, for every measurement (needs --env-processes >= 1)",
    )
    parser.add_argument(
        "--low-priority",
        action="store_true",
        help="the sandbox's containers at a low CPU weight (DockerLimits.low_priority), for every loop",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    from stare_agents.models import prepare_model
    from stare_agents.rollout import RolloutConfig, RolloutTask, SamplingParams, collect, make_engine
    from stare_agents.rollout.summary import summarize_episodes
    from stare_agents.sandbox import make_sandbox

    env_cpus = [int(cpu) for cpu in args.env_cpus.split(",") if cpu.strip()]
    engine_cpus: list[int] = []
    if env_cpus:  # before the engine starts, as a rollout worker with rollout.env_cpus does
        from stare_agents.rollout.workers import pin_engine

        engine_cpus = pin_engine(env_cpus, args.env_processes)
    model = str(prepare_model(args.model))
    engine_kwargs = {"block_size": args.block_size} if args.block_size else None
    engine = make_engine(
        "vllm",
        model,
        dtype=args.dtype,
        max_model_len=2048,
        kv_cache_gib=args.kv_cache_gib,
        multiprocess=args.multiprocess,
        engine_kwargs=engine_kwargs,
    )
    config = RolloutConfig(
        temperature=args.temperature,
        max_tokens_per_turn=args.max_tokens_per_turn,
        max_total_tokens=args.max_total_tokens,
        max_concurrency=max(64, args.episodes),
    )
    env_kwargs = json.loads(args.env_kwargs)
    tasks = [
        RolloutTask("stare_agents/ArithmeticTIR-v0", seed=i, group_id=str(i), env_kwargs=env_kwargs)
        for i in range(args.episodes)
    ]
    block_size = engine.llm.llm_engine.vllm_config.cache_config.block_size
    step_log = None if args.multiprocess else StepLog(engine)
    engine_steps: dict = {}

    def take_steps(name: str) -> None:
        if step_log is not None:
            figures = step_log.take()
            if name:
                engine_steps[name] = figures

    figures: dict = {
        "model": args.model,
        "dtype": args.dtype,
        "episodes": args.episodes,
        "env_kwargs": env_kwargs,
        "temperature": args.temperature,
        "block_size": block_size,
        "kv_cache_gib": args.kv_cache_gib,
        "engine_cpus": engine_cpus or sorted(os.sched_getaffinity(0)),
        "env_cpus": env_cpus,
    }
    from stare_agents.rollout.env_pool import cpu_list
    from stare_agents.sandbox import backend_class

    backend = backend_class(args.sandbox)  # asked what it can do: Docker pins and lowers, local needs neither
    pool_sandbox_kwargs = (
        backend.with_low_priority({}, args.low_priority) if env_cpus or args.low_priority else {}
    )
    # the threaded loop's tools on the environments' CPUs too (EnvProcessPool sets its own cpuset)
    sandbox_kwargs = (
        backend.with_cpus(pool_sandbox_kwargs, cpu_list(env_cpus)) if env_cpus else pool_sandbox_kwargs
    )
    figures["low_priority"] = args.low_priority

    def threaded_loop() -> tuple:
        with make_sandbox(args.sandbox, pool_size=8, **sandbox_kwargs) as sandbox:
            collect(engine, tasks[:4], config, sandbox=sandbox)  # warm-up (engine kernels, sandbox pool)
            engine.reset_prefix_cache()
            cpu_before, process_before = docker_cpu_s(), os.times()
            take_steps("")
            started = time.perf_counter()
            trajectories = collect(engine, tasks, config, sandbox=sandbox)
            multi_s = time.perf_counter() - started
            take_steps("loop_threads")
            cpu_after, process_after = docker_cpu_s(), os.times()
            env_alone_s, figures["env_steps_alone_tool_timeouts"] = replay_environments(
                tasks, trajectories, sandbox
            )
        if cpu_before is not None and cpu_after is not None:
            figures["tool_cpu_s"] = round(cpu_after - cpu_before, 2)
        figures["loop_process_cpu_s"] = round(
            process_after.user + process_after.system - process_before.user - process_before.system, 2
        )
        return trajectories, multi_s, env_alone_s

    def pooled_loop() -> tuple:
        from stare_agents.rollout import EnvProcessPool

        with EnvProcessPool(
            args.env_processes,
            sandbox=args.sandbox,
            sandbox_pool_size=8,
            sandbox_kwargs=pool_sandbox_kwargs,
            cpus=env_cpus,
        ) as pool:
            collect(engine, tasks[:4], config, env_factory=pool.make)  # warm-up
            engine.reset_prefix_cache()
            cpu_before = docker_cpu_s()
            take_steps("")
            started = time.perf_counter()
            pooled = collect(engine, tasks, config, env_factory=pool.make)
            pooled_s = time.perf_counter() - started
            take_steps("loop_processes")
            cpu_after = docker_cpu_s()
        if cpu_before is not None and cpu_after is not None:
            figures["pooled_tool_cpu_s"] = round(cpu_after - cpu_before, 2)
        return pooled, pooled_s

    pooled: list = []
    if args.env_processes > 0 and args.pooled_first:
        pooled, pooled_s = pooled_loop()
    trajectories, multi_s, env_alone_s = threaded_loop()
    if args.env_processes > 0 and not args.pooled_first:
        pooled, pooled_s = pooled_loop()
    if pooled:
        pooled_summary = summarize_episodes(pooled, pooled_s)
        figures.update(
            env_processes=args.env_processes,
            pooled_first=args.pooled_first,
            pooled_multi_turn_s=round(pooled_s, 2),
            pooled_multi_turn_tok_s=round(pooled_summary["action_tokens"] / pooled_s, 1),
            pooled_mean_turns=round(pooled_summary["turns_mean"], 2),
            pooled_env_s_per_turn=round(pooled_summary["env_s_per_turn"], 3),
        )
    summary = summarize_episodes(trajectories, multi_s)
    action = summary["action_tokens"]

    async def single_turn(episodes) -> float:
        requests = [
            engine.generate(
                t.prompt_ids, SamplingParams(1.0, 1.0, max(1, t.num_action_tokens), ignore_eos=True)
            )
            for t in episodes
        ]
        begun = time.perf_counter()
        generations = await asyncio.gather(*requests)
        assert sum(len(g.token_ids) for g in generations) == sum(
            max(1, t.num_action_tokens) for t in episodes
        )
        return time.perf_counter() - begun

    engine.reset_prefix_cache()
    take_steps("")
    single_s = asyncio.run(single_turn(trajectories))
    take_steps("plain")
    engine.reset_prefix_cache()
    structure_s = structure_only(engine, trajectories)
    take_steps("structure")

    async def prefill() -> float:  # every episode's whole context computed once, one token sampled
        begun = time.perf_counter()
        await asyncio.gather(
            *(
                engine.generate(t.prompt_ids + t.response_ids, SamplingParams(1.0, 1.0, 1))
                for t in trajectories
            )
        )
        return time.perf_counter() - begun

    engine.reset_prefix_cache()
    prefill_tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
    # against decode: single_turn_tok_s
    figures["prefill_tok_s"] = round(prefill_tokens / asyncio.run(prefill()), 1)
    figures["prompt_tokens"] = sum(len(t.prompt_ids) for t in trajectories)
    if pooled:  # against plain generation of its own episodes' tokens (each loop samples its own)
        engine.reset_prefix_cache()
        take_steps("")
        pooled_single_s = asyncio.run(single_turn(pooled))
        take_steps("plain_for_processes")
        figures.update(
            pooled_single_turn_tok_s=round(pooled_summary["action_tokens"] / pooled_single_s, 1),
            pooled_loop_over_single_ratio=round(pooled_single_s / pooled_s, 3),
        )
    figures.update(
        structure_only_s=round(structure_s, 2),
        structure_over_single_ratio=round(single_s / structure_s, 3),
        multi_turn_s=round(multi_s, 2),
        multi_turn_tok_s=round(action / multi_s, 1),
        env_steps_alone_s=round(env_alone_s, 2),
        single_turn_s=round(single_s, 2),
        single_turn_tok_s=round(action / single_s, 1),
        loop_over_single_ratio=round(single_s / multi_s, 3),
        wasted_tokens=summary["wasted_tokens"],
        action_tokens=action,
        observation_tokens=summary["observation_tokens"],
        mean_turns=round(summary["turns_mean"], 2),
        tool_calls_per_episode=round(summary["tool_calls_per_response"], 2),
        stop_reasons=summary["stop_reasons"],
        accuracy=summary["accuracy"],
        generate_s_per_turn=round(summary["generate_s_per_turn"], 3),
        env_s_per_turn=round(summary["env_s_per_turn"], 3),
        tool_timeouts=sum(turn.tool_statuses.count("timeout") for t in trajectories for turn in t.turns),
    )
    if pooled:
        figures["pooled_tool_timeouts"] = sum(
            turn.tool_statuses.count("timeout") for t in pooled for turn in t.turns
        )
    if engine_steps:
        figures["engine_steps"] = engine_steps
    engine.close()

    if args.syncs < 1:
        print(json.dumps(figures, indent=2))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(figures, handle, indent=2)
        return
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
