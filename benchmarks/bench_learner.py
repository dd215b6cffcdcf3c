"""Learner throughput (fp32 vs bf16 autocast) and the STARE / GRPO-ds learner step time ratio.

A learner step here is what `Learner.step` does: the pre-update pass (no grad) over the batch, forward +
backward with the chunked action-token head, the loss, AdamW. Tokens/s counts every non-padding token of
the batch per second of step. For reference the same batch also goes through a plain Hugging Face step:
forward, full-vocabulary log_softmax of the response logits (not chunked), backward, AdamW.

STARE vs GRPO-ds: two learners from the same weights on the same batch, STARE with its gate forced on
(target entropy above the model's, so the weights are computed and applied every step), their steps
interleaved round by round (the order alternating) so that machine noise hits both alike; the ratio is
of the median step times.

    python benchmarks/bench_learner.py                          # SmolLM2-135M (prepared offline), 8 x 256
    python benchmarks/bench_learner.py --model tiny --rounds 3  # the tiny random Llama
    python benchmarks/bench_learner.py --model /path/to/hf_dir --batch 8 --prompt 64 --response 192
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch

from stare_agents.algo import AlgorithmConfig
from stare_agents.train.learner import Learner, LearnerConfig
from stare_agents.train.policy import OptimizerConfig, load_causal_lm
from stare_agents.trajectory import Trajectory, collate


def make_batch(vocab: int, batch: int, prompt: int, response: int, seed: int = 0):
    """`batch` rollouts of `prompt` + `response` tokens; each response has a 30% observation span."""
    gen = torch.Generator().manual_seed(seed)
    trajectories = []
    obs = int(0.3 * response)
    for i in range(batch):
        mask = [1] * response
        start = (response - obs) // 2
        mask[start : start + obs] = [0] * obs
        trajectories.append(
            Trajectory(
                prompt_ids=torch.randint(3, vocab, (prompt,), generator=gen).tolist(),
                response_ids=torch.randint(3, vocab, (response,), generator=gen).tolist(),
                action_mask=mask,
                rollout_logprobs=[-1.0 * bit for bit in mask],
                reward=float(i % 2),
                group_id=f"g{i // 4}",
            )
        )
    batch_tensors = collate(trajectories, pad_token_id=0)
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(batch)])
    return batch_tensors, advantages


def learner_for(model_dir, algorithm: AlgorithmConfig, precision: str, tokens: int) -> Learner:
    config = LearnerConfig(optimizer=OptimizerConfig(lr=1e-6), precision=precision, micro_batch_tokens=tokens)
    return Learner(load_causal_lm(model_dir), algorithm, config)


def hf_reference_step(model, optimizer, batch, precision: str) -> None:
    """Plain HF: forward, full-vocabulary log_softmax (fp32) of the response logits, backward, AdamW."""
    context = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if precision == "bf16"
        else torch.autocast("cpu", enabled=False)
    )
    with context:
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits
    p, r = batch.prompt_length, batch.response_length
    logp = torch.log_softmax(logits[:, p - 1 : p - 1 + r].float(), dim=-1)
    picked = logp.gather(-1, batch.response_ids[..., None]).squeeze(-1)
    loss = -(picked * batch.action_mask).sum() / batch.action_mask.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(fn, rounds: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", help="a prepare_model name or a local HF dir")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=3, help="timed steps per throughput row")
    parser.add_argument("--ratio-rounds", type=int, default=5, help="interleaved STARE/GRPO-ds rounds")
    parser.add_argument("--ratio-precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument(
        "--precisions",
        default="fp32,bf16",
        help="throughput rows, comma-separated (fp32 only on a CPU without bf16)",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--skip-reference", action="store_true", help="skip the plain HF reference rows")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from stare_agents.models import prepare_model

    model_dir = prepare_model(args.model)
    vocab = load_causal_lm(model_dir).config.vocab_size
    batch, advantages = make_batch(vocab, args.batch, args.prompt, args.response)
    tokens = float(batch.attention_mask.sum())
    budget = args.batch * (args.prompt + args.response)  # one micro-batch
    results = {"model": str(model_dir), "tokens_per_step": tokens, "threads": args.threads, "rows": []}
    print(
        f"model {model_dir} (vocab {vocab}), {args.batch} x ({args.prompt} + {args.response}) tokens, "
        f"{args.threads} threads, torch {torch.__version__}"
    )

    grpo_ds = AlgorithmConfig.preset("grpo-ds")
    for precision in args.precisions.split(","):
        learner = learner_for(model_dir, grpo_ds, precision, budget)
        pre_shares = []

        def step(learner=learner, pre_shares=pre_shares):
            m = learner.step(batch, advantages)
            pre_shares.append(m["learner/pre_update_s"] / m["learner/step_s"])

        times = timed(step, args.rounds)
        row = {
            "what": f"learner step, {precision}",
            "median_s": statistics.median(times),
            "tokens_per_s": tokens / statistics.median(times),
            "pre_update_share": statistics.median(pre_shares[1:]),
        }
        results["rows"].append(row)
        print(
            f"{row['what']:32s} {row['median_s']:7.2f} s  {row['tokens_per_s']:7.1f} tok/s  "
            f"(pre-update pass {100 * row['pre_update_share']:.0f}% of the step)"
        )
        del learner
        gc.collect()
        if args.skip_reference:
            continue
        model = load_causal_lm(model_dir)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        times = timed(
            lambda model=model, optimizer=optimizer, precision=precision: hf_reference_step(
                model, optimizer, batch, precision
            ),
            args.rounds,
        )
        row = {
            "what": f"plain HF fwd+bwd+AdamW, {precision}",
            "median_s": statistics.median(times),
            "tokens_per_s": tokens / statistics.median(times),
        }
        results["rows"].append(row)
        print(f"{row['what']:32s} {row['median_s']:7.2f} s  {row['tokens_per_s']:7.1f} tok/s")
        del model, optimizer
        gc.collect()

    stare_algo = AlgorithmConfig.preset("stare")
    stare_algo.stare.target_entropy = 1e9  # gate always on: the weights are computed and applied
    learners = {
        "grpo-ds": learner_for(model_dir, grpo_ds, args.ratio_precision, budget),
        "stare": learner_for(model_dir, stare_algo, args.ratio_precision, budget),
    }
    times = {name: [] for name in learners}
    for learner in learners.values():
        learner.step(batch, advantages)  # warm-up
    for round_ in range(args.ratio_rounds):
        order = ["grpo-ds", "stare"] if round_ % 2 == 0 else ["stare", "grpo-ds"]
        for name in order:
            m = learners[name].step(batch, advantages)
            times[name].append(m["learner/step_s"])
            if name == "stare":
                assert m["stare/gate_on"] == 1.0
    ratio = statistics.median(times["stare"]) / statistics.median(times["grpo-ds"])
    results["ratio"] = {
        "precision": args.ratio_precision,
        "rounds": args.ratio_rounds,
        "grpo_ds_median_s": statistics.median(times["grpo-ds"]),
        "stare_median_s": statistics.median(times["stare"]),
        "stare_over_grpo_ds": ratio,
        "grpo_ds_s": times["grpo-ds"],
        "stare_s": times["stare"],
    }
    print(
        f"STARE (gate on) / GRPO-ds learner step, {args.ratio_precision}, {args.ratio_rounds} interleaved rounds: "
        f"{statistics.median(times['stare']):.2f} s / {statistics.median(times['grpo-ds']):.2f} s = {ratio:.3f}"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
