"""Near-criticality where it can be tested (issue 47, item 3): the critical W* of STARE-O1 on the tabular
simulation against the sequence length T and the outcome's credit, judged by the pass line registered in
docs/mechanism.md ("Near-criticality in the tabular simulation") before the first run.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/bench_criticality.py \\
        --json benchmarks/logs/mechanism/criticality.json

W* (`stare_agents.algo.criticality`) is where the expected first-order entropy drift of one plain gradient step
turns sign, at the simulation's initial policy (`stare-agents demo`'s settings otherwise: 64 contexts, 32 tokens,
init scale 6, 8 prompts x 8, P = 10%). The grid: T in 16, 64, 256, 1024 at credit 1, and credit in 0.125, 0.25,
0.5, 1 at T = 256, for each seed (a seed is a policy: its random logits). One token's credit is credit / T.

The pass line (all three, in every seed):
  (a) weak credit: every point with credit / T <= 1/256 has W* in (1, 1.1] with its 95% interval inside it;
  (b) T: at credit 1, W* - 1 falls strictly as T grows, and the least-squares slope of log(W* - 1) against log T
      lies in [-1.3, -0.7] (W* = 1 + O(1/T));
  (c) credit: at T = 256, W* - 1 rises strictly with the credit, with a log-log slope in [0.7, 1.3].
The JSON is written once, at the end (nothing partial), with the verdict and the command.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from stare_agents.algo.criticality import CriticalW, critical_w
from stare_agents.algo.simulation import SimulationConfig
from stare_agents.jsonl import dumps

SEQ_LENS = (16, 64, 256, 1024)  # at credit 1
CREDITS = (0.125, 0.25, 0.5, 1.0)  # at T = 256
CREDIT_T = 256
WEAK_CREDIT = 1 / 256  # per-token credit at or below which W* must lie in (1, 1.1]
W_STAR_MAX = 1.1
T_SLOPE = (-1.3, -0.7)
CREDIT_SLOPE = (0.7, 1.3)
SETTINGS = ("num_contexts", "vocab_size", "num_prompts", "group_size", "init_scale", "top_ratio")


def grid() -> list[tuple[int, float]]:
    """(T, credit) of every point of one seed, each once."""
    points = [(t, 1.0) for t in SEQ_LENS] + [(CREDIT_T, c) for c in CREDITS]
    return sorted(set(points))


def log_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x; None when a y is not positive (W* <= 1 has no log)."""
    if any(y is None or y <= 0 for y in ys):
        return None
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def _excess(point: dict[str, Any]) -> float | None:
    return point["w_star"] - 1.0 if point["w_star"] is not None else None


def judge_seed(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The registered pass line over one seed's points (records of `CriticalW`)."""
    by_key = {(p["seq_len"], p["credit"]): p for p in points}
    weak = [p for p in points if p["credit"] / p["seq_len"] <= WEAK_CREDIT + 1e-12]
    bad_weak = [
        f"T {p['seq_len']} credit {p['credit']:g}: W* {p['w_star']}, [{p['ci_low']}, {p['ci_high']}]"
        for p in weak
        if not (
            p["w_star"] is not None
            and p["ci_low"] is not None
            and p["ci_high"] is not None
            and 1.0 < p["ci_low"] <= p["w_star"] <= p["ci_high"] <= W_STAR_MAX
        )
    ]

    def trend(keys: list[tuple[int, float]], xs: list[float], rising: bool, band: tuple[float, float]):
        excess = [_excess(by_key[k]) for k in keys]
        ordered = all(e is not None for e in excess) and all(
            (b > a) if rising else (b < a) for a, b in itertools.pairwise(excess)
        )
        slope = log_slope(xs, excess)
        return {
            "w_star_minus_1": excess,
            "strictly_monotone": ordered,
            "log_log_slope": slope,
            "slope_band": list(band),
            "pass": ordered and slope is not None and band[0] <= slope <= band[1],
        }

    t_trend = trend([(t, 1.0) for t in SEQ_LENS], list(SEQ_LENS), False, T_SLOPE)
    c_trend = trend([(CREDIT_T, c) for c in CREDITS], list(CREDITS), True, CREDIT_SLOPE)
    return {
        "weak_credit": {"points": len(weak), "failing": bad_weak, "pass": not bad_weak},
        "against_t": t_trend,
        "against_credit": c_trend,
        "pass": not bad_weak and t_trend["pass"] and c_trend["pass"],
    }


def judge(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict over every seed: pass iff each seed passes (a), (b) and (c)."""
    seeds = sorted({p["seed"] for p in points})
    by_seed = {str(s): judge_seed([p for p in points if p["seed"] == s]) for s in seeds}
    return {"seeds": by_seed, "pass": bool(by_seed) and all(v["pass"] for v in by_seed.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0,1", help="policies (random logits) to measure, comma-separated")
    parser.add_argument("--batches", type=int, default=400, help="independent batches per point")
    parser.add_argument("--bootstrap", type=int, default=2000, help="resamples for each W*'s interval")
    parser.add_argument("--json", type=Path, required=True, help="where the points and the verdict go")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    if args.batches < 2 or args.bootstrap < 1:
        parser.error(f"need --batches >= 2 and --bootstrap >= 1; got {args.batches}, {args.bootstrap}")
    points: list[CriticalW] = []
    start = time.perf_counter()
    for seed in seeds:
        for seq_len, credit in grid():
            config = replace(SimulationConfig(), seq_len=seq_len, credit=credit, seed=seed)
            point = critical_w(config, batches=args.batches, bootstrap=args.bootstrap)
            points.append(point)
            print(
                f"seed {seed} T {seq_len:5d} credit {credit:<6g} W* {point.w_star} "
                f"[{point.ci_low}, {point.ci_high}]  L+ Phi<0 {point.lplus_negative_phi}  "
                f"H {point.policy_entropy:.3f}  ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    records = [asdict(p) for p in points]
    verdict = judge(records)
    report = {
        "command": shlex.join(
            ["benchmarks/bench_criticality.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "settings": {
            **{k: v for k, v in asdict(SimulationConfig()).items() if k in SETTINGS},
            "batches": args.batches,
            "bootstrap": args.bootstrap,
        },
        "pass_line": {
            "weak_credit_per_token": WEAK_CREDIT,
            "w_star_max": W_STAR_MAX,
            "t_slope": list(T_SLOPE),
            "credit_slope": list(CREDIT_SLOPE),
        },
        "points": records,
        "verdict": verdict,
        "wall_s": time.perf_counter() - start,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(dumps(report, indent=1) + "\n")
    print(f"verdict: {'PASS' if verdict['pass'] else 'FAIL'}  ({args.json})")
    for seed, v in verdict["seeds"].items():
        print(
            f"  seed {seed}: weak credit {v['weak_credit']['pass']} {v['weak_credit']['failing']}; "
            f"T slope {v['against_t']['log_log_slope']} ({v['against_t']['pass']}); "
            f"credit slope {v['against_credit']['log_log_slope']} ({v['against_credit']['pass']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
