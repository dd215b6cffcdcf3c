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

That plain step is not the step training takes (issue 47). With `--replay RUN` the bench probes the step the
optimiser takes: it loads RUN's SFT model (`--model`; `--make-sft` makes it first from RUN's config.yaml, the
run's own SFT stage, when the folder was not kept) into the learner RUN's config.yaml describes (its algorithm,
gate, AdamW lr, clip, micro-batches; in `--precision`, fp32 by default), replays RUN's saved steps in order (each
step's trained batch with its saved advantages, the gate reading what it read: the run's own training, again),
and before replaying each step of `--probe-steps` probes that step's batch from the warmed-up state:

- "run": the learner's own step on the batch (the step training takes, its gate and W/M as they came out);
- "grpo-ds", "stare-o1-w<W>", "stare-c2-w<W>-m<M>": AdamW's step from the same state on those weightings'
  gradients (`AdamStep`, the optimiser's state put back after each);
- "momentum": AdamW's step on a zero gradient (what the earlier steps' momentum alone does);

each with the entropy change predicted to first order in the step taken (<grad H, delta>), the plain-gradient
prediction at the same learning rate (-lr <grad H, g>, what the probe above predicts), and the change measured
by re-scoring the batch. One JSON per probed step goes to `--out-dir` (written whole, after the step), named
<run>-step<NNN>.json with the command in it; a step whose JSON is there is replayed, not probed again.
`--summarize DIR` gathers a folder of them into the distribution over batches:

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/bench_entropy_mechanism.py \
        --replay benchmarks/logs/long-bf16-s0 --model runs/mech-s0/sft_model --make-sft --probe-steps 1-10 \
        --out-dir benchmarks/logs/mechanism/adam-probe
    .venv/bin/python benchmarks/bench_entropy_mechanism.py --summarize benchmarks/logs/mechanism/adam-probe \
        --json benchmarks/logs/mechanism/adam-probe-summary.json

A probed batch without positive- or negative-advantage tokens, a temperature <= 0, a W below 1 or an M outside
(0, 1] is refused before any work, naming it, with a non-zero exit and no JSON.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple


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


class StepBatch(NamedTuple):
    """A saved RL step: its trained trajectories with their advantages, and every trajectory it sampled."""

    step: int
    kept: list[Any]
    advantages: Any  # Tensor [B] (or [B, R])
    sampled: list[Any]

    def problem(self) -> str | None:
        """Why this batch cannot be probed (no positive- or no negative-advantage token), or None."""
        values = [
            v
            for a, t in zip(self.advantages.tolist(), self.kept, strict=True)
            if t.num_action_tokens
            for v in (a if isinstance(a, list) else [a])
        ]
        signs = [(v > 0, v < 0) for v in values]
        if not any(pos for pos, _ in signs):
            return "no positive-advantage token"
        if not any(neg for _, neg in signs):
            return "no negative-advantage token"
        return None


def read_step(run: str | Path, step: int) -> StepBatch:
    """`run`'s saved step `step` (its rollouts/); a step that trained nothing has no kept trajectory."""
    import torch

    from stare_agents.rollout_log import read_rollouts

    saved = read_rollouts(run, step)
    kept = [r for r in saved if r.status == "trained" and r.advantage is not None]
    if any(isinstance(r.advantage, list) for r in kept):
        advantages = torch.tensor([r.advantage for r in kept], dtype=torch.float32)
    else:
        advantages = torch.tensor([float(r.advantage) for r in kept])
    return StepBatch(step, [r.trajectory for r in kept], advantages, [r.trajectory for r in saved])


def setting_problems(*, temperature: float | None = None, w: float, m: float) -> list[str]:
    """The probe's settings out of their ranges, each naming the value and what is allowed."""
    problems = []
    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        problems.append(f"--temperature {temperature}: the sampling temperature must be finite and > 0")
    if not (math.isfinite(w) and w >= 1):
        problems.append(f"--w {w}: STARE's W amplifies L+, so W must be finite and >= 1")
    if not (math.isfinite(m) and 0 < m <= 1):
        problems.append(f"--m {m}: STARE-C2's M attenuates L-, so M must be in (0, 1]")
    return problems


def parse_steps(text: str) -> list[int]:
    """ "1-10" or "0,3,7" (or both: "0,2-4") -> sorted steps."""
    steps: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"--probe-steps {text!r}: give steps as 1-10 or 0,3,7")
        steps.update(range(int(low), int(high or low) + 1))
    return sorted(steps)


def refuse(problems: list[str]) -> None:
    """Exit non-zero naming every problem (before any work, so that no JSON is written)."""
    if problems:
        print("refused:\n  " + "\n  ".join(problems), file=sys.stderr)
        raise SystemExit(2)


def write_json(path: Path, value: Any) -> None:
    """Strict JSON, written whole (a temporary file renamed into place)."""
    from stare_agents.jsonl import dumps

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(dumps(value, indent=1) + "\n")
    os.replace(partial, path)


def make_sft(config: Any, model_dir: Path) -> None:
    """RUN's SFT stage again (its config.yaml: model, traces, seed), into `model_dir` (in a fresh folder)."""
    from stare_agents.models import prepare_model
    from stare_agents.train.trainer import Trainer

    config = replace(config, out_dir=str(model_dir.parent))
    Trainer(config).supervised_fine_tuning(prepare_model(config.model.name), model_dir)


def step_row(probe: Any, delta: Any, gradient: Any, lr: float, norm: float | None) -> dict[str, Any]:
    """One step's figures: the entropy change predicted in the step taken, the plain-gradient prediction, the
    re-scored change (when `delta` is not yet applied), and how the step lines up with the gradient."""
    import torch

    row: dict[str, Any] = {"step_norm": float(delta.norm())}
    if norm is not None:
        row["grad_norm"] = norm
    row["predicted"] = probe.predicted_step(delta)
    if gradient is not None:
        row["plain_predicted"] = -lr * probe.predicted_step(gradient)
        row["cos_step_minus_gradient"] = float(torch.nn.functional.cosine_similarity(delta, -gradient, dim=0))
    return row


def release_memory() -> None:
    """Collect, and hand freed heap pages back to the system (glibc keeps them otherwise: on a shared machine a
    process's size is what its neighbours are left with)."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def logged_step(run: Path, step: int) -> dict[str, Any]:
    """What the run's metrics.jsonl says of `step` (the last record of it), for the replay's fidelity."""
    from stare_agents.jsonl import read_lines, report_unread

    records, unread = read_lines(run / "metrics.jsonl")
    report_unread(unread, None, f"lines of {run / 'metrics.jsonl'}")
    found = [r for _, r in records if isinstance(r, dict) and r.get("kind") == "rl" and r.get("step") == step]
    keys = (
        "stare/gate_on",
        "stare/w",
        "stare/m",
        "learner/entropy",
        "learner/grad_norm",
        "learner/entropy_all",
    )
    return {k: found[-1][k] for k in keys if found and k in found[-1]}


def replay_main(args: argparse.Namespace, argv: list[str]) -> None:
    """--replay: the probe in the optimiser's geometry along RUN's own training (module docstring)."""
    import torch

    from stare_agents.algo import StareConfig
    from stare_agents.train.config import load_config
    from stare_agents.train.entropy_probe import AdamStep, EntropyProbe, PartWeights
    from stare_agents.train.learner import Learner
    from stare_agents.train.rl_loop import untrained
    from stare_agents.trajectory import collate

    run, model_dir, out_dir = Path(args.replay), Path(args.model), Path(args.out_dir)
    problems = setting_problems(w=args.w, m=args.m)
    try:
        probe_steps = parse_steps(args.probe_steps)
    except ValueError as error:
        problems.append(str(error))
        probe_steps = []
    if not (run / "config.yaml").exists():
        problems.append(f"{run}: no config.yaml (a run folder of `stare-agents train`)")
    if not model_dir.is_dir() and not args.make_sft:
        problems.append(
            f"--model {model_dir}: no such folder (add --make-sft to make it from {run}'s SFT stage)"
        )
    refuse(problems)
    steps = {s: read_step(run, s) for s in range(max(probe_steps) + 1)}
    refuse(
        [f"{run} step {s}: {steps[s].problem() or ''}" for s in probe_steps if steps[s].problem()]
        + [f"{run} step {s}: trained no trajectory" for s in probe_steps if not steps[s].kept]
    )
    config = load_config(path=run / "config.yaml", overrides=[f"out_dir={out_dir}"])
    if not model_dir.is_dir():
        started = time.perf_counter()
        make_sft(config, model_dir)
        print(f"SFT model made in {time.perf_counter() - started:.0f} s: {model_dir}", flush=True)
    algorithm = config.algorithm()
    stare = algorithm.stare or StareConfig()
    learner_config = replace(config.rl.learner, precision=args.precision, device="cpu")
    learner = Learner.from_pretrained(model_dir, algorithm, learner_config)
    reads_all = algorithm.stare is not None and algorithm.stare.gate_input != "trained"
    command = shlex.join(["benchmarks/bench_entropy_mechanism.py", *argv])
    for step, saved in steps.items():
        started = time.perf_counter()
        path = out_dir / f"{run.name}-step{step:03d}.json"
        probing = step in probe_steps and not path.exists()
        if not saved.kept:  # the run took no update at this step
            continue
        batch = collate(saved.kept, pad_token_id=0)
        record: dict[str, Any] = {}
        if probing:
            probe = EntropyProbe(
                learner.policy,
                batch,
                saved.advantages,
                top_ratio=stare.top_ratio,
                micro_batch_tokens=learner.config.micro_batch_tokens,
                scope=stare.scope,
                quadrants=False,
            )
            lr = float(learner.optimizer.param_groups[0]["lr"])
            adam = AdamStep(learner.optimizer, learner.policy, learner.config.optimizer.max_grad_norm)
            rows: dict[str, Any] = {}
            weightings = {
                "grpo-ds": PartWeights(),
                f"stare-o1-w{args.w:g}": PartWeights.stare("O1", args.w),
                f"stare-c2-w{args.w:g}-m{args.m:g}": PartWeights.stare("C2", args.w, args.m),
            }
            for name, weights in weightings.items():
                gradient = probe.direction(weights)
                delta, norm = adam.delta(gradient)
                rows[name] = {
                    **step_row(probe, delta, gradient, lr, norm),
                    "measured": probe.measured_step(delta),
                }
                del gradient, delta
            delta, _ = adam.delta(torch.zeros_like(probe.grad_entropy))
            rows["momentum"] = {
                **step_row(probe, delta, None, lr, None),
                "measured": probe.measured_step(delta),
            }
            del delta
            # the run's own step needs <grad H, .> and the parts' dot products (scalars) only: the part gradients
            # (three model-sized buffers) are let go before the learner's step allocates its own
            probe.part_grads = {}
            release_memory()
            before = torch.cat([p.detach().flatten().clone() for p in probe.params])
        others = untrained(saved.sampled, saved.kept) if reads_all else []  # scored by the learner for its gate
        metrics = learner.step(batch, saved.advantages, others=collate(others, pad_token_id=0) if others else None)
        if probing:
            delta = torch.cat([p.detach().flatten() for p in probe.params]) - before
            del before
            on = bool(learner.gate_on)
            reweighting = learner.reweighting.method  # the STARE method (w, m) or None
            weights = (
                PartWeights.stare(stare.variant, reweighting.w, reweighting.m)
                if on and reweighting
                else PartWeights()
            )
            rows["run"] = {
                **step_row(probe, delta, None, lr, float(metrics["learner/grad_norm"])),
                "plain_predicted": probe.predicted(
                    weights, lr
                ),  # -lr <grad H, g>, from the parts' dot products
                "measured": probe.rescored(),
                "gate_on": on,
                "w": reweighting.w if reweighting else 1.0,
                "m": reweighting.m if reweighting else 1.0,
            }
            del delta
            record = {
                "command": command,
                "run": str(run),
                "step": step,
                "model": str(model_dir),
                "replayed_steps": sum(1 for s, b in steps.items() if s < step and b.kept),
                "precision": args.precision,
                "optimizer": {
                    "lr": lr,
                    "betas": list(learner.config.optimizer.betas),
                    "eps": learner.config.optimizer.eps,
                    "weight_decay": learner.config.optimizer.weight_decay,
                    "max_grad_norm": learner.config.optimizer.max_grad_norm,
                },
                "batch": {
                    "trajectories": len(saved.kept),
                    "action_tokens": int(probe.count),
                    "entropy": probe.entropy_before,
                    "quadrants": probe.quadrant_counts(),
                    "lplus": int(probe.lplus.sum()),
                    "lminus": int(probe.lminus.sum()),
                    "lplus_negative_phi": float((probe.lplus & (probe.phi < 0)).sum())
                    / max(1, int(probe.lplus.sum())),
                },
                "rows": rows,
                "replay": {
                    k: float(metrics[k])
                    for k in ("stare/gate_on", "stare/w", "stare/m", "learner/entropy", "learner/grad_norm")
                },
                "logged": logged_step(run, step),
                "seconds": round(time.perf_counter() - started, 1),
            }
            del probe
            release_memory()
            write_json(path, record)
            print(
                f"{run.name} step {step}: "
                + "; ".join(
                    f"{n} predicted {r['predicted']:+.2e} measured {r['measured']:+.2e}"
                    for n, r in rows.items()
                )
                + f" ({record['seconds']:.0f} s) -> {path}",
                flush=True,
            )
        else:
            print(f"{run.name} step {step}: replayed ({time.perf_counter() - started:.0f} s)", flush=True)


def summarize_main(args: argparse.Namespace) -> None:
    """--summarize: every probe JSON of a folder, as distributions over batches per row."""
    import json

    folder = Path(args.summarize)
    probes = [json.loads(p.read_text()) for p in sorted(folder.glob("*-step*.json"))]
    refuse([] if probes else [f"--summarize {folder}: no <run>-stepNNN.json there"])
    out: dict[str, Any] = {"batches": len(probes), "runs": sorted({p["run"] for p in probes}), "rows": {}}
    for name in sorted({n for p in probes for n in p["rows"]}):
        got = [(p["run"], p["step"], p["rows"][name]) for p in probes if name in p["rows"]]
        predicted = [r["predicted"] for _, _, r in got]
        measured = [r["measured"] for _, _, r in got]
        plain = [r.get("plain_predicted") for _, _, r in got]
        ratio = sorted(m / x for x, m in zip(predicted, measured, strict=True) if x)
        summary: dict[str, Any] = {
            "batches": len(got),
            "r2_first_order_in_step_taken": r_squared(predicted, measured),
            "sign_agreement_step_taken": sum(
                (x > 0) == (m > 0) for x, m in zip(predicted, measured, strict=True)
            )
            / len(got),
            "measured_over_predicted_median": statistics.median(ratio) if ratio else None,
            "measured_over_predicted_range": [ratio[0], ratio[-1]] if ratio else None,
            "measured_mean": sum(measured) / len(measured),
            "measured_range": [min(measured), max(measured)],
        }
        if all(x is not None for x in plain):
            summary["sign_agreement_plain"] = sum(
                (x > 0) == (m > 0) for x, m in zip(plain, measured, strict=True)
            ) / len(got)
            summary["r2_plain"] = r_squared(plain, measured)
            scale = sorted(abs(m / x) for x, m in zip(plain, measured, strict=True) if x)
            summary["abs_measured_over_plain_median"] = statistics.median(scale) if scale else None
        summary["per_batch"] = [
            {
                "run": run,
                "step": step,
                "predicted": r["predicted"],
                "plain_predicted": r.get("plain_predicted"),
                "measured": r["measured"],
            }
            for run, step, r in got
        ]
        out["rows"][name] = summary
        print(
            f"{name}: {len(got)} batches; step taken: R^2 {summary['r2_first_order_in_step_taken']}, sign "
            f"{summary['sign_agreement_step_taken']:.2f}, measured/predicted median "
            f"{summary['measured_over_predicted_median']}; plain: sign {summary.get('sign_agreement_plain')}, "
            f"|measured/plain| median {summary.get('abs_measured_over_plain_median')}"
        )
    if args.json:
        write_json(Path(args.json), out)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs",
        nargs="*",
        help="RUN[:STEP[:MODEL]]: a run folder, the step whose trained batch is probed (0) and the model "
        "folder inside the run that scores it (sft_model)",
    )
    parser.add_argument("--replay", help="a run folder whose saved steps are replayed and probed (see above)")
    parser.add_argument("--model", help="--replay: the run's SFT model folder")
    parser.add_argument(
        "--make-sft", action="store_true", help="--replay: make --model from the run's SFT stage"
    )
    parser.add_argument("--probe-steps", default="1-10", help="--replay: the steps probed (1-10, or 0,3,7)")
    parser.add_argument(
        "--out-dir", default="benchmarks/logs/mechanism/adam-probe", help="--replay: probe JSONs"
    )
    parser.add_argument("--precision", default="fp32", help="--replay: the learner's precision")
    parser.add_argument("--summarize", help="a folder of --replay probe JSONs: their distribution")
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
    args = parser.parse_args(argv)
    if args.summarize:
        return summarize_main(args)
    if args.replay:
        if not args.model:
            refuse(["--replay needs --model (the run's SFT model folder; --make-sft makes it)"])
        return replay_main(args, argv)
    if not args.runs:
        refuse(["give RUN[:STEP[:MODEL]] folders to probe, or --replay RUN, or --summarize FOLDER"])
    problems = setting_problems(temperature=args.temperature, w=args.w, m=args.m)
    try:
        [float(w) for w in args.sweep.split(",")]
        lrs_given = [float(x) for x in args.lrs.split(",")]
        if not all(math.isfinite(x) and x > 0 for x in lrs_given):
            problems.append(f"--lrs {args.lrs}: step sizes must be finite and > 0")
    except ValueError:
        problems.append(f"--lrs {args.lrs!r} / --sweep {args.sweep!r}: numbers separated by commas")
    refuse(problems)
    checked = {}
    for spec in args.runs:
        run, step, _ = batch_spec(spec)
        checked[spec] = read_step(run, step)
        why = "trained no trajectory" if not checked[spec].kept else checked[spec].problem()
        if why:
            problems.append(f"{spec}: step {step} {why}")
    refuse(problems)

    import torch

    from stare_agents.jsonl import dumps
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
        trajectories, advantages = checked[spec].kept, checked[spec].advantages
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
        write_json(Path(args.json), out)


if __name__ == "__main__":
    main()
