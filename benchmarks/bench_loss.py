"""STARE weights + policy loss vs the plain GRPO loss on the same batch, side by side in one run.

Each variant runs forward + backward of the loss on [batch, response_len] log-probs; the STARE variants
also compute their token weights from the surprisal. Timings interleave the variants round by round so
that machine noise hits all of them alike.

    python benchmarks/bench_loss.py                     # 64 x 2048, 70% action tokens (the issue's batch)
    python benchmarks/bench_loss.py --device cuda
    python benchmarks/bench_loss.py --batch 8 --vocab 8192   # include log-probs from logits (fwd + bwd)

With --vocab V each variant also computes the token log-probs from [batch, length, V] logits inside the
timed region, as a learner does; without it only the loss itself is timed (the harshest comparison).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from stare_agents.algo import PolicyLossConfig, grpo_advantages, policy_loss, stare_weights, token_logprobs


def make_batch(batch: int, length: int, action_fraction: float, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    old = (-(torch.rand(batch, length, generator=gen) ** 3) * 6).to(device)  # most tokens confident
    new = (old + 0.05 * torch.randn(batch, length, generator=gen).to(device)).requires_grad_(True)
    rewards = torch.randint(0, 2, (batch,), generator=gen).float()
    advantages = grpo_advantages(rewards, group_size=8).to(device)
    mask = (torch.rand(batch, length, generator=gen) < action_fraction).float().to(device)
    return new, old, advantages, mask


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--action-fraction", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--vocab", type=int, default=0, help="also compute log-probs from logits of this vocab"
    )
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    new, old, advantages, mask = make_batch(args.batch, args.length, args.action_fraction, args.device)
    config = PolicyLossConfig()
    if args.vocab:
        gen = torch.Generator().manual_seed(1)
        logits = torch.randn(args.batch, args.length, args.vocab, generator=gen).to(args.device)
        logits.requires_grad_(True)
        tokens = torch.randint(0, args.vocab, (args.batch, args.length), generator=gen).to(args.device)

    def current_logprobs():
        return token_logprobs(logits, tokens) if args.vocab else new

    def grpo():
        loss, _ = policy_loss(current_logprobs(), old, advantages, mask, config)
        loss.backward()

    def stare(variant):
        def run():
            weights = stare_weights(-old, advantages, mask, variant=variant)
            loss, _ = policy_loss(current_logprobs(), old, advantages, mask, config, token_weights=weights)
            loss.backward()

        return run

    variants = {"grpo": grpo, "stare-O1": stare("O1"), "stare-C2": stare("C2")}
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(10):  # warm-up
        for fn in variants.values():
            fn()
    for _ in range(args.rounds):
        for name, fn in variants.items():
            new.grad = None
            if args.vocab:
                logits.grad = None
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)

    print(
        f"batch {args.batch} x {args.length} ({int(mask.sum())} action tokens, {args.action_fraction:.0%}), "
        f"{'log-probs from logits, vocab ' + str(args.vocab) if args.vocab else 'loss only'}, "
        f"device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, {args.rounds} rounds"
    )
    base = statistics.median(times["grpo"])
    print(f"{'variant':<10} {'median ms':>10} {'p90 ms':>8} {'ratio vs grpo':>14}")
    for name, samples in times.items():
        median = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        print(f"{name:<10} {median * 1e3:>10.2f} {p90 * 1e3:>8.2f} {median / base:>13.3f}x")


if __name__ == "__main__":
    main()
