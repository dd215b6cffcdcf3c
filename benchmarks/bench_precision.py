"""Where the rollout/learner mismatch of bf16 comes from, on the default job's model and episodes.

For each engine precision (vLLM float32, bfloat16, bfloat16 with an fp32 LM head; float16 on request) the same training tasks of
ArithmeticTIR are sampled, as the default job samples them (temperature 0.7, the Docker sandbox, 128 tokens a
turn, 320 an episode). Each batch is then scored by the learner in each precision (fp32, bf16-emulated: bf16
autocast's rounding computed in fp32, see train/bf16_emulation.py; optionally real bf16 autocast, which is
~100x slower on CPUs without bf16 units), with and without the fp32 LM head, and the mismatch is measured per
pair: mean |log r|, the k3 KL estimate, the share of tokens with r outside [0.9, 1.1], the largest |log r|,
and what truncated (cap 2) and masked ([0.5, 2]) importance sampling would touch, per token and per sequence.
Last, on the bf16 engine's batch, the GRPO gradient of each learner precision against the fp32 one (cosine
and relative error), so the learner's own rounding is measured apart from the engine's.

    .venv/bin/python benchmarks/bench_precision.py --model runs/smollm2-arith/sft_model --prompts 16 --samples 4
"""

from __future__ import annotations

import argparse
import gc
import time

from stare_agents.jsonl import dumps


def mismatch_row(learner_lp, rollout_lp, mask) -> dict:
    import torch

    from stare_agents.algo.importance import ImportanceConfig, importance_weights, mismatch_sums

    sums = mismatch_sums(learner_lp, rollout_lp, mask)
    n = float((mask > 0).sum())
    row = {
        "abs_log_ratio": sums["abs_diff"] / n,
        "kl_k3": sums["kl"] / n,
        "ratio_outside_0.9_1.1": sums["outside"] / n,
        "max_abs_log_ratio": sums["max_abs"],
    }
    for level in ("token", "sequence"):
        _, capped, _ = importance_weights(
            learner_lp, rollout_lp, mask, ImportanceConfig(cap=2.0, level=level)
        )
        _, _, masked = importance_weights(
            learner_lp, rollout_lp, mask, ImportanceConfig(mask=(0.5, 2.0), level=level)
        )
        row[f"tis2_capped_{level}"] = float(capped.sum()) / n
        row[f"mis_masked_{level}"] = float(masked.sum()) / n
    diff = (learner_lp - rollout_lp)[mask > 0]
    row["mean_log_ratio"] = float(diff.mean())  # the sign says which side is more confident
    row["p99_abs_log_ratio"] = float(torch.quantile(diff.abs().double(), 0.99))
    return row


def learner_gradients(model, batch, advantages, learners: list[str], temperature: float) -> dict:
    """The GRPO surrogate's gradient (ratio 1) on `batch` for each learner precision, flattened."""
    import torch

    from stare_agents.train.policy import PolicyModel, split_step

    grads = {}
    total = float((batch.action_mask > 0).sum())
    for learner in learners:
        precision, _, head = learner.partition("+")
        policy = PolicyModel(
            model, precision=precision, temperature=temperature, fp32_head=head == "fp32head"
        )
        model.zero_grad(set_to_none=True)
        for mb in (
            mb for u in split_step(batch, advantages, mini_batches=1, micro_batch_tokens=4096) for mb in u
        ):
            stats = policy(mb.batch)  # micro-batches: the whole batch's activations would not fit in memory
            mask = mb.batch.action_mask > 0
            adv = mb.advantages[:, None].expand_as(stats.logprob)
            (-(stats.logprob * adv)[mask].sum() / total).backward()
        grads[learner] = torch.cat(
            [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        ).clone()
    return grads


def compare_gradients(grads: dict) -> dict:
    import torch

    reference = grads["fp32"].double()
    return {
        learner: {
            "cosine": float(torch.nn.functional.cosine_similarity(g.double(), reference, dim=0)),
            "relative_error": float((g.double() - reference).norm() / reference.norm()),
        }
        for learner, g in grads.items()
    }


def gradients(args) -> None:
    """--gradient-run: the learners' gradients on a run's first trained batch."""
    import torch

    from stare_agents.rollout_log import read_rollouts
    from stare_agents.train.policy import load_causal_lm
    from stare_agents.trajectory import collate

    saved = [
        r for r in read_rollouts(args.gradient_run, 0) if r.status == "trained" and r.advantage is not None
    ]
    batch = collate([r.trajectory for r in saved], pad_token_id=0)
    advantages = torch.tensor([float(r.advantage) for r in saved])
    learners = args.learners.split(",")
    if "fp32" not in learners:
        learners = ["fp32", *learners]
    model = load_causal_lm(f"{args.gradient_run}/sft_model")
    figures = {
        "run": args.gradient_run,
        "trajectories": len(saved),
        "action_tokens": int((batch.action_mask > 0).sum()),
        "gradient_vs_fp32": compare_gradients(
            learner_gradients(model, batch, advantages, learners, args.temperature)
        ),
    }
    text = dumps(figures, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="a model folder (the default job's sft_model)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument(
        "--seed", type=int, default=0, help="first training task seed; also the engine's seed"
    )
    parser.add_argument(
        "--engines",
        default="float32,bfloat16,bfloat16+fp32head",
        help="engine precisions, comma-separated: float32, bfloat16, float16, each optionally +fp32head",
    )
    parser.add_argument(
        "--learners",
        default="fp32,bf16-emulated,bf16-emulated+fp32head",
        help="learner precisions: fp32, bf16-emulated, bf16 or fp16 (real autocast: very slow without bf16/fp16 "
        "units), each optionally +fp32head",
    )
    parser.add_argument(
        "--sync-to",
        help="a second model folder (e.g. the run's final_model): each engine starts from --model, is sent these "
        "weights as the trainer sends them (float32, tied head once), then samples; the learners score with "
        "them, and an fp32 learner also with --model's, which shows whether the engine kept stale weights",
    )
    parser.add_argument(
        "--gradient-run",
        help="a run folder: compare the learners' GRPO gradients on its first trained batch (rollouts of step 0, "
        "its advantages, its sft_model) instead of sampling; no engine is started",
    )
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    import torch

    from stare_agents.algo import AlgorithmConfig, compute_advantages
    from stare_agents.envs.registration import split_kwargs
    from stare_agents.rollout import RolloutConfig, RolloutTask, collect, make_engine
    from stare_agents.sandbox import make_sandbox
    from stare_agents.train.policy import PolicyModel, load_causal_lm
    from stare_agents.trajectory import collate

    env_id = "stare_agents/ArithmeticTIR-v0"
    env_kwargs = split_kwargs(env_id, {"stateless": True}, "train")
    tasks = [
        RolloutTask(env_id, seed=args.seed + i, group_id=str(i), sample_index=j, env_kwargs=env_kwargs)
        for i in range(args.prompts)
        for j in range(args.samples)
    ]
    config = RolloutConfig(
        temperature=args.temperature,
        max_tokens_per_turn=128,
        max_total_tokens=320,
        rendering="chat",
        max_concurrency=64,
        seed=args.seed,
    )
    figures: dict = {
        "model": args.model,
        "episodes": len(tasks),
        "temperature": args.temperature,
        "engines": {},
    }
    batches = {}
    with make_sandbox("docker", pool_size=8) as sandbox:
        for name in args.engines.split(","):
            dtype, _, head = name.partition("+")
            engine = make_engine(
                "vllm",
                args.model,
                dtype=dtype,
                seed=args.seed,
                max_model_len=1024,
                kv_cache_gib=2,
                fp32_head=head == "fp32head",
            )
            if args.sync_to:  # as RolloutWorkerGroup.update_weights sends them (float32 for "fast"/"float32")
                from stare_agents.rollout.workers import _untied

                synced = load_causal_lm(args.sync_to).state_dict()
                engine.update_weights({k: v.detach().float() for k, v in _untied(synced).items()})
            started = time.perf_counter()
            trajectories = collect(engine, tasks, config, sandbox=sandbox)
            seconds = time.perf_counter() - started
            engine.close()
            gc.collect()
            kept = [t for t in trajectories if t.prompt_ids and t.num_action_tokens]
            action_tokens = sum(t.num_action_tokens for t in kept)
            figures["engines"][name] = {
                "seconds": round(seconds, 1),
                "action_tokens": action_tokens,
                "tokens_per_s": round(action_tokens / seconds, 1),
                "reward": sum(t.reward for t in kept) / max(1, len(kept)),
                "failed": len(trajectories) - len(kept),
            }
            tokenizer_pad = engine.tokenizer.pad_token_id
            pad = tokenizer_pad if tokenizer_pad is not None else engine.eos_ids[0]
            batches[name] = (collate(kept, pad), [t.group_id for t in kept])
            print(name, figures["engines"][name], flush=True)
            del engine

    model = load_causal_lm(args.sync_to or args.model)
    figures["pairs"] = {}
    if args.sync_to:  # the weights the engines started with: a stale engine would match these instead
        stale = PolicyModel(load_causal_lm(args.model), precision="fp32", temperature=args.temperature)
        for name, (batch, _) in batches.items():
            with torch.no_grad():
                stats = stale(batch)
            row = mismatch_row(stats.logprob, batch.rollout_logprobs, batch.action_mask)
            figures["pairs"][f"{name} | fp32 with the weights before the sync"] = row
            print(
                f"engine {name:20s} learner fp32, pre-sync weights", {k: round(v, 5) for k, v in row.items()}
            )
        del stale
    for learner in args.learners.split(","):
        precision, _, head = learner.partition("+")
        policy = PolicyModel(
            model, precision=precision, temperature=args.temperature, fp32_head=head == "fp32head"
        )
        policy.eval()
        for name, (batch, _) in batches.items():
            started = time.perf_counter()
            with torch.no_grad():
                stats = policy(batch)
            row = mismatch_row(stats.logprob, batch.rollout_logprobs, batch.action_mask)
            row["score_s"] = round(time.perf_counter() - started, 1)
            figures["pairs"][f"{name} | {learner}"] = row
            print(
                f"engine {name:20s} learner {learner:26s}",
                {k: round(v, 5) for k, v in row.items()},
                flush=True,
            )

    # the learner's own rounding: the GRPO gradient on one batch, each precision against fp32
    name = next((n for n in batches if n.startswith("bfloat16")), next(iter(batches)))
    batch, groups = batches[name]
    advantages = compute_advantages(batch.rewards, groups, AlgorithmConfig.preset("grpo")).advantages
    learners = args.learners.split(",")
    if "fp32" not in learners:
        learners = ["fp32", *learners]
    if float(advantages.abs().sum()) == 0:
        print("gradient: no group of the", name, "batch has reward variance (all advantages 0): not compared")
    else:
        grads = learner_gradients(model, batch, advantages, learners, args.temperature)
        figures["gradient_vs_fp32"] = compare_gradients(grads)
        figures["gradient_batch"] = name
        print("gradient vs fp32 on the", name, "batch:", figures["gradient_vs_fp32"], flush=True)

    text = dumps(figures, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
