"""The causal test of STARE's selection (issue 47, item 2), registered in docs/mechanism.md ("The causal test of
the selection") before any of its runs, and re-registered there before the campaign's first run.

    nice -n 19 .venv/bin/python benchmarks/bench_causal_selection.py \\
        --model runs/causal/sft_model --out runs/causal --arms w1,phi-w3 \\
        --sft-from benchmarks/logs/default-job-seeds/epyc-avx512bf16/sftseed-b2a0a3a/fast-s0/config.yaml \\
        --json benchmarks/logs/mechanism/causal-selection.json

(then `--arms top-w3,random-w3` for the reported arms, and `--report` over all four). Four arms, each a
`stare-agents train` run of `--steps` RL steps (12) from the SFT model `--model`, for each seed of `--seeds` (0-5),
with the recipe's RL (`--recipe`, smollm2-arith, the default job: its tasks, 4 prompts x 8 samples refilled up to
4 sampling rounds, AdamW), the learner in fp32, no gate (`rl.stare.gated=false`), fixed weights, temperature 1.0
(rollouts, learner, statistic):

    w1         STARE-O1 at W 1: no token reweighted (the baseline)
    phi-w3     L+ = the positive-advantage tokens with Phi < 0, exactly (rl.reweighting=phi-negative), W 3
    top-w3     the paper's L+: the top 10% of T+ by surprisal (STARE-O1, P 0.1), W 3
    random-w3  as many tokens of T+ as phi-w3's rule takes, drawn at random (phi-negative-random), W 3

Every arm of a seed starts from the same model with the same seed (paired by seed). The statistic of a run is its
final model's token-mean entropy (temperature 1.0) over the action tokens of one common held-out batch minus the
start model's (`--common-batch`: a `stare-agents rollout` file; made once by this script from the SFT model on the
environment's held-out tasks, `env.eval_seed`, when it is not there). The verdict: the paired difference
phi-w3 - w1 over seeds, its mean and 95% t-interval (Student's t, n - 1 degrees of freedom); pass iff the interval
lies above 0. Reported beside it, not judged: top-w3 - w1, random-w3 - w1 and phi-w3 - random-w3.

Resumable: a run done is not run again and one cut short resumes from its checkpoint (a done run's checkpoints
are deleted, its final model kept); `--report` only reads what is there. Runs go seed by seed, so that a campaign
cut short leaves whole pairs. `--estimate` runs one arm for one step and prints the wall time an arm and the
whole campaign would take on this machine. Bad input (fewer than 2 seeds, a W below 1, a temperature <= 0, an
SFT model folder that is not there, a learner that does not offer the arms' reweightings) is refused before any
run, naming it, with a non-zero exit and no JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_entropy_mechanism import make_sft  # a run's SFT stage again
from bench_w_sweep import batch_entropy, done, drop_checkpoints  # the W sweep's helpers

# arm -> (overrides of the run, what it is); W and P as registered
ARMS: dict[str, tuple[list[str], str]] = {
    "w1": (["rl.stare.w=1.0"], "STARE-O1 at W 1 (no token reweighted)"),
    "phi-w3": (["rl.reweighting=phi-negative", "rl.stare.w=3.0"], "L+ = T+ with Phi < 0, W 3"),
    "top-w3": (["rl.stare.top_ratio=0.1", "rl.stare.w=3.0"], "L+ = top 10% of T+ by surprisal, W 3"),
    "random-w3": (["rl.reweighting=phi-negative-random", "rl.stare.w=3.0"], "as many random T+ tokens, W 3"),
}
RECIPE = "smollm2-arith"  # the default job's RL settings (re-registered; the long recipe's left 3 of 8 groups)
JUDGED = ("phi-w3", "w1")  # the registered statistic: change(phi-w3) - change(w1), paired by seed
REPORTED = (("top-w3", "w1"), ("random-w3", "w1"), ("phi-w3", "random-w3"))
# Student's t 0.975 quantiles by degrees of freedom (a paired interval over a few seeds)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip


def t_quantile(df: int) -> float:
    """t_{0.975, df} from the table (the nearest tabulated df at or below; 1.96 past 30)."""
    if df < 1:
        raise ValueError(f"a t-interval needs at least 2 values (df >= 1), got df={df}")
    return 1.96 if df > 30 else T_975[max(d for d in T_975 if d <= df)]


def paired_interval(differences: list[float]) -> dict[str, Any]:
    """Mean of the per-seed differences and its 95% t-interval; None figures with fewer than 2 seeds."""
    n = len(differences)
    if n < 2:
        return {"seeds": n, "mean": differences[0] if n else None, "ci_low": None, "ci_high": None}
    mean = statistics.fmean(differences)
    half = t_quantile(n - 1) * statistics.stdev(differences) / math.sqrt(n)
    return {"seeds": n, "mean": mean, "ci_low": mean - half, "ci_high": mean + half}


def run_folder(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}-s{seed}"


def train_command(args: argparse.Namespace, arm: str, seed: int, folder: Path, steps: int) -> list[str]:
    """One arm's `stare-agents train` command (resuming when the folder holds a run cut short)."""
    command = [
        sys.executable, "-m", "stare_agents.cli", "train", "--recipe", args.recipe, "--out", str(folder),
        f"seed={seed}", f"model.name={args.model}", "sft.enabled=false", f"rl.steps={steps}",
        "rl.algorithm=stare", "rl.stare.variant=O1", "rl.stare.gated=false", "rl.stare.adaptive=false",
        "rl.learner.precision=fp32",
        f"rollout.temperature={args.temperature}", "eval.num_tasks=0", "eval.every=0",
        *ARMS[arm][0], *args.set,
    ]  # fmt: skip
    if (folder / "progress.json").exists():
        command.append("--resume")
    return command


def refusals(args: argparse.Namespace) -> list[str]:
    """Everything wrong with the settings, before any run."""
    problems = []
    seeds = args.seeds_list
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        problems.append(
            f"--seeds {args.seeds}: a paired interval needs at least 2 distinct seeds (registered: 6)"
        )
    if args.steps < 1:
        problems.append(f"--steps {args.steps}: at least 1 RL step")
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        problems.append(f"--temperature {args.temperature}: must be finite and > 0 (registered: 1.0)")
    if args.sft_from is not None and not Path(args.sft_from).is_file():
        problems.append(f"--sft-from {args.sft_from}: no such file (a run's config.yaml)")
    if not Path(args.model).is_dir() and args.model not in ("tiny", "smollm2-135m") and args.sft_from is None:
        problems.append(
            f"--model {args.model}: no such folder (the SFT model every arm starts from; --sft-from RUN/config.yaml "
            "makes it with that run's SFT stage)"
        )
    from stare_agents.algo.reweighting import REWEIGHTINGS

    needed = sorted(
        {o.split("=", 1)[1] for arm in args.arms for o in ARMS[arm][0] if o.startswith("rl.reweighting")}
    )
    missing = [name for name in needed if name not in REWEIGHTINGS]
    if missing:
        problems.append(
            f"rl.reweighting {', '.join(missing)}: not in stare_agents.algo.reweighting.REWEIGHTINGS (this checkout "
            f"offers {', '.join(REWEIGHTINGS)}); the arms need stare_agents.algo.phi_selection's methods registered "
            "there and a learner that passes Phi to a method with needs_phi"
        )
    return problems


def common_batch(args: argparse.Namespace) -> list:
    """The common held-out batch: `--common-batch` (a rollout JSONL), made first from the SFT model on the
    environment's held-out tasks when it is not there."""
    from stare_agents.train.config import load_config
    from stare_agents.trajectory import read_jsonl

    path = Path(args.common_batch)
    if not path.exists():
        config = load_config(recipe=args.recipe, overrides=[f"model.name={args.model}", *args.set])
        command = [
            sys.executable, "-m", "stare_agents.cli", "rollout", "--env", config.env.id, "--model", args.model,
            "--out", str(path), "--engine", config.rollout.engine, "--workers", "0",
            "--num-tasks", str(args.common_tasks), "--n", str(args.common_samples), "--seed", str(config.env.eval_seed),
            "--temperature", str(args.temperature), "--max-tokens-per-turn", str(config.rollout.max_tokens_per_turn),
            "--max-total-tokens", str(config.rollout.max_total_tokens), "--max-model-len",
            str(config.model.max_model_len), "--rendering", config.rollout.rendering, "--sandbox",
            config.rollout.sandbox, "--env-kwargs", json.dumps(config.env.make_kwargs()),
        ]  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        print("common batch:", shlex.join(command), flush=True)
        with open(path.with_suffix(".log"), "w") as log:
            made = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
        if made.returncode != 0:
            path.unlink(missing_ok=True)  # a partial file would pass for the batch next time
            raise SystemExit(
                f"the common batch could not be made (exit {made.returncode}); its log is {path.with_suffix('.log')}"
            )
    batch = [t for t in read_jsonl(path) if t.num_action_tokens]
    if not batch:
        raise SystemExit(f"--common-batch {path}: no trajectory with action tokens")
    return batch


def run_campaign(
    out: Path,
    seeds: list[int],
    arms: list[str] | tuple[str, ...],
    command: Callable[[str, int, Path], list[str]],
    finished: Callable[[Path], bool],
) -> None:
    """Every (seed, arm) run not `finished` yet, seed by seed and the arms of a seed in order (so that load falls
    on the arms of a seed alike): `command(arm, seed, folder)`, its output in `<folder>.log`; a failed run stops
    the campaign naming its log. A finished run's checkpoints are deleted."""
    for seed in seeds:
        for arm in arms:
            folder = run_folder(out, arm, seed)
            if not finished(folder):
                folder.parent.mkdir(parents=True, exist_ok=True)
                argv = command(arm, seed, folder)
                print("running:", shlex.join(argv), flush=True)
                started = time.perf_counter()
                with open(folder.parent / f"{folder.name}.log", "a") as log:
                    ran = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT)
                if ran.returncode != 0:
                    raise SystemExit(f"{folder}: the run failed (exit {ran.returncode}); its log is {folder}.log")
                print(f"{folder}: done in {time.perf_counter() - started:.0f} s", flush=True)
            drop_checkpoints(folder)


def run_arms(args: argparse.Namespace) -> None:
    """Every (seed, arm) not done yet, seed by seed."""
    run_campaign(
        Path(args.out), args.seeds_list, args.arms,
        lambda arm, seed, folder: train_command(args, arm, seed, folder, args.steps), done,
    )  # fmt: skip


def run_figures(folder: Path) -> dict[str, Any]:
    """What a run's `metrics.jsonl` says of its steps: how many, the trajectories each trained on (the test asks
    for full batches), how many tokens L+ held and which share of them had Phi < 0, and the learner's entropy at
    the first and the last step. A line that cannot be read is named in `unread`, not passed over."""
    from stare_agents.jsonl import read_lines

    records, unread = read_lines(folder / "metrics.jsonl")
    steps: dict[int, dict] = {}
    for _, record in records:
        if isinstance(record, dict) and record.get("kind") == "rl":
            steps[int(record["step"])] = record  # a resumed run's last record of a step

    def values(key: str, scale: str | None = None) -> list[float]:
        got = []
        for record in steps.values():
            value = record.get(key)
            factor = record.get(scale, math.nan) if scale else 1.0
            if isinstance(value, int | float) and isinstance(factor, int | float) and math.isfinite(value * factor):
                got.append(float(value * factor))
        return got

    def mean(xs: list[float]) -> float | None:
        return statistics.fmean(xs) if xs else None

    kept = values("data/kept_trajectories")
    entropy = [steps[s].get("learner/entropy") for s in sorted(steps)]
    entropy = [v if isinstance(v, int | float) and math.isfinite(v) else None for v in entropy]  # strict JSON
    return {
        "steps": len(steps),
        "trained_trajectories_min": min(kept) if kept else None,
        "budget_exhausted_steps": sum(1 for v in values("data/budget_exhausted") if v > 0),
        "lplus_tokens_per_step": mean(values("stare/lplus_share", "learner/action_tokens")),
        "lplus_negative_phi_share": mean(values("stare/lplus_negative_phi")),
        "entropy_first_last": [entropy[0], entropy[-1]] if entropy else None,
        "unread": [str(u) for u in unread],
    }


def report(args: argparse.Namespace, batch: list) -> dict[str, Any]:
    """Each done run's common-batch change, the registered verdict and the reported differences."""
    start = batch_entropy(args.model, batch, args.temperature)
    changes: dict[str, dict[int, float]] = {arm: {} for arm in ARMS}
    runs: dict[str, dict[str, Any]] = {arm: {} for arm in ARMS}
    for arm in args.arms:
        for seed in args.seeds_list:
            folder = run_folder(Path(args.out), arm, seed)
            if done(folder) and (folder / "final_model").is_dir():
                changes[arm][seed] = batch_entropy(folder / "final_model", batch, args.temperature) - start
                runs[arm][str(seed)] = figures = run_figures(folder)
                if figures["unread"]:
                    print(f"{folder}/metrics.jsonl: unreadable lines: {'; '.join(figures['unread'])}", flush=True)
    out: dict[str, Any] = {
        "model": args.model,
        "recipe": args.recipe,
        "steps": args.steps,
        "temperature": args.temperature,
        "common_batch": {"path": str(args.common_batch), "trajectories": len(batch), "start_entropy": start},
        "arms": {arm: {"what": ARMS[arm][1], "overrides": ARMS[arm][0], "change_by_seed": {str(s): v for s, v in
                                                                                       changes[arm].items()},
                       "runs": runs[arm]}
                 for arm in args.arms},
    }  # fmt: skip
    for a, b in (JUDGED, *REPORTED):
        if a in args.arms and b in args.arms:
            seeds = sorted(set(changes[a]) & set(changes[b]))
            out[f"{a}-minus-{b}"] = {
                **paired_interval([changes[a][s] - changes[b][s] for s in seeds]),
                "by_seed": seeds,
            }
    judged = out.get(f"{JUDGED[0]}-minus-{JUDGED[1]}")
    complete = judged is not None and judged["seeds"] == len(args.seeds_list) and judged["ci_low"] is not None
    out["verdict"] = (
        ("pass" if judged["ci_low"] > 0 else "fail")
        if complete
        else "not judged: the runs of every seed are needed"
    )
    for key, value in out.items():
        if key.endswith(tuple(f"-minus-{b}" for _, b in (JUDGED, *REPORTED))):
            print(
                f"{key}: mean {value['mean']} [{value['ci_low']}, {value['ci_high']}] over {value['seeds']} seeds"
            )
    for arm in args.arms:
        done_runs = list(runs[arm].values())
        if done_runs:
            per_step = [r["lplus_tokens_per_step"] for r in done_runs if r["lplus_tokens_per_step"] is not None]
            fewest = [r["trained_trajectories_min"] for r in done_runs if r["trained_trajectories_min"] is not None]
            print(
                f"{arm}: {len(done_runs)} runs; L+ tokens a step {statistics.fmean(per_step) if per_step else None}; "
                f"fewest trajectories a step trained on {min(fewest) if fewest else None}"
            )
    print(f"verdict (phi-w3 - w1, 95% interval above 0): {out['verdict']}")
    return out


def estimate(args: argparse.Namespace) -> None:
    """One arm (`--arms`' first) for one step of seed 0: the wall time of the run, its step, and what an arm of
    `--steps` steps and the campaign would take (start-up + steps x step time)."""
    from stare_agents.jsonl import read_lines

    arm, seed = args.arms[0], args.seeds_list[0]
    folder = Path(args.out) / f"estimate-{arm}-s{seed}"
    if folder.exists():
        raise SystemExit(f"{folder} exists: remove it for a fresh estimate")
    folder.parent.mkdir(parents=True, exist_ok=True)
    command = train_command(args, arm, seed, folder, 1)
    started = time.perf_counter()
    with open(folder.parent / f"{folder.name}.log", "w") as log:
        finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    if finished.returncode != 0:
        raise SystemExit(f"the estimate's run failed (exit {finished.returncode}); its log is {folder}.log")
    records, _ = read_lines(folder / "metrics.jsonl")
    steps = [r for _, r in records if isinstance(r, dict) and r.get("kind") == "rl"]
    step_s = sum(v for k, v in steps[-1].items() if k.startswith("time/") and isinstance(v, int | float))
    per_arm = wall - step_s + args.steps * step_s
    print(
        f"estimate ({arm}, seed {seed}, one step, this machine now): run {wall:.0f} s, of which the step "
        f"{step_s:.0f} s; an arm of {args.steps} steps about {per_arm / 60:.0f} min; {len(args.arms)} arms x "
        f"{len(args.seeds_list)} seeds about {per_arm * len(args.arms) * len(args.seeds_list) / 3600:.1f} h"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="the SFT model every arm starts from (a local folder)")
    parser.add_argument(
        "--recipe", default=RECIPE, help="recipe whose RL settings the arms use (the default job's)"
    )
    parser.add_argument(
        "--sft-from", help="a run's config.yaml: make --model with its SFT stage when it is not there"
    )
    parser.add_argument(
        "--seeds", default="0,1,2,3,4,5", help="training seeds, comma-separated (registered: 0-5)"
    )
    parser.add_argument("--steps", type=int, default=12, help="RL steps of each run (registered: 12)")
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="rollouts, learner and statistic (1.0)"
    )
    parser.add_argument(
        "--arms", default=",".join(ARMS), help=f"arms to run, comma-separated ({', '.join(ARMS)})"
    )
    parser.add_argument("--out", required=True, help="folder of the runs, one sub-folder an arm and seed")
    parser.add_argument(
        "--common-batch", help="the held-out batch (rollout JSONL; default OUT/common-batch.jsonl)"
    )
    parser.add_argument(
        "--common-tasks", type=int, default=16, help="held-out tasks of a common batch made here"
    )
    parser.add_argument(
        "--common-samples", type=int, default=4, help="samples a task of a common batch made here"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="another override (repeat)"
    )
    parser.add_argument("--report", action="store_true", help="only report the runs already there")
    parser.add_argument("--estimate", action="store_true", help="time one step of the first arm, then stop")
    parser.add_argument("--json", type=Path, help="write the figures and the verdict here")
    args = parser.parse_args(argv)
    try:
        args.seeds_list = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: integers separated by commas")
    args.arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown {unknown}; allowed: {', '.join(ARMS)}")
    args.common_batch = args.common_batch or str(Path(args.out) / "common-batch.jsonl")
    problems = refusals(args)
    if problems:
        print("refused:\n  " + "\n  ".join(problems), file=sys.stderr)
        raise SystemExit(2)
    if args.sft_from is not None and not Path(args.model).is_dir():
        from stare_agents.train.config import load_config

        make_sft(load_config(path=args.sft_from), Path(args.model))
    if args.estimate:
        return estimate(args)
    batch = common_batch(args)  # made (and checked) before the first run, not after hours of them
    if not args.report:
        run_arms(args)
    out = report(args, batch)
    out["command"] = shlex.join(
        ["benchmarks/bench_causal_selection.py", *(argv if argv is not None else sys.argv[1:])]
    )
    if args.json:
        from stare_agents.jsonl import dumps

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
