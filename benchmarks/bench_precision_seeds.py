"""The default job per RL precision and training seed: does RL learn in bf16 as it does in fp32 on this CPU?

    .venv/bin/python benchmarks/bench_precision_seeds.py --out runs/precision --seeds 0,1,2 \\
        --precisions fp32,bf16 --json runs/precision.json

Each point is one run of the default job (`stare-agents train --recipe smollm2-arith`) into OUT/<precision>-s<seed>,
with the RL precision's overrides below and nothing else changed: SFT runs in the recipe's `fast` in every point, so
the points of one seed start RL from the same cold start. A point already done is not run again, and one cut short
resumes from its checkpoint (`--report` only reads what is there). Per point it prints the held-out accuracies
(SFT, RL), RL - SFT with its paired 95% interval, the training reward at the first and last step (and its max),
the rollout/learner mismatch (mean |log r|, KL, share of tokens with r outside [0.9, 1.1], over the run's steps),
the held-out tool error rate after RL and the job's wall time; per precision the mean and range of RL - SFT over
the seeds, and whether every seed passes the bar: RL - SFT >= +0.25 with the interval's lower end >= +0.15.

The ablations isolate one side at a time: `engine-bf16` (bf16 vLLM engine, fp32 learner), `learner-bf16` (fp32
engine, bf16 learner) and `bf16-head-tis` (bf16 on both sides with the fp32 LM head and truncated importance
sampling at cap 2). Precisions are named, not `fast`, so a point means the same on every CPU; bf16 on a CPU
without avx512_bf16 or AMX runs about 100x slower (stare_agents.hardware).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from stare_agents import hardware
from stare_agents.jsonl import dumps, read_lines, report_unread

RECIPE = "smollm2-arith"
PRECISIONS: dict[str, list[str]] = {
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
BAR_GAIN, BAR_LOW = 0.25, 0.15  # issue 27's bar: RL - SFT >= +0.25, the paired interval's lower end >= +0.15


def run_point(folder: Path, precision: str, seed: int) -> None:
    command = [sys.executable, "-m", "stare_agents.cli", "train", "--recipe", RECIPE, "--out", str(folder)]
    if (folder / "progress.json").exists():
        command.append("--resume")
    command += [f"seed={seed}", *PRECISIONS[precision]]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def read_point(folder: Path) -> dict[str, Any] | None:
    """A finished point's figures from its summary.json and metrics.jsonl; None when it has no summary yet."""
    summary_path = folder / "summary.json"
    if not summary_path.exists():
        return None
    summary = json.loads(summary_path.read_text())
    lines, unread = read_lines(folder / "metrics.jsonl")
    report_unread(unread, None, f"lines of {folder / 'metrics.jsonl'}")
    records = [record for _, record in lines]
    rewards = [r["rollout/mean_reward"] for r in records if r.get("kind") == "rl" and "rollout/mean_reward" in r]
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
    return point


def aggregate(points: dict[int, dict[str, Any]]) -> dict[str, Any]:
    gains = [p["rl_minus_sft"] for p in points.values()]
    return {
        "seeds": sorted(points),
        "rl_minus_sft_mean": statistics.fmean(gains),
        "rl_minus_sft_range": [min(gains), max(gains)],
        "every_seed_passes": all(p["passes"] for p in points.values()),
    }


def table(results: dict[str, dict[int, dict[str, Any]]]) -> str:
    rows = [
        "| precision | seed | SFT | RL | RL - SFT [95% CI] | bar | reward first -> last (max) "
        "| mean abs log r | KL | r outside [0.9, 1.1] | tool errors after RL | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for precision, points in results.items():
        for seed, p in sorted(points.items()):
            reward = p.get("reward")
            mismatch = p.get("mismatch", {})
            rows.append(
                f"| {precision} | {seed} | {p['sft']:.3f} | {p['rl']:.3f} | {p['rl_minus_sft']:+.3f} "
                f"[{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}] | {'pass' if p['passes'] else 'miss'} | "
                + (f"{reward['first']:.2f} -> {reward['last']:.2f} ({reward['max']:.2f})" if reward else "")
                + f" | {mismatch.get('logprob_abs_diff_mean', float('nan')):.4f}"
                f" | {mismatch.get('kl_mean', float('nan')):.1e}"
                f" | {mismatch.get('ratio_outside_mean', float('nan')):.3f}"
                f" | {p.get('tool_error_rate_after_rl', float('nan')):.3f} | {p['wall_time_s']:.0f} |"
            )
        if points:
            a = aggregate(points)
            rows.append(
                f"| {precision} | mean (range), {len(points)} seeds | | | {a['rl_minus_sft_mean']:+.3f} "
                f"({a['rl_minus_sft_range'][0]:+.3f} to {a['rl_minus_sft_range'][1]:+.3f}) | "
                f"{'every seed passes' if a['every_seed_passes'] else 'not every seed passes'} | | | | | | |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/precision", help="the folder of the points")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--precisions", default="fp32,bf16", help=f"comma-separated, of {sorted(PRECISIONS)}")
    parser.add_argument("--report", action="store_true", help="only read the points already there")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    precisions = args.precisions.split(",")
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        parser.error(f"unknown precision(s) {unknown}: choose from {sorted(PRECISIONS)}")
    needs_bf16 = any("bf16" in override for p in precisions for override in PRECISIONS[p])
    if not args.report and needs_bf16 and not hardware.bf16_is_fast():
        print("note: this CPU has no avx512_bf16 or AMX: the bf16 points run about 100x slower here", flush=True)
    out = Path(args.out)
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for precision in precisions:
        results[precision] = {}
        for seed in seeds:
            folder = out / f"{precision}-s{seed}"
            if not args.report and read_point(folder) is None:
                run_point(folder, precision, seed)
            point = read_point(folder)
            if point is None:
                print(f"{folder}: not finished (no summary.json)", flush=True)
                continue
            results[precision][seed] = point
    print(f"CPU: {hardware.cpu_model()}; bf16 units: {sorted(hardware.BF16_CPU_FLAGS & hardware.cpu_flags()) or 'none'}")
    print(table(results))
    if args.json:
        figures = {
            "cpu": hardware.cpu_model(),
            "points": {p: {str(s): v for s, v in points.items()} for p, points in results.items()},
            "aggregate": {p: aggregate(points) for p, points in results.items() if points},
        }
        Path(args.json).write_text(dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
