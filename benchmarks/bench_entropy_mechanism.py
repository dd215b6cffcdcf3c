"""STARE's mechanism on a real model, one step at a time (train/entropy_probe.py).

For each run folder given, the first RL step's trained batch (sampled by that run's SFT model, saved in
rollouts/step-000000.jsonl.gz with its advantages) is scored by the SFT model at the rollout temperature; a
later state is named as RUN:STEP:MODEL (e.g. runs/long-s0:63:final_model, the last step's batch under the model
that step trained, one step off-policy). Then,
for GRPO-ds (all weights 1), STARE O1 (W on L+) and STARE C2 (W on L+, M on L-), and a random-token control
with STARE's P and W: the entropy change of one plain gradient step on the policy-gradient surrogate, predicted
to first order in parameter space, measured by re-scoring the batch, and the paper's logit-space formula; per
quadrant (sign of the advantage, sign of Phi) and in total, at several learning rates. Last, the first-order
drift against W (no gate) and the W at which it changes sign, per batch.

    .venv/bin/python benchmarks/bench_entropy_mechanism.py runs/fp32-s0 runs/fp32-s1 --json runs/mechanism.json
    .venv/bin/python benchmarks/bench_entropy_mechanism.py runs/long-s0 runs/long-s0:63:final_model \
        runs/long-s0/grpo-ds:63:final_model --lrs 1e-5 --json runs/mechanism-long.json
"""

from __future__ import annotations

import argparse
import time


def r_squared(xs: list[float], ys: list[float]) -> float | None:
    """R^2 of y = x (the prediction itself, no fitted slope)."""
    if len(ys) < 2:
        return None
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    residual = sum((y - x) ** 2 for x, y in zip(xs, ys, strict=True))
    return 1 - residual / total if total else None


def batch_spec(spec: str) -> tuple[str, int, str]:
    """RUN[:STEP[:MODEL]] -> (run folder, step whose trained batch is probed, model folder inside the run)."""
    run, _, rest = spec.partition(":")
    step, _, model = rest.partition(":")
    if step and not step.isdigit():
        raise SystemExit(f"{spec!r}: the step after the run folder must be a number (RUN[:STEP[:MODEL]])")
    return run, int(step or 0), model or "sft_model"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs",
        nargs="+",
        help="RUN[:STEP[:MODEL]]: a run folder, the step whose trained batch is probed (0) and the model "
        "folder inside the run that scores it (sft_model)",
    )
    parser.add_argument("--lrs", default="1e-6,3e-6,1e-5", help="plain gradient-step sizes")
    parser.add_argument("--w", type=float, default=1.1)
    parser.add_argument("--m", type=float, default=0.9)
    parser.add_argument("--top-ratio", type=float, default=0.1)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument(
        "--sweep", default="1.0,1.05,1.1,1.25,1.5,2,3", help="W values for the first-order drift"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--no-control", action="store_true", help="leave out the random-token control (half the time)"
    )
    args = parser.parse_args()

    import torch

    from stare_agents.jsonl import dumps
    from stare_agents.rollout_log import read_rollouts
    from stare_agents.train.entropy_probe import QUADRANTS, EntropyProbe, PartWeights
    from stare_agents.train.policy import PolicyModel, load_causal_lm
    from stare_agents.trajectory import collate

    lrs = [float(x) for x in args.lrs.split(",")]
    out: dict = {"lrs": lrs, "w": args.w, "m": args.m, "top_ratio": args.top_ratio, "batches": {}}
    pairs: dict[
        str, list[tuple[float, float]]
    ] = {}  # weighting -> (predicted, measured) over batches and lrs
    logit_pairs: dict[str, list[tuple[float, float]]] = {}
    for spec in args.runs:
        run, step, model = batch_spec(spec)
        started = time.perf_counter()
        saved = [r for r in read_rollouts(run, step) if r.status == "trained" and r.advantage is not None]
        if not saved:
            print(f"{spec}: step {step} trained no trajectory (no group had reward variance); skipped")
            continue
        trajectories = [r.trajectory for r in saved]
        advantages = torch.tensor([float(r.advantage) for r in saved])
        batch = collate(trajectories, pad_token_id=0)
        policy = PolicyModel(load_causal_lm(f"{run}/{model}"), temperature=args.temperature)
        probe = EntropyProbe(policy, batch, advantages, top_ratio=args.top_ratio)
        figures: dict = {
            "step": step,
            "model": model,
            "trajectories": len(trajectories),
            "action_tokens": int(probe.count),
            "entropy": probe.entropy_before,
            "quadrants": probe.quadrant_counts(),
            "lplus": int(probe.lplus.sum()),
            "lminus": int(probe.lminus.sum()),
            "lplus_negative_phi": float(
                (probe.lplus & (probe.phi < 0)).sum() / max(1, int(probe.lplus.sum()))
            ),
            "weightings": {},
        }
        lr_mid = lrs[len(lrs) // 2]

        def measure(
            name: str, p: EntropyProbe, weights: PartWeights, run=spec, figures=figures, lr_mid=lr_mid
        ) -> None:
            row: dict = {"logit_space": p.logit_space(weights), "steps": []}
            for lr in lrs:
                predicted, measured = p.predicted(weights, lr), p.measured(weights, lr)
                row["steps"].append({"lr": lr, "predicted": predicted, "measured": measured})
                pairs.setdefault(name, []).append((predicted, measured))
                logit_pairs.setdefault(name, []).append((p.logit_space(weights), measured / lr))
            row["quadrants"] = {
                q: {
                    "logit_space": p.logit_space(weights, [f"{q}/selected", f"{q}/rest"]),
                    "predicted": p.predicted(weights, lr_mid, [f"{q}/selected", f"{q}/rest"]),
                    "measured": p.measured(weights, lr_mid, [f"{q}/selected", f"{q}/rest"]),
                }
                for q in QUADRANTS
            }
            row["quadrants_lr"] = lr_mid
            figures["weightings"][name] = row
            print(run, name, dumps(row), flush=True)

        measure("grpo-ds", probe, PartWeights())
        measure("stare-o1", probe, PartWeights.stare("O1", args.w, args.m))
        measure("stare-c2", probe, PartWeights.stare("C2", args.w, args.m))
        figures["w_sweep"] = {
            "lr": lr_mid,
            "predicted": {
                w: probe.predicted(PartWeights.stare("O1", float(w)), lr_mid) for w in args.sweep.split(",")
            },
            "measured": {
                w: probe.measured(PartWeights.stare("O1", float(w)), lr_mid)
                for w in args.sweep.split(",")[::3]
            },
            "critical_w_o1": probe.critical_w(),
            "critical_w_c2": probe.critical_w(m=args.m, variant="C2"),
            # C2 at the bench's W: the M below which the step raises the entropy (when L- pushes it down)
            "critical_m_c2": probe.critical_m(w=args.w),
        }
        if not args.no_control:
            # the random-token control: as many tokens as L+ / L-, drawn uniformly from T+ / T-
            gen = torch.Generator().manual_seed(0)
            control = []
            for chosen, sign in ((probe.lplus, 1), (probe.lminus, -1)):
                candidates = (probe.mask & (probe.advantages * sign > 0)).nonzero()
                pick = candidates[torch.randperm(len(candidates), generator=gen)[: int(chosen.sum())]]
                mask = torch.zeros_like(chosen)
                mask[pick[:, 0], pick[:, 1]] = True
                control.append(mask)
            del probe  # its gradients: ~9 copies of the model
            random_probe = EntropyProbe(policy, batch, advantages, selection=(control[0], control[1]))
            measure("random-o1", random_probe, PartWeights.stare("O1", args.w, args.m))
            figures["w_sweep"]["critical_w_random"] = random_probe.critical_w()
            del random_probe
        else:
            del probe
        figures["seconds"] = round(time.perf_counter() - started, 1)
        print(spec, "w sweep", dumps(figures["w_sweep"]), flush=True)
        out["batches"][spec] = figures
        del policy

    out["agreement"] = {
        name: {
            "r2_first_order": r_squared([p for p, _ in values], [m for _, m in values]),
            "sign_agreement_logit_space": sum((lp > 0) == (m > 0) for lp, m in logit_pairs[name])
            / len(logit_pairs[name]),
        }
        for name, values in pairs.items()
    }
    text = dumps(out, indent=2)  # a critical W that is infinite (L+ moves nothing) is left out
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
