"""STARE beside GRPO-ds over a long run (issue 28's pass line, BENCHMARKS "STARE beside GRPO-ds, 64 steps"):
the entropy over every sampled action token (`learner/entropy_all`) by step for each algorithm of each run
folder, against STARE's target band, as figures and as one plot.

    .venv/bin/python benchmarks/bench_long_run.py runs/long-s0 runs/long-s1 --plot docs/long-run-entropy.png

A run folder is a `stare-agents train ... --compare grpo-ds` folder: STARE's metrics.jsonl at its top and the
compared algorithm's in a sub-folder named after it. It prints, per run and algorithm: steps logged, the first
value, the second-half mean, the share of second-half steps within +-30% of the target, the steps that trained
on nothing, the held-out accuracy (progress.json) and what the registered pass line asks of each: (1) STARE
held near the target: issue 47's reading, the second-half mean's 95% interval (over blocks of 2 steps) inside the
band (target +-30%), beside the registered share of second-half steps in the band (>= 70%, which no controller
meets at this step noise) and the share of steps whose moving average is in it, each with how often a perfect
controller (the target at every step, read with this run's step noise) would meet it,
(2) GRPO-ds's second-half mean below half of its first value,
(3) STARE's held-out accuracy minus GRPO-ds's >= -0.03 (paired over the tasks both scored, with a bootstrap
interval), (4) STARE's pass@K minus GRPO-ds's >= 0 when both final models were evaluated into `pass8/`
(`stare-agents eval --k 8 ... --out <folder>/pass8`). The second half's spread too: the standard deviation of
single steps and their range. Also the mechanism's figures per run: the share of positive-advantage tokens
(successful trajectories') in the entropy-raising region (Phi < 0), the share of negative-advantage tokens
(failed trajectories') there and the ratio of the two, and the share of STARE's L+ there, over the steps
that trained. And what each gate input (`rl.stare.gate_input`) reads on the run's own log: the trained batch's
entropy (`learner/entropy`), that of every sampled trajectory and its moving average, with how often each sits
below the target (the gate on) over the steps that trained. That is a reading of one run, not a run per input:
another input would have steered the run elsewhere. What the inputs differ by comes from the saved rollouts:
the sampler's entropy over the trained groups' action tokens, over the groups left out whose samples were all
correct, and over the rest left out (all or some wrong, no reward variance), with each kind's share of the
tokens. And STARE's L+ tokens there: their median surprisal against the median entropy at their positions (W
raises the entropy only through tokens more surprising than their position's entropy, roughly). And per task
kind (a task's id without its trailing hash and level): the held-out accuracy of the SFT model and of each final
model, and the training reward in windows of `--window` steps from the saved rollouts, which show the kinds a run
learns, keeps or loses, and when; for ArithmeticTIR-v1, whose ids name a level, the held-out accuracy per level
too. A run still under way is reported as far as it has got ("steps": how many).

A STARE run made without its own compared run, from another run's SFT model (`sft.enabled=false
model.name=<that run>/sft_model`, or the same recipe and seed redoing the SFT), is judged against that run's
compared algorithm with `--against`, one folder per run folder:

    .venv/bin/python benchmarks/bench_long_run.py benchmarks/logs/hold-w1-m025-s1 --against benchmarks/logs/long-bf16-s1

The pairing is only fair when both started from the same model, so where both folders scored an SFT model on
the held-out tasks, the tasks those scores differ on are counted and printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from stare_agents.eval.metrics import outcomes_from_samples, pass_at_k
from stare_agents.jsonl import parse_lines, read_lines, report_unread
from stare_agents.stats import estimate, paired_difference

KEY = "learner/entropy_all"
TRAINED = "learner/entropy"  # the trained (kept) batch's pre-update entropy: gate_input "trained"


def rl_records(metrics: Path) -> list[dict[str, Any]]:
    """The run's RL step records in step order (the last record of a step, as a resumed run rewrites it)."""
    records, unread = read_lines(metrics)
    report_unread(unread, None, f"lines of {metrics}")
    steps: dict[int, dict[str, Any]] = {}
    for _, record in records:
        if isinstance(record, dict) and record.get("kind") == "rl":
            steps[int(record["step"])] = record
    return [steps[s] for s in sorted(steps)]


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def gate_inputs(records: list[dict[str, Any]], target: float, decay: float) -> dict[str, Any]:
    """What each gate input reads at the steps that trained (a finite trained-batch entropy): the means of the
    trained batch's and of all sampled trajectories' entropy, the steps each input (and the moving average of
    the all-sampled entropy over every step, kept by `Stare.gate_entropy` itself) reads below
    `target`, and the steps where the trained and the all-sampled reading disagree about the gate."""
    from stare_agents.algo.stare import Stare, StareConfig

    moving = Stare(StareConfig(gate_input="ema", ema_decay=decay))  # the trainer's own moving average
    read: list[tuple[float, float, float]] = []
    for r in records:
        if finite(r.get(KEY)):
            moving.gate_entropy(math.nan, r[KEY])
        if finite(r.get(TRAINED)) and finite(r.get(KEY)) and moving.ema is not None:
            read.append((r[TRAINED], r[KEY], moving.ema))
    if not read:
        return {"gate_input_steps": 0}
    n = len(read)
    return {
        "gate_input_steps": n,
        "trained_entropy_mean": sum(t for t, _, _ in read) / n,
        "all_entropy_mean_same_steps": sum(a for _, a, _ in read) / n,
        "gate_on_reading_trained": sum(t < target for t, _, _ in read),
        "gate_on_reading_all": sum(a < target for _, a, _ in read),
        "gate_on_reading_ema": sum(e < target for _, _, e in read),
        "trained_and_all_disagree": sum((t < target) != (a < target) for t, a, _ in read),
    }


GROUP_KINDS = ("trained", "left out, all correct", "left out, not all correct")


def task_kind(task_id: str) -> str:
    """A task's kind: its id without the trailing hash and level ("arith-range_sum-70fd62526f" and
    ArithmeticTIR-v1's "arith-range_sum-L2-70fd62526f" -> "arith-range_sum")."""
    return re.sub(r"(-L[0-9]+)?-[0-9a-f]{6,}$", "", task_id)


def task_level(task_id: str) -> str:
    """A task's level where its id names one ("arith-range_sum-L2-70fd62526f" -> "L2"), else "no level"."""
    found = re.search(r"-(L[0-9]+)-[0-9a-f]{6,}$", task_id)
    return found[1] if found else "no level"


def by_kind(
    per_task: dict[str, float] | None, group: Callable[[str], str] = task_kind
) -> dict[str, dict[str, float]]:
    """Held-out score per task kind (`task_kind`, or another `group` of the task id such as `task_level`): the
    mean and the number of tasks."""
    kinds: dict[str, list[float]] = {}
    for task, score in (per_task or {}).items():
        kinds.setdefault(group(task), []).append(float(score))
    return {kind: {"mean": sum(v) / len(v), "tasks": len(v)} for kind, v in sorted(kinds.items())}


def rollout_figures(folder: Path, window: int = 16) -> dict[str, Any]:
    """From every saved step of the run (`rollouts/`), read once:
    - "reward_by_kind": per task kind (`task_kind`), the mean training reward and the trajectories in each window
      of `window` steps (steps 0..window-1, ...): which kinds a run learns, keeps or loses, and when;
    - "entropy_by_group": per group kind (GROUP_KINDS; a group is trained when any of its rollouts is), the
      trajectories, the action tokens, their share of all, and the sampler's entropy estimate there (minus the
      mean log-prob of the sampled action tokens at the rollout temperature, as `rollout/sampler_entropy`);
    - "lplus": STARE's L+ tokens (selection 1) with the learner's log-prob and entropy saved: how many, their
      median surprisal, the median entropy at their positions, and the share whose surprisal is above that
      entropy (roughly where up-weighting a token raises the entropy, Phi < 0).
    Both are empty when the run saved none."""
    from stare_agents.rollout_log import read_rollouts, saved_steps

    tally = {kind: [0, 0, 0.0] for kind in GROUP_KINDS}  # trajectories, tokens, -sum log-prob
    rewards: dict[str, dict[int, list[float]]] = {}
    surprisal: list[float] = []
    entropy: list[float] = []
    for step in saved_steps(folder):
        groups: dict[str, list] = {}
        for saved in read_rollouts(folder, step):
            groups.setdefault(saved.trajectory.group_id, []).append(saved)
            kind_rewards = rewards.setdefault(task_kind(saved.trajectory.task_id), {})
            kind_rewards.setdefault(step // window, []).append(float(saved.trajectory.reward))
            if saved.selection and saved.learner_logprobs and saved.learner_entropy:
                for chosen, logprob, h in zip(
                    saved.selection, saved.learner_logprobs, saved.learner_entropy, strict=True
                ):
                    if chosen == 1:
                        surprisal.append(-logprob)
                        entropy.append(h)
        for group in groups.values():
            if any(r.status == "trained" for r in group):
                kind = GROUP_KINDS[0]
            else:
                kind = GROUP_KINDS[1] if all(r.trajectory.correct for r in group) else GROUP_KINDS[2]
            for saved in group:
                t = saved.trajectory
                actions = [lp for lp, bit in zip(t.rollout_logprobs, t.action_mask, strict=True) if bit]
                if actions:
                    tally[kind][0] += 1
                    tally[kind][1] += len(actions)
                    tally[kind][2] -= sum(actions)
    total = sum(tokens for _, tokens, _ in tally.values())
    by_group = {
        kind: {"trajectories": n, "tokens": tokens, "token_share": tokens / total, "entropy": minus / tokens}
        for kind, (n, tokens, minus) in tally.items()
        if tokens
    }
    lplus: dict[str, Any] = {}
    if surprisal:
        lplus = {
            "tokens": len(surprisal),
            "median_surprisal": statistics.median(surprisal),
            "median_entropy": statistics.median(entropy),
            "surprisal_above_entropy": sum(x > h for x, h in zip(surprisal, entropy, strict=True)) / len(surprisal),
        }
    reward_by_kind = {
        kind: [{"steps": f"{w * window}-{w * window + window - 1}", "mean": sum(v) / len(v), "trajectories": len(v)}
               for w, v in sorted(windows.items())]
        for kind, windows in sorted(rewards.items())
    }
    return {"entropy_by_group": by_group, "lplus": lplus, "reward_by_kind": reward_by_kind}


BAND = 0.3  # STARE's band: the target +-30%
BLOCK = 2  # steps per block of the second-half mean's interval (consecutive steps are not independent)
SHARE = 0.7  # the registered band share (issue 28), and the EMA band share, ask this share of second-half steps


def in_band(value: float, target: float) -> bool:
    return abs(value - target) <= BAND * target


def mean_interval(values: list[float], block: int = BLOCK) -> dict[str, Any] | None:
    """The mean of `values` (in step order) with a 95% interval whose width their step-to-step noise sets: the
    percentile bootstrap over the means of consecutive blocks of `block` steps (a trailing partial block left
    out), so that a correlation between neighbouring steps widens it; None under two blocks."""
    blocks = [statistics.fmean(values[i : i + block]) for i in range(0, len(values) - block + 1, block)]
    if len(blocks) < 2:
        return None
    got = estimate(blocks)
    return {"mean": got.value, "ci_low": got.ci_low, "ci_high": got.ci_high, "blocks": len(blocks)}


def interval_in_band(interval: dict[str, Any] | None, target: float) -> bool:
    """Issue 47's criterion (1): the second-half mean's 95% interval lies inside the band."""
    return interval is not None and (1 - BAND) * target <= interval["ci_low"] <= interval["ci_high"] <= (
        1 + BAND
    ) * target


def ema(values: list[float], decay: float) -> list[float]:
    """The exponential moving average of `values` (as `Stare.gate_entropy` keeps it for gate_input "ema")."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else decay * out[-1] + (1 - decay) * v)
    return out


def lag1(values: list[float]) -> float | None:
    """Lag-1 autocorrelation of `values` (None for fewer than 3 or no spread)."""
    if len(values) < 3:
        return None
    m = statistics.fmean(values)
    spread = sum((v - m) ** 2 for v in values)
    return sum((a - m) * (b - m) for a, b in itertools.pairwise(values)) / spread if spread else None


def criteria(values: dict[int, float], target: float, total_steps: int, decay: float) -> dict[str, Any]:
    """The three readings of "STARE holds the entropy near the target" over the second half (steps >= total_steps
    // 2) of one run's per-step entropies `values`: the registered band share (issue 28; no controller passes it
    at this noise), the mean's interval inside the band (issue 47's criterion, the one judged) and the share of
    steps whose moving average (over every step, `decay`) is inside the band."""
    steps = sorted(values)
    second = [values[s] for s in steps if s >= total_steps // 2]
    smoothed = dict(zip(steps, ema([values[s] for s in steps], decay), strict=True))
    second_ema = [smoothed[s] for s in steps if s >= total_steps // 2]
    interval = mean_interval(second)
    return {
        "band_share": sum(in_band(v, target) for v in second) / len(second) if second else None,
        "mean_interval": interval,
        "mean_interval_in_band": interval_in_band(interval, target),
        "ema_band_share": sum(in_band(v, target) for v in second_ema) / len(second_ema) if second_ema else None,
    }


def perfect_controller(
    sd: float, autocorrelation: float, target: float, total_steps: int, decay: float, *, trials: int = 400
) -> dict[str, float]:
    """How often a perfect controller meets each criterion: its entropy is the target at every step, read with
    Gaussian noise of this `sd` and lag-1 `autocorrelation` (clipped to +-0.9), `trials` runs (seeded). A run's
    own SD includes its real swings, so this is the pass rate at a noise at least as large as the batch's."""
    rng = np.random.default_rng(0)
    rho = min(max(autocorrelation, -0.9), 0.9)
    met = {"band_share": 0, "mean_interval_in_band": 0, "ema_band_share": 0}
    for _ in range(trials):
        noise = rng.normal(0.0, sd, total_steps)
        for i in range(1, total_steps):
            noise[i] = rho * noise[i - 1] + math.sqrt(1 - rho * rho) * noise[i]
        got = criteria(dict(enumerate((target + noise).tolist())), target, total_steps, decay)
        met["band_share"] += got["band_share"] >= SHARE
        met["mean_interval_in_band"] += got["mean_interval_in_band"]
        met["ema_band_share"] += got["ema_band_share"] >= SHARE
    return {key: count / trials for key, count in met.items()}


def figures(records: list[dict[str, Any]], target: float, total_steps: int, decay: float = 0.8) -> dict[str, Any]:
    """Entropy figures of one algorithm's run; the second half is steps total_steps // 2 onwards."""
    values = {r["step"]: r[KEY] for r in records if finite(r.get(KEY))}
    second = [v for s, v in values.items() if s >= total_steps // 2]
    first = values.get(0)
    judged = criteria(values, target, total_steps, decay)
    sd = statistics.stdev(second) if len(second) > 1 else None  # a single step's noise
    return {
        "steps": len(records),
        "first": first,
        "second_half_steps": len(second),
        "second_half_mean": sum(second) / len(second) if second else None,
        "second_half_within_30pct": judged["band_share"],
        "second_half_mean_interval": judged["mean_interval"],
        "second_half_mean_interval_in_band": judged["mean_interval_in_band"],
        "second_half_ema_within_30pct": judged["ema_band_share"],
        "second_half_sd": sd,
        "second_half_lag1": lag1(second),
        "second_half_range": [min(second), max(second)] if second else None,
        "perfect_controller_pass_rate": perfect_controller(sd, lag1(second) or 0.0, target, total_steps, decay)
        if sd
        else None,
        "trained_on_nothing": [r["step"] for r in records if not r.get("data/kept_trajectories")],
        "gate_off": [r["step"] for r in records if r.get("stare/gate_on") == 0.0],
        **raising_region(records),
    }


def raising_region(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the steps that trained: the share of positive-advantage action tokens with Phi < 0 (where pushing a
    token up raises the entropy: `quadrant/pos_high` of pos_high + pos_low), the same share of the
    negative-advantage tokens (`quadrant/neg_high`) and the second share over the first (with 0/1 rewards a
    trained group's positive-advantage tokens are its successful trajectories', the negative ones its failed
    trajectories'), the mean share of STARE's L+ there (`stare/lplus_negative_phi`, logged for every algorithm)
    and the steps whose L+ held such a token."""
    trained = [r for r in records if r.get("data/kept_trajectories")]
    high = sum(r.get("quadrant/pos_high", 0) for r in trained)
    low = sum(r.get("quadrant/pos_low", 0) for r in trained)
    negative_high = sum(r.get("quadrant/neg_high", 0) for r in trained)
    negative_low = sum(r.get("quadrant/neg_low", 0) for r in trained)
    positive = high / (high + low) if high + low else None
    negative = negative_high / (negative_high + negative_low) if negative_high + negative_low else None
    ratio = negative / positive if positive and negative is not None else None
    lplus = [r["stare/lplus_negative_phi"] for r in trained if isinstance(r.get("stare/lplus_negative_phi"), float)]
    return {
        "positive_tokens_phi_negative": positive,
        "negative_tokens_phi_negative": negative,
        "phi_negative_failed_over_successful": ratio,
        "lplus_phi_negative_mean": sum(lplus) / len(lplus) if lplus else None,
        "steps_lplus_phi_negative": sum(1 for v in lplus if v > 0),
    }


def per_task(data: dict[str, Any] | None, key: str) -> dict[str, float] | None:
    """The final model's held-out score per task (progress.json), or None before it was evaluated."""
    if data is None:
        return None
    return data.get("evaluations", {}).get(key, {}).get("per_task")


def pass_at(folder: Path, k: int) -> dict[str, float] | None:
    """pass@k per problem of the evaluation in `folder` (samples.jsonl, or samples.jsonl.gz as archived in
    benchmarks/logs; failed samples count as wrong), or None when there is none."""
    samples = folder / "samples.jsonl"
    if samples.exists():
        records, unread = read_lines(samples)
    elif (packed := folder / "samples.jsonl.gz").exists():
        from stare_agents.rollout_log import gunzip

        samples = packed
        data, fault = gunzip(packed.read_bytes())  # a damaged archive: the lines before the fault, and why
        if fault:
            print(f"{packed}: {fault}; pass@{k} from the samples before it")
        records, unread = parse_lines(data, packed)
    else:
        return None
    report_unread(unread, None, f"lines of {samples}")
    outcomes = outcomes_from_samples(r for _, r in records if isinstance(r, dict))
    return {o.problem_id: pass_at_k(o.samples, o.correct, k) for o in outcomes if o.samples >= k}


def difference(after: dict[str, float] | None, before: dict[str, float] | None) -> dict[str, Any] | None:
    if not after or not before:
        return None
    got = paired_difference(after, before)
    return {"value": got.value, "ci_low": got.ci_low, "ci_high": got.ci_high, "problems": got.problems}


def progress(folder: Path) -> dict[str, Any] | None:
    """The run folder's progress.json (accuracies and per-task evaluations), or None before it was written."""
    path = folder / "progress.json"
    return json.loads(path.read_text()) if path.exists() else None


def precision(folder: Path) -> str:
    """The learner's precision the run folder's config.yaml names ("RL bf16"), for the plot's title."""
    path = folder / "config.yaml"
    if not path.exists():
        return "precision unknown"
    config = yaml.safe_load(path.read_text()) or {}
    return f"RL {config.get('rl', {}).get('learner', {}).get('precision', 'precision unknown')}"


def same_start(run: Path, state: dict[str, Any] | None, other: Path, other_state: dict[str, Any] | None) -> None:
    """Print whether `run` and the folder it is judged `--against` scored the same SFT model: the held-out tasks
    their SFT scores differ on (none: the same model as far as the evaluation can tell)."""
    mine, theirs = per_task(state, "sft"), per_task(other_state, "sft")
    if not mine or not theirs:
        print(f"{run} against {other}: the SFT scores of both are needed to check they started from one model "
              f"({'neither' if not mine and not theirs else 'only ' + str(run if mine else other)} has them)")
        return
    shared = sorted(set(mine) & set(theirs))
    differ = [task for task in shared if mine[task] != theirs[task]]
    print(f"{run} against {other}: SFT held-out scores differ on {len(differ)} of {len(shared)} tasks "
          f"({sum(mine[t] for t in shared) / len(shared):.3f} vs {sum(theirs[t] for t in shared) / len(shared):.3f})"
          if shared else f"{run} against {other}: no held-out task scored by both SFT models")


def recipe(folder: Path) -> str:
    """The recipe name the run folder's config.yaml carries, for the plot's title."""
    path = folder / "config.yaml"
    config = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    return str(config.get("name", "recipe unknown"))


def accuracy(data: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if data is None:
        return None
    return {point: data.get("accuracy", {}).get(point) for point in ("sft", key)}


def print_criterion_one(got: dict[str, Any], target: float) -> None:
    """Criterion (1) as issue 47 judges it (the second-half mean's interval inside the band), beside the registered
    band share it replaces and the moving average's band share, each with a perfect controller's pass rate at
    this run's noise."""
    low, high = (1 - BAND) * target, (1 + BAND) * target
    perfect = got["perfect_controller_pass_rate"] or {}

    def rate(key: str) -> str:
        return f"{perfect[key]:.0%}" if key in perfect else "not estimated"

    interval = got["second_half_mean_interval"]
    lag = got["second_half_lag1"]
    noise = f"SD {got['second_half_sd']:.3f}, lag-1 {lag:+.2f}" if got["second_half_sd"] and lag is not None else "?"
    if interval is None:
        print("    pass line (1): the second half has under two blocks of steps: not judged")
    else:
        print(f"    pass line (1): second-half mean {interval['mean']:.3f} [{interval['ci_low']:.3f}, "
              f"{interval['ci_high']:.3f}] ({interval['blocks']} blocks of {BLOCK} steps) inside the band "
              f"{low:.2f}-{high:.2f}: {'met' if got['second_half_mean_interval_in_band'] else 'not met'}; a perfect "
              f"controller at this run's step noise ({noise}) meets it in {rate('mean_interval_in_band')}")
    share, smoothed = got["second_half_within_30pct"], got["second_half_ema_within_30pct"]
    print(f"    band share (the registered criterion it replaces): {share:.2f} of second-half steps in the band: "
          f"{'met' if share >= SHARE else 'not met'} (>= {SHARE:.2f}; a perfect controller: {rate('band_share')}); "
          f"moving average in the band: {smoothed:.2f} ({'met' if smoothed >= SHARE else 'not met'}; a perfect "
          f"controller: {rate('ema_band_share')})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (train --compare grpo-ds)")
    parser.add_argument("--compare", default="grpo-ds", help="the compared algorithm's sub-folder")
    parser.add_argument("--target", type=float, default=0.3, help="STARE's target entropy (the recipe's)")
    parser.add_argument("--steps", type=int, default=64, help="RL steps of each run (the second half starts at half)")
    parser.add_argument("--plot", type=Path, help="write the entropy-by-step plot here (PNG)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--k", type=int, default=8, help="pass@k of criterion (4), from <folder>/pass8")
    parser.add_argument("--window", type=int, default=16, help="steps per window of the training reward by task kind")
    parser.add_argument("--ema-decay", type=float, default=0.8, help="rl.stare.ema_decay of the gate-input reading")
    parser.add_argument("--against", nargs="+", type=Path,
                        help="for each run folder, in order: the folder whose compared algorithm (its sub-folder and "
                             "progress.json) stands in for a run that has none")
    args = parser.parse_args()
    if args.against is not None and len(args.against) != len(args.runs):
        parser.error(f"--against needs one folder per run folder: {len(args.runs)} runs, {len(args.against)} given")
    against = dict(zip(args.runs, args.against, strict=True)) if args.against else {}

    out: dict[str, Any] = {}
    curves: list[tuple[str, list[dict[str, Any]]]] = []
    precisions: set[str] = set()
    recipes: set[str] = set()
    drawn: set[Path] = set()
    for run in args.runs:
        precisions.add(precision(run))
        recipes.add(recipe(run))
        state = progress(run)  # read once: the accuracies of both algorithms and their per-task scores
        other = against.get(run, run)  # where the compared algorithm's run lies
        other_state = progress(other) if other != run else state
        if other != run:
            same_start(run, state, other, other_state)
        arms = (("stare", run, "rl", state), (args.compare, other / args.compare, f"rl-{args.compare}", other_state))
        for name, folder, key, arm_state in arms:
            metrics = folder / "metrics.jsonl"
            if not metrics.exists():
                print(f"{run} {name}: not started" + (f" (looked in {folder})" if other != run else ""))
                continue
            records = rl_records(metrics)
            got = figures(records, args.target, args.steps, args.ema_decay)
            if name != "stare":  # GRPO-ds logs stare/gate_on 0 at every step: it has no gate to be off
                del got["gate_off"]
            got["gate_inputs"] = gate_inputs(records, args.target, args.ema_decay)
            got.update(rollout_figures(folder, args.window))
            got["accuracy"] = accuracy(arm_state, key)
            got["accuracy_by_kind"] = {point: by_kind(per_task(arm_state, point)) for point in ("sft", key)}
            got["accuracy_by_level"] = {
                point: by_kind(per_task(arm_state, point), task_level) for point in ("sft", key)
            }
            out[f"{run.name}/{name}"] = got
            if folder not in drawn:  # a GRPO-ds run judged --against by several runs is drawn once
                drawn.add(folder)
                curves.append((f"{(run if folder == run else folder.parent).name} {name}", records))
            line = ", ".join(
                f"{k} {v}"
                for k, v in got.items()
                if k not in ("trained_on_nothing", "gate_off", "gate_inputs", "entropy_by_group", "lplus",
                             "reward_by_kind", "accuracy_by_kind", "accuracy_by_level", "second_half_mean_interval",
                             "perfect_controller_pass_rate")
            )
            source = f" (from {other})" if folder != run and other != run else ""
            print(f"{run} {name}{source}: {line}")
            gate = f"; gate off at {got['gate_off']}" if "gate_off" in got else ""
            print(f"    trained on nothing at {got['trained_on_nothing']}{gate}")
            read = got["gate_inputs"]
            if read["gate_input_steps"]:
                print(f"    gate inputs over the {read['gate_input_steps']} steps that trained (this run's log): "
                      f"trained batch {read['trained_entropy_mean']:.3f} vs all sampled "
                      f"{read['all_entropy_mean_same_steps']:.3f}; below the target {args.target}: trained "
                      f"{read['gate_on_reading_trained']}, all {read['gate_on_reading_all']}, ema "
                      f"{read['gate_on_reading_ema']}; trained and all disagree at {read['trained_and_all_disagree']}")
            if got["entropy_by_group"]:
                kinds = "; ".join(
                    f"{kind} {g['entropy']:.3f} ({g['token_share']:.0%} of the tokens)"
                    for kind, g in got["entropy_by_group"].items()
                )
                print(f"    sampler entropy by group over the saved rollouts: {kinds}")
            if got["lplus"]:
                lp = got["lplus"]
                print(f"    L+ tokens saved: {lp['tokens']}, median surprisal {lp['median_surprisal']:.3f} against a median "
                      f"entropy at their positions of {lp['median_entropy']:.3f}; surprisal above that entropy: "
                      f"{lp['surprisal_above_entropy']:.1%}")
            for point, kinds in got["accuracy_by_kind"].items():
                if kinds:
                    print(f"    held-out accuracy by kind ({point}): "
                          + ", ".join(f"{k} {v['mean']:.2f} ({v['tasks']})" for k, v in kinds.items()))
            for point, levels in got["accuracy_by_level"].items():
                if set(levels) - {"no level"}:
                    print(f"    held-out accuracy by level ({point}): "
                          + ", ".join(f"{k} {v['mean']:.2f} ({v['tasks']})" for k, v in levels.items()))
            for kind, windows in got["reward_by_kind"].items():
                print(f"    training reward of {kind} by steps: "
                      + ", ".join(f"{w['steps']} {w['mean']:.2f} ({w['trajectories']})" for w in windows))
            if got["steps"] >= args.steps and got["second_half_mean"] is not None:
                if name == "stare":
                    print_criterion_one(got, args.target)
                elif got["first"] is not None:
                    half = got["second_half_mean"] < got["first"] / 2
                    print(f"    pass line (2): second-half mean {got['second_half_mean']:.3f} vs half of step 0 "
                          f"{got['first'] / 2:.3f}: {'met' if half else 'not met'}")
        scored = {"stare": per_task(state, "rl"), "compare": per_task(other_state, f"rl-{args.compare}")}
        passed = {name: pass_at(folder / "pass8", args.k) for name, folder in (("stare", run), ("compare", other / args.compare))}
        pair = {"accuracy": difference(scored["stare"], scored["compare"]),
                f"pass@{args.k}": difference(passed["stare"], passed["compare"])}
        out[f"{run.name}/stare-minus-{args.compare}"] = pair
        for number, (figure, bar) in enumerate(((("accuracy"), -0.03), (f"pass@{args.k}", 0.0)), start=3):
            got = pair[figure]
            if got is None:
                print(f"{run} criterion ({number}) not judged yet: it needs the held-out {figure} of both final models")
                continue
            print(f"{run} pass line ({number}): STARE - {args.compare} {figure} {got['value']:+.3f} "
                  f"[{got['ci_low']:+.3f}, {got['ci_high']:+.3f}] over {got['problems']} tasks: "
                  f"{'met' if got['value'] >= bar else 'not met'} (>= {bar:+.2f})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, allow_nan=False))
    if args.plot and curves:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 4.5))
        low, high = 0.7 * args.target, 1.3 * args.target
        ax.axhspan(low, high, color="tab:green", alpha=0.12, label=f"STARE's band ({low:.2f}-{high:.2f})")
        ax.axhline(args.target, color="tab:green", lw=0.8)
        ax.axvspan(args.steps // 2, args.steps - 1, color="grey", alpha=0.07, label="second half (judged)")
        for label, records in curves:
            points = [(r["step"], r[KEY]) for r in records if finite(r.get(KEY))]
            ax.plot([s for s, _ in points], [v for _, v in points], marker=".", lw=1.2,
                    ls="-" if " stare" in label else "--", label=label)
        ax.set_xlabel("RL step")
        ax.set_ylabel("entropy over all sampled action tokens (nats)")
        ax.set_xlim(0, args.steps - 1)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, loc="upper right")
        ax.set_title(f"STARE beside GRPO-ds: entropy by step ({', '.join(sorted(precisions))}, SmolLM2-135M)\n"
                     f"recipes: {', '.join(sorted(recipes))}", fontsize=10)
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot} ({len(curves)} curves)")


if __name__ == "__main__":
    main()
