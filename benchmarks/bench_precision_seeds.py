"""The default job as a distribution: per precision and training seed, does RL gain reliably on this CPU?

    .venv/bin/python benchmarks/bench_precision_seeds.py --out runs/seeds --seeds 0,1,2,3,4 \\
        --precisions fast,fp32 --replicates 1 --json runs/seeds.json

Each point is one run of the default job (`stare-agents train --recipe smollm2-arith`) into
OUT/<precision>-s<seed> (replicate r > 0: OUT/<precision>-s<seed>-r<r>), with the precision's overrides below and
nothing else changed. The points run interleaved (seed by seed, each precision in turn), so that the machine's load
hits every arm alike; each point records the machine's 1-minute load average every 15 s while it runs
(bench_load.json in its folder). A point already done is not run again, and one cut short resumes from its
checkpoint (`--report` only reads what is there). Per point it prints the held-out accuracies (SFT, RL), RL - SFT
with its paired 95% interval (over held-out tasks: an interval within one run, not over runs), the training reward at
the first and last step (and its max), the trajectories each step trained on and the steps whose refill budget ran
out, the rollout/learner mismatch, the held-out tool error rate after RL, the job's wall time and the load; per
precision the number of runs, the mean, min and max of RL - SFT and its spread (max - min), and the bar: every run
RL - SFT >= +0.25 with the interval's lower end >= +0.15, a spread <= 0.15 and each job <= 15 minutes. Where a
point's folder holds its held-out episodes (heldout/sft.jsonl.gz, heldout/rl.jsonl.gz), it also prints the task
kinds RL gained and lost (accuracy moved by >= KIND_MOVE): a net gain can be a larger gain minus a forgetting. Two runs of the
same settings and seed (a replicate, or `fast` and `fp32` on a CPU where fast is fp32) are listed as pairs: runs of
one seed differ on CPU too. Two precisions run for the same seeds are compared paired by seed: the difference of
their RL - SFT per seed, its mean with a 95% interval over the seeds, and in how many seeds each gained more.

The ablations isolate one side at a time: `engine-bf16` (bf16 vLLM engine, fp32 learner), `learner-bf16` (fp32
engine, bf16 learner) and `bf16-head-tis` (bf16 on both sides with the fp32 LM head and truncated importance
sampling at cap 2). Precisions are named, not `fast`, so a point means the same on every CPU; bf16 on a CPU
without avx512_bf16 or AMX runs about 100x slower (stare_agents.hardware).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from stare_agents import hardware
from stare_agents.jsonl import dumps, read_lines, report_unread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_causal_selection import paired_interval

RECIPE = "smollm2-arith"
PRECISIONS: dict[str, list[str]] = {
    "fast": [],  # the recipe's own: bf16 where the CPU has avx512_bf16 or AMX, fp32 elsewhere
    "fp32": ["model.rollout_dtype=float32", "rl.learner.precision=fp32"],
    "bf16": ["model.rollout_dtype=bfloat16", "rl.learner.precision=bf16"],
    "engine-bf16": ["model.rollout_dtype=bfloat16", "rl.learner.precision=fp32"],
    "learner-bf16": ["model.rollout_dtype=float32", "rl.learner.precision=bf16"],
    "bf16-head-tis": [
        "model.rollout_dtype=bfloat16",
        "rl.learner.precision=bf16",
        "model.fp32_lm_head=true",
        "rl.learner.importance.cap=2.0",
    ],
}
BAR_GAIN, BAR_LOW = 0.25, 0.15  # every run: RL - SFT >= +0.25, the paired interval's lower end >= +0.15
BAR_SPREAD, BAR_WALL_S = 0.15, 900.0  # over the runs: max - min of RL - SFT; each job's wall time
LOAD_FILE = "bench_load.json"
KIND_MOVE = 0.2  # a task kind counts as gained or lost when its held-out accuracy moved by at least this


def point_folder(out: Path, precision: str, seed: int, replicate: int = 0) -> Path:
    return out / (f"{precision}-s{seed}" + (f"-r{replicate}" if replicate else ""))


class LoadSampler:
    """The machine's 1-minute load average every `every` seconds while a point runs, added to its folder's
    bench_load.json (a resumed point adds to what the earlier attempt sampled)."""

    def __init__(self, folder: Path, every: float = 15.0) -> None:
        self.path, self.every = folder / LOAD_FILE, every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        earlier = json.loads(self.path.read_text())["samples"] if self.path.exists() else []
        samples = [*earlier, *self.samples]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(
            dumps({"every_s": self.every, "samples": samples, "cpu": hardware.cpu_model()}) + "\n"
        )


def run_point(
    folder: Path,
    precision: str,
    seed: int,
    recipe: str = RECIPE,
    extra: list[str] | None = None,
    attempts: int = 1,
) -> None:
    """Run (or resume) one point; a run that dies (e.g. a worker killed by Ray's memory monitor on a shared
    machine) is resumed from its checkpoint, up to `attempts` times in all; each failed attempt is logged in the
    folder (bench_attempts.txt)."""
    for attempt in range(1, attempts + 1):
        command = [
            sys.executable,
            "-m",
            "stare_agents.cli",
            "train",
            "--recipe",
            recipe,
            "--out",
            str(folder),
        ]
        # a run folder the trainer began (config.yaml is its first file, progress.json follows): continue it, also
        # when it was cut short before its first checkpoint, which `train` without --resume refuses to overwrite
        if (folder / "progress.json").exists() or (folder / "config.yaml").exists():
            command.append("--resume")
        command += [f"seed={seed}", *PRECISIONS[precision], *(extra or [])]
        print("$", " ".join(command), flush=True)
        with LoadSampler(folder):
            code = subprocess.run(command).returncode
        if code == 0:
            return
        with (folder / "bench_attempts.txt").open("a") as log:
            log.write(f"attempt {attempt}: exit {code}\n")
        print(f"{folder}: attempt {attempt} of {attempts} ended with exit {code}", flush=True)
    raise SystemExit(f"{folder}: {attempts} attempt(s) failed; run the same command again to resume it")


def read_point(folder: Path) -> dict[str, Any] | None:
    """A finished point's figures from its summary.json and metrics.jsonl; None when it has no summary yet."""
    summary_path = folder / "summary.json"
    if not summary_path.exists():
        return None
    summary = json.loads(summary_path.read_text())
    lines, unread = read_lines(folder / "metrics.jsonl")
    report_unread(unread, None, f"lines of {folder / 'metrics.jsonl'}")
    records = [record for _, record in lines]
    steps = [r for r in records if r.get("kind") == "rl"]
    rewards = [r["rollout/mean_reward"] for r in steps if "rollout/mean_reward" in r]
    after_rl = [r for r in records if r.get("kind") == "eval" and r.get("point") == "rl"]
    gain = summary["rl_gain"]
    point = {
        "sft": summary["accuracy"]["sft"],
        "rl": summary["accuracy"]["rl"],
        "rl_minus_sft": gain["value"],
        "ci": [gain["ci_low"], gain["ci_high"]],
        "tasks": gain["tasks"],
        "passes": gain["value"] >= BAR_GAIN and gain["ci_low"] >= BAR_LOW,
        "precision": summary["precision"],
        "wall_time_s": summary["wall_time_s"],
        "kept_trajectories": [int(r.get("data/kept_trajectories", 0)) for r in steps],
        "budget_exhausted_steps": [int(r["step"]) for r in steps if r.get("data/budget_exhausted")],
        "sampling_rounds": [int(r.get("data/sampling_rounds", 1)) for r in steps],
    }
    load_path = folder / LOAD_FILE
    if load_path.exists():
        samples = json.loads(load_path.read_text())["samples"]
        if samples:
            point["load_1m"] = {
                "mean": statistics.fmean(samples),
                "max": max(samples),
                "samples": len(samples),
            }
    if rewards:
        point["reward"] = {"first": rewards[0], "last": rewards[-1], "max": max(rewards)}
    if "mismatch" in summary:
        mismatch = summary["mismatch"]
        point["mismatch"] = {
            key: mismatch[key]
            for key in ("logprob_abs_diff_mean", "kl_mean", "ratio_outside_mean", "max_abs_log_ratio_max")
            if key in mismatch
        }
    if after_rl and "tool_error_rate" in after_rl[-1]:
        point["tool_error_rate_after_rl"] = after_rl[-1]["tool_error_rate"]
    kinds = kind_accuracy(folder)
    if kinds is not None:
        point["kinds"] = kinds
    return point


def task_kind(task_id: str) -> str:
    """The kind of an ArithmeticTIR task from its id (`arith-<kind>-L<level>-<hash>`); the whole id otherwise."""
    parts = task_id.split("-")
    return parts[1] if len(parts) == 4 and parts[0] == "arith" and parts[2].startswith("L") else task_id


def kind_accuracy(folder: Path) -> dict[str, list[float]] | None:
    """Per task kind, [SFT accuracy, RL accuracy] over the held-out episodes the run kept (heldout/sft.jsonl.gz,
    heldout/rl.jsonl.gz); None when either file is missing. A line that does not parse is an error naming it."""
    paths = [folder / "heldout" / f"{stage}.jsonl.gz" for stage in ("sft", "rl")]
    if not all(path.exists() for path in paths):
        return None
    accuracy: list[dict[str, float]] = []
    for path in paths:
        correct: dict[str, list[bool]] = {}
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    trajectory = json.loads(line)["trajectory"]
                    kind, ok = task_kind(str(trajectory["task_id"])), bool(trajectory["correct"])
                except (ValueError, KeyError, TypeError) as error:
                    raise SystemExit(f"{path}:{number}: not a held-out episode ({error!r})") from None
                correct.setdefault(kind, []).append(ok)
        accuracy.append({kind: sum(oks) / len(oks) for kind, oks in correct.items()})
    sft, rl = accuracy
    return {kind: [sft.get(kind, 0.0), rl.get(kind, 0.0)] for kind in sorted(sft.keys() | rl.keys())}


def kinds_moved(kinds: dict[str, list[float]]) -> tuple[list[str], list[str]]:
    """(gained, lost): the kinds whose accuracy rose or fell by >= KIND_MOVE, as "kind 0.00 -> 0.93"."""
    gained = [f"{k} {a:.2f} -> {b:.2f}" for k, (a, b) in kinds.items() if b - a >= KIND_MOVE - 1e-9]
    lost = [f"{k} {a:.2f} -> {b:.2f}" for k, (a, b) in kinds.items() if a - b >= KIND_MOVE - 1e-9]
    return gained, lost


def aggregate(points: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """Over the runs of one precision (keys: seed, or (seed, replicate)): their number, mean, range and spread of
    RL - SFT, and the bar."""
    gains = [p["rl_minus_sft"] for p in points.values()]
    walls = [p["wall_time_s"] for p in points.values()]
    spread = max(gains) - min(gains)
    return {
        "seeds": sorted(points),
        "runs": len(points),
        "rl_minus_sft_mean": statistics.fmean(gains),
        "rl_minus_sft_range": [min(gains), max(gains)],
        "rl_minus_sft_spread": spread,
        "every_seed_passes": all(p["passes"] for p in points.values()),
        "spread_passes": spread <= BAR_SPREAD + 1e-9,
        "wall_time_s_max": max(walls),
        "wall_time_passes": max(walls) <= BAR_WALL_S,
    }


def seed_of(label: str) -> int:
    """A point's seed from its label: "3" (the first run of seed 3) or "3-r1" (its replicate 1)."""
    return int(label.split("-")[0])


def same_setting_pairs(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Pairs of runs of one seed in one resolved precision (a replicate, or two presets that resolve alike on this
    CPU): how far runs of the same settings land apart."""
    runs = [
        (f"{name}-s{label}", seed_of(label), p)
        for name, points in results.items()
        for label, p in points.items()
    ]
    pairs = []
    for i, (name_a, seed_a, a) in enumerate(runs):
        for name_b, seed_b, b in runs[i + 1 :]:
            if seed_a == seed_b and a["precision"] == b["precision"]:
                pairs.append(
                    {
                        "seed": seed_a,
                        "runs": [name_a, name_b],
                        "rl_minus_sft": [a["rl_minus_sft"], b["rl_minus_sft"]],
                        "difference": abs(a["rl_minus_sft"] - b["rl_minus_sft"]),
                    }
                )
    return pairs


def paired_by_seed(
    results: dict[str, dict[str, dict[str, Any]]], first: str, second: str
) -> dict[str, Any] | None:
    """`second` against `first` over the seeds both ran (first runs of each, labels without a replicate): per seed the
    difference of RL - SFT and of RL accuracy (second - first), their means with a 95% t-interval over seeds (an
    interval over runs, unlike a point's interval over tasks), and in how many seeds `second` gained at least as
    much. None when the two precisions share fewer than two seeds, or resolve to the same precision on this CPU
    (then the pairs are replicates, listed by `same_setting_pairs`)."""
    a, b = results.get(first, {}), results.get(second, {})
    seeds = sorted((label for label in a.keys() & b.keys() if "-r" not in label), key=int)
    if len(seeds) < 2 or all(a[s]["precision"] == b[s]["precision"] for s in seeds):
        return None

    def interval(values: list[float]) -> list[float]:
        found = paired_interval(values)  # the causal test's paired t-interval
        return [found["ci_low"], found["ci_high"]]

    gain = [b[s]["rl_minus_sft"] - a[s]["rl_minus_sft"] for s in seeds]
    final = [b[s]["rl"] - a[s]["rl"] for s in seeds]
    return {
        "of": f"{second} - {first}",
        "seeds": [int(s) for s in seeds],
        "rl_minus_sft_difference": gain,
        "rl_minus_sft_difference_mean": statistics.fmean(gain),
        "rl_minus_sft_difference_ci95": interval(gain),
        "rl_difference": final,
        "rl_difference_mean": statistics.fmean(final),
        "rl_difference_ci95": interval(final),
        "second_at_least_as_good": sum(d >= -1e-9 for d in gain),
    }


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    rows = [
        "| precision | seed | SFT | RL | RL - SFT [95% CI over tasks] | bar | reward first -> last (max) "
        "| trajectories trained a step (min-max) | budget out | mean abs log r | KL | tool errors after RL "
        "| wall s | load 1m mean (max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for precision, points in results.items():
        for label, p in sorted(points.items(), key=lambda kv: (seed_of(kv[0]), kv[0])):
            reward = p.get("reward")
            mismatch = p.get("mismatch", {})
            kept = p.get("kept_trajectories") or [0]
            load = p.get("load_1m")
            rows.append(
                f"| {precision} | {label} | {p['sft']:.3f} | {p['rl']:.3f} | {p['rl_minus_sft']:+.3f} "
                f"[{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}] | {'pass' if p['passes'] else 'miss'} | "
                + (f"{reward['first']:.2f} -> {reward['last']:.2f} ({reward['max']:.2f})" if reward else "")
                + f" | {min(kept)}-{max(kept)} | {len(p.get('budget_exhausted_steps', []))}"
                f" | {mismatch.get('logprob_abs_diff_mean', float('nan')):.4f}"
                f" | {mismatch.get('kl_mean', float('nan')):.1e}"
                f" | {p.get('tool_error_rate_after_rl', float('nan')):.3f} | {p['wall_time_s']:.0f} | "
                + (f"{load['mean']:.2f} ({load['max']:.2f})" if load else "")
                + " |"
            )
        if points:
            a = aggregate(points)
            rows.append(
                f"| {precision} | {a['runs']} runs: mean (min to max), spread | | | {a['rl_minus_sft_mean']:+.3f} "
                f"({a['rl_minus_sft_range'][0]:+.3f} to {a['rl_minus_sft_range'][1]:+.3f}), {a['rl_minus_sft_spread']:.3f} | "
                f"{'every run passes' if a['every_seed_passes'] else 'not every run passes'}; spread "
                f"{'<=' if a['spread_passes'] else '>'} {BAR_SPREAD}; longest job {a['wall_time_s_max']:.0f} s "
                f"{'<=' if a['wall_time_passes'] else '>'} {BAR_WALL_S:.0f} | | | | | | | | |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/seeds", help="the folder of the points")
    parser.add_argument("--recipe", default=RECIPE)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--precisions", default="fast,fp32", help=f"comma-separated, of {sorted(PRECISIONS)}")
    parser.add_argument("--replicates", type=int, default=1, help="runs per precision and seed")
    parser.add_argument("--set", action="append", default=[], help="an override for every point (key=value)")
    parser.add_argument("--attempts", type=int, default=3, help="runs of a point that dies, resumed, in all")
    parser.add_argument("--report", action="store_true", help="only read the points already there")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    precisions = args.precisions.split(",")
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        parser.error(f"unknown precision(s) {unknown}: choose from {sorted(PRECISIONS)}")
    if args.replicates < 1:
        parser.error(f"--replicates must be >= 1, got {args.replicates}")
    needs_bf16 = any("bf16" in override for p in precisions for override in PRECISIONS[p])
    if not args.report and needs_bf16 and not hardware.bf16_is_fast():
        print(
            "note: this CPU has no avx512_bf16 or AMX: the bf16 points run about 100x slower here", flush=True
        )
    out = Path(args.out)
    results: dict[str, dict[str, dict[str, Any]]] = {precision: {} for precision in precisions}
    for seed in seeds:  # interleaved: every precision of a seed before the next seed
        for replicate in range(args.replicates):
            for precision in precisions:
                folder = point_folder(out, precision, seed, replicate)
                if not args.report and read_point(folder) is None:
                    run_point(folder, precision, seed, args.recipe, args.set, args.attempts)
                point = read_point(folder)
                if point is None:
                    print(f"{folder}: not finished (no summary.json)", flush=True)
                    continue
                results[precision][f"{seed}" + (f"-r{replicate}" if replicate else "")] = point
    print(
        f"CPU: {hardware.cpu_model()}; bf16 units: {sorted(hardware.BF16_CPU_FLAGS & hardware.cpu_flags()) or 'none'}"
    )
    print(table(results))
    for precision, points in results.items():
        for label, point in sorted(points.items(), key=lambda kv: (seed_of(kv[0]), kv[0])):
            if "kinds" in point:
                gained, lost = kinds_moved(point["kinds"])
                print(
                    f"{precision}-s{label} by task kind (SFT -> RL): gained {', '.join(gained) or 'none'}; "
                    f"lost {', '.join(lost) or 'none'}"
                )
    pairs = same_setting_pairs(results)
    for pair in pairs:
        print(
            f"same settings, seed {pair['seed']}: {pair['runs'][0]} {pair['rl_minus_sft'][0]:+.3f} vs "
            f"{pair['runs'][1]} {pair['rl_minus_sft'][1]:+.3f} ({pair['difference']:.3f} apart)"
        )
    paired = [
        found
        for i, first in enumerate(precisions)
        for second in precisions[i + 1 :]
        if (found := paired_by_seed(results, first, second)) is not None
    ]
    for pair in paired:
        low, high = pair["rl_minus_sft_difference_ci95"]
        print(
            f"paired by seed ({pair['of']}, seeds {pair['seeds']}): RL - SFT differs by "
            + ", ".join(f"{d:+.3f}" for d in pair["rl_minus_sft_difference"])
            + f"; mean {pair['rl_minus_sft_difference_mean']:+.3f}, 95% interval over seeds [{low:+.3f}, {high:+.3f}];"
            f" RL accuracy differs by {pair['rl_difference_mean']:+.3f} on average; the second gained at least as much"
            f" in {pair['second_at_least_as_good']} of {len(pair['seeds'])} seeds"
        )
    if args.json:
        figures = {
            "paired_by_seed": paired,
            "cpu": hardware.cpu_model(),
            "recipe": args.recipe,
            "overrides": args.set,
            "points": results,
            "aggregate": {p: aggregate(points) for p, points in results.items() if points},
            "same_setting_pairs": pairs,
        }
        Path(args.json).write_text(dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
