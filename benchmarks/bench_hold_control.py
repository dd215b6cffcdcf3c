"""The hold ablation beside its random-token control (issue 47): does choosing the most surprising
negative-advantage tokens matter, or only shrinking some of them?

    nice -n 19 .venv/bin/python benchmarks/bench_hold_control.py --out runs/hold-control --seeds 0,1 \
        --set rl.sampling_rounds=1 --set rl.max_empty_steps=0 --json benchmarks/logs/mechanism/hold-control.json

Per seed, two `stare-agents train` runs of the recipe (`smollm2-arith-hold`: W 1, M 0.25, gated, STARE-C2):
"hold", the recipe as it is, and then "random", from hold's own SFT model (`sft.enabled=false
model.name=<hold>/sft_model`) with `rl.algorithm=stare-random rl.stare.variant=C2`: the same gate, P, W and M, L-
drawn at random from T- (as many tokens). The pair differs in which negative-advantage tokens M shrinks and in
nothing else. Seeds run one after the other, hold then random, so that load falls on both arms of a seed alike;
a run done is not run again, one cut short is resumed (`--resume`), and `--report` only reads.

Per run: the second half's mean all-sampled entropy (`learner/entropy_all`) with its 95% interval over blocks of 2
steps and whether that interval lies inside the target's +-30% band (bench_long_run's criterion), the held-out
accuracy of the SFT and the final model. Per seed: hold - random for the second-half mean and for the final
accuracy (paired over the held-out tasks). Over seeds: the mean of hold - random with a t-interval (2 seeds or
more). `--set` overrides go to both arms (e.g. `rl.sampling_rounds=1 rl.max_empty_steps=0`, as the kept hold runs drew:
they predate the stop after 2 steps in a row with no group to train on). Bad input (no
seed, a recipe that is not STARE-C2, an override of the variant, the reweighting or the algorithm other than
`rl.algorithm=stare-c2`) is refused
before any run, with a non-zero exit and no JSON.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_causal_selection import (  # t over seeds; the campaign loop
    paired_interval,
    run_campaign,
    run_folder,
)
from bench_long_run import criteria, difference, per_task, progress
from bench_w_sweep import entropies

ARMS = ("hold", "random")
CONTROL = ["rl.algorithm=stare-random", "rl.stare.variant=C2"]  # C2: the recipe's M acts on L- (O1 never reads M)
FIXED = ("rl.algorithm", "rl.stare.variant", "rl.reweighting")  # what makes the two arms what they are


def finished(folder: Path) -> bool:
    """The run went through RL and its final evaluation (`summary.json` is the trainer's last write)."""
    return (folder / "summary.json").exists()


def train_command(args: argparse.Namespace, arm: str, seed: int, out: Path) -> list[str]:
    folder = run_folder(out, arm, seed)
    command = [
        sys.executable, "-m", "stare_agents.cli", "train", "--recipe", args.recipe, "--out", str(folder),
        f"seed={seed}", *args.set,
    ]  # fmt: skip
    if arm == "random":
        command += ["sft.enabled=false", f"model.name={run_folder(out, 'hold', seed) / 'sft_model'}", *CONTROL]
    if (folder / "progress.json").exists():
        command.append("--resume")
    return command


def refusals(args: argparse.Namespace) -> list[str]:
    from stare_agents.train.config import load_config

    found = []
    if not args.seeds_list:
        found.append("--seeds: give at least one seed (e.g. 0,1)")
    for item in args.set:
        if item.partition("=")[0] in FIXED and item != "rl.algorithm=stare-c2":  # a recipe made STARE-C2 is still the hold arm
            found.append(f"--set {item}: the arms set it themselves (hold: the recipe's; random: {CONTROL})")
    try:
        config = load_config(recipe=args.recipe, overrides=args.set)
        control = load_config(recipe=args.recipe, overrides=[*args.set, *CONTROL])
    except ValueError as error:
        return [*found, f"--recipe {args.recipe} with --set {args.set}: {error}"]
    hold = config.rl.algorithm_config()
    if hold.stare is None or getattr(hold.stare, "variant", None) != "C2" or hold.reweighting != "stare":
        found.append(f"--recipe {args.recipe}: rl.algorithm={config.rl.algorithm} is not STARE-C2; the control "
                     "mirrors a STARE-C2 recipe (the hold ablation's)")
    elif control.rl.algorithm_config().stare.m != hold.stare.m:
        found.append("the control's M differs from the recipe's")
    return found


def run_arms(args: argparse.Namespace) -> None:
    run_campaign(
        Path(args.out), args.seeds_list, ARMS,
        lambda arm, seed, folder: train_command(args, arm, seed, folder.parent), finished,
    )  # fmt: skip


def run_report(folder: Path, target: float, steps: int) -> dict[str, Any] | None:
    if not finished(folder):
        return None
    state = progress(folder) or {}
    got = criteria(entropies(folder), target, steps, 0.8)
    return {
        "second_half": got["mean_interval"],
        "second_half_in_band": got["mean_interval_in_band"],
        "accuracy": {point: state.get("accuracy", {}).get(point) for point in ("sft", "rl")},
        "per_task_rl": per_task(state, "rl"),
    }


def report(args: argparse.Namespace) -> dict[str, Any]:
    from stare_agents.train.config import load_config

    config = load_config(recipe=args.recipe, overrides=args.set)
    target, steps = config.rl.algorithm_config().stare.target_entropy, config.rl.steps
    out = Path(args.out)
    seeds: dict[str, Any] = {}
    for seed in args.seeds_list:
        runs = {arm: run_report(run_folder(out, arm, seed), target, steps) for arm in ARMS}
        entry: dict[str, Any] = {
            arm: None if got is None else {k: v for k, v in got.items() if k != "per_task_rl"}
            for arm, got in runs.items()
        }
        hold, random = runs["hold"], runs["random"]
        if hold and random and hold["second_half"] and random["second_half"]:
            entry["second_half_hold_minus_random"] = hold["second_half"]["mean"] - random["second_half"]["mean"]
            entry["accuracy_hold_minus_random"] = difference(hold["per_task_rl"], random["per_task_rl"])
        seeds[str(seed)] = entry
        print(f"seed {seed}: {json.dumps(entry)}", flush=True)
    paired = [e["second_half_hold_minus_random"] for e in seeds.values() if "second_half_hold_minus_random" in e]
    result = {
        "recipe": args.recipe,
        "set": args.set,
        "control": CONTROL,
        "target": target,
        "steps": steps,
        "seeds": seeds,
        "second_half_hold_minus_random": paired_interval(paired) if len(paired) >= 2 else None,
        "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
    }
    print("hold - random, second-half entropy over seeds:", result["second_half_hold_minus_random"])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the campaign's folder (one run folder per arm and seed)")
    parser.add_argument("--recipe", default="smollm2-arith-hold")
    parser.add_argument("--seeds", default="0,1", help="comma-separated run seeds")
    parser.add_argument("--set", action="append", default=[], help="an override for both arms (repeatable)")
    parser.add_argument("--report", action="store_true", help="only read the runs there are")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    try:
        args.seeds_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds {args.seeds!r}: comma-separated integers, e.g. 0,1") from None
    found = refusals(args)
    if found:
        raise SystemExit("refused before any run:\n  " + "\n  ".join(found))
    if not args.report:
        run_arms(args)
    result = report(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
