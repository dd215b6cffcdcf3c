"""A finished run's figures: summary.json (held-out accuracy with intervals, the RL gain, entropy, mismatch,
benchmarks) and training.png, from the run folder's records.

    summary = write_summary(config, folder, progress, stage_seconds=..., wall_time_s=..., compare=None)
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from stare_agents.algo.importance import WARN_KL, WARN_OUTSIDE
from stare_agents.hardware import resolve_dtype, resolve_precision
from stare_agents.jsonl import dumps
from stare_agents.records import read_records
from stare_agents.stats import Estimate, estimate, paired_difference
from stare_agents.train.config import TrainConfig
from stare_agents.train.run_folder import EVALS_DIR


def write_summary(
    c: TrainConfig,
    folder: Path,
    progress: dict[str, Any],
    *,
    stage_seconds: dict[str, float],
    wall_time_s: float,
    compare: str | None = None,
) -> dict[str, Any]:
    """summary.json (and training.png) of the run in `folder`: each held-out accuracy with its 95% bootstrap
    interval, the RL gain over the SFT model (base without SFT) with a paired interval, and the entropy
    figures. `progress`: the run's progress.json (its evaluations and accuracies)."""
    records = read_records(folder / "metrics.jsonl", "rl")
    algorithm = c.algorithm()
    evaluations = progress.get("evaluations", {})
    targets = finite_values("stare/target_entropy", records)  # the gate's, as logged (absent without a gate)
    target = targets[-1] if targets else None
    figures = entropy_figures(records, target)
    final_eval = evaluations.get("rl", {})
    scores = {
        point: accuracy_estimate(e["per_task"], c.eval.bootstrap)
        for point, e in evaluations.items()
        if "per_task" in e  # a run folder written before per-task scores has accuracies only
    }
    start = "sft" if "sft" in evaluations else "base"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    summary: dict[str, Any] = {
        "name": c.name,
        "model": c.model.name,
        "environment": c.env.id,
        "algorithm": algorithm.name,
        "accuracy": dict(progress.get("accuracy", {})),
        "accuracy_ci": {point: [e.ci_low, e.ci_high] for point, e in scores.items()},
        "eval_tasks": {point: e.problems for point, e in scores.items()},
        "rl_gain": gain(evaluations, "rl", start, c.eval.bootstrap),
        "rl_steps": len(records),
        "entropy_target": target,
        "entropy_first": figures["learner_first"],
        "entropy_final": figures["learner_final"],
        "entropy": figures,
        "gate_on_fraction": figures["gate_on_fraction"],
        "precision": {
            "rollout_dtype": resolve_dtype(c.model.rollout_dtype, device),
            "learner": resolve_precision(c.rl.learner.precision, device),
            "fp32_lm_head": c.model.fp32_lm_head,
            "importance": dataclasses.asdict(c.rl.learner.importance),
        },
        "mismatch": mismatch_figures(records),
        "benchmarks": benchmark_figures(records),
        "tool_use": {
            key: final_eval.get(key)
            for key in ("tool_calls_per_response", "tool_error_rate", "turns_mean", "stop_reasons")
        },
        "sft_traces": progress.get("sft_traces"),
        "stage_seconds": {k: round(v, 1) for k, v in stage_seconds.items()},
        "wall_time_s": round(wall_time_s, 1),
    }
    if compare:
        other = entropy_figures(read_records(folder / compare / "metrics.jsonl", "rl"), target)
        summary["compare"] = {
            "algorithm": compare,
            "accuracy": progress.get("accuracy", {}).get(f"rl-{compare}"),
            "rl_gain": gain(evaluations, f"rl-{compare}", start, c.eval.bootstrap),
            # this run's algorithm minus the compared one, on the same held-out tasks
            "difference": gain(evaluations, "rl", f"rl-{compare}", c.eval.bootstrap),
            "entropy_final": other["learner_final"],
            "entropy": other,
            "benchmarks": benchmark_figures(read_records(folder / compare / "metrics.jsonl", "rl")),
        }
    (folder / "summary.json").write_text(dumps(summary, indent=2))
    plot_run(folder, summary, compare)
    return summary


def accuracy_estimate(per_task: dict[str, float], bootstrap: int) -> Estimate:
    """Held-out accuracy: the mean task score with a 95% percentile-bootstrap interval over tasks."""
    return estimate(list(per_task.values()), bootstrap=bootstrap)


def gain(evaluations: dict[str, Any], after: str, before: str, bootstrap: int) -> dict[str, Any] | None:
    if not all("per_task" in evaluations.get(point, {}) for point in (after, before)):
        return None
    gain = paired_difference(
        evaluations[after]["per_task"], evaluations[before]["per_task"], bootstrap=bootstrap
    )
    return {
        "of": f"{after} - {before}",
        "value": gain.value,
        "ci_low": gain.ci_low,
        "ci_high": gain.ci_high,
        "tasks": gain.problems,
    }


def mismatch_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The rollout/learner mismatch over an RL run: per figure its mean over the steps (the largest |log r|:
    its maximum), and the steps above the warning thresholds. Figures no step measured are left out."""
    out: dict[str, Any] = {}
    for name, key in (
        ("logprob_abs_diff_mean", "mismatch/logprob_abs_diff"),
        ("kl_mean", "mismatch/kl"),
        ("ratio_outside_mean", "mismatch/ratio_outside"),
        ("importance_capped_share_mean", "importance/capped_share"),
        ("importance_masked_share_mean", "importance/masked_share"),
    ):
        values = finite_values(key, records)
        if values:
            out[name] = sum(values) / len(values)
    largest = finite_values("mismatch/max_abs_log_ratio", records)
    if largest:
        out["max_abs_log_ratio_max"] = max(largest)
    measured = [r for r in records if _finite(r.get("mismatch/kl"))]
    if measured:
        out["steps_above_warning"] = sum(
            r["mismatch/kl"] > WARN_KL or r.get("mismatch/ratio_outside", 0.0) > WARN_OUTSIDE
            for r in measured
        )
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def finite_values(key: str, rows: list[dict[str, Any]]) -> list[float]:
    """The finite values of `key` over the records that have it."""
    return [float(r[key]) for r in rows if _finite(r.get(key))]


def benchmark_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """eval.benchmarks over an RL run, from its "rl" records: per benchmark, the figures of the last
    evaluation (`final`, after `steps` RL steps; its files in evals/step-NNNNNN/<name>/) and avg@k after
    each evaluated step (`avg_by_step`)."""
    out: dict[str, Any] = {}
    for record in records:
        steps = int(record["step"]) + 1
        for key, value in record.items():
            if not key.startswith("benchmark/") or key.count("/") != 2:
                continue
            _, name, figure = key.split("/")
            entry = out.setdefault(name, {"steps": None, "final": {}, "avg_by_step": {}})
            if entry["steps"] != steps:
                entry["steps"], entry["final"] = steps, {}
                entry["folder"] = f"{EVALS_DIR}/step-{steps:06d}/{name}"
            entry["final"][figure] = value
            if figure.startswith("avg@") and "_ci_" not in figure:
                entry["avg_by_step"][str(steps)] = value
    return out


def entropy_figures(records: list[dict[str, Any]], target: float | None) -> dict[str, Any]:
    """Entropy over an RL run: first/final/second-half means of the learner's entropy on the trained (kept)
    batch (what the gate sees), on every trajectory that ran, and the sampler's mean surprisal; with a target,
    the share of second-half steps whose entropy is within +-30% of it, for each of the three (None where the
    run did not measure it: no figure stands in for another)."""

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    second = records[len(records) // 2 :]
    out: dict[str, Any] = {}
    for name, key in (
        ("learner", "learner/entropy"),
        ("all", "learner/entropy_all"),
        ("sampler", "rollout/sampler_entropy"),
    ):
        values = finite_values(key, records)
        out[f"{name}_first"] = values[0] if values else None
        out[f"{name}_final"] = values[-1] if values else None
        out[f"{name}_second_half_mean"] = mean(finite_values(key, second))
    gate = finite_values("stare/gate_on", records)
    out["gate_on_fraction"] = mean(gate)
    out["gate_on_fraction_second_half"] = mean(finite_values("stare/gate_on", second))
    if target is not None:  # each entropy on its own: a figure that was not measured stays None
        for name, key in (
            ("learner", "learner/entropy"),
            ("all", "learner/entropy_all"),
            ("sampler", "rollout/sampler_entropy"),
        ):
            late = finite_values(key, second)
            out[f"{name}_second_half_within_30pct"] = (
                sum(abs(v - target) <= 0.3 * target for v in late) / len(late) if late else None
            )
    return out


def plot_run(folder: Path, summary: dict[str, Any], compare: str | None = None) -> Path:
    """training.png: entropy (learner on the trained batch and on every trajectory, sampler) against the
    target band, rollout reward, held-out accuracy with 95% intervals (SFT, during RL, final), the gate and W/M,
    and the trajectories each step trained on; one colour per algorithm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {summary["algorithm"]: (read_records(folder / "metrics.jsonl", "rl"), "rl")}
    if compare:
        curves[compare] = (read_records(folder / compare / "metrics.jsonl", "rl"), f"rl-{compare}")
    evaluations = read_records(folder / "metrics.jsonl", "eval")
    fig, axes = plt.subplots(2, 4, figsize=(22, 8.5))
    (ax_h, ax_r, ax_acc, ax_mis), (ax_gate, ax_w, ax_kept, ax_share) = axes
    target = summary.get("entropy_target")
    if target is not None:
        ax_h.axhspan(target * 0.7, target * 1.3, color="tab:green", alpha=0.12, label="target ±30%")
        ax_h.axhline(target, color="tab:green", linestyle="--", linewidth=1)
    start_point = "sft" if any(e.get("point") == "sft" for e in evaluations) else "base"
    start_eval = next((e for e in evaluations if e.get("point") == start_point), None)
    for (name, (records, point)), colour in zip(curves.items(), ("tab:blue", "tab:orange"), strict=False):
        steps = [r["step"] for r in records]

        def series(key: str, rows: list[dict[str, Any]] = records) -> list[float]:
            return [r.get(key) if isinstance(r.get(key), int | float) else float("nan") for r in rows]

        ax_h.plot(steps, series("learner/entropy_all"), color=colour, marker="o", ms=3, label=f"{name}: all")
        ax_h.plot(
            steps,
            series("learner/entropy"),
            color=colour,
            alpha=0.45,
            linestyle="--",
            label=f"{name}: trained batch (gate input)",
        )
        ax_h.plot(
            steps,
            series("rollout/sampler_entropy"),
            color=colour,
            linestyle=":",
            label=f"{name}: sampler (mean surprisal)",
        )
        ax_r.plot(steps, series("rollout/mean_reward"), color=colour, marker="o", ms=3, label=name)
        ax_gate.step(steps, series("stare/gate_on"), color=colour, where="mid", label=name)
        ax_w.plot(steps, series("stare/w"), color=colour, label=f"{name}: W")
        ax_w.plot(steps, series("stare/m"), color=colour, linestyle="--", label=f"{name}: M")
        ax_kept.plot(steps, series("data/kept_trajectories"), color=colour, marker="o", ms=3, label=name)
        ax_mis.plot(
            steps,
            series("mismatch/logprob_abs_diff"),
            color=colour,
            marker="o",
            ms=3,
            label=f"{name}: mean |log r|",
        )
        ax_mis.plot(steps, series("mismatch/kl"), color=colour, linestyle="--", label=f"{name}: KL (k3)")
        ax_share.plot(
            steps,
            series("mismatch/ratio_outside"),
            color=colour,
            marker="o",
            ms=3,
            label=f"{name}: r outside [0.9, 1.1]",
        )
        ax_share.plot(
            steps, series("importance/capped_share"), color=colour, linestyle="--", label=f"{name}: IS capped"
        )
        ax_share.plot(
            steps, series("importance/masked_share"), color=colour, linestyle=":", label=f"{name}: IS masked"
        )
        # held-out accuracy: the start point at step 0, evaluations during RL, the final one at the last step
        mid = [r for r in records if isinstance(r.get("eval/accuracy"), int | float)]
        final = next((e for e in evaluations if e.get("point") == point), None)
        xs, ys, lows, highs = [], [], [], []
        for x, row, key, low, high in [
            *([(0, start_eval, "accuracy", "ci_low", "ci_high")] if start_eval else []),
            *[
                (r["step"] + 1, r, "eval/accuracy", "eval/accuracy_ci_low", "eval/accuracy_ci_high")
                for r in mid
            ],
            *([(len(records), final, "accuracy", "ci_low", "ci_high")] if final else []),
        ]:
            xs.append(x)
            ys.append(row[key])
            lows.append(row[key] - row[low] if row.get(low) is not None else 0.0)
            highs.append(row[high] - row[key] if row.get(high) is not None else 0.0)
        if xs:
            ax_acc.errorbar(xs, ys, yerr=[lows, highs], color=colour, marker="o", capsize=3, label=name)
    ax_mis.axhline(WARN_KL, color="tab:red", linestyle=":", linewidth=1, label="KL warning")
    if any(v > 0 for v in _plotted(ax_mis)):
        ax_mis.set_yscale("log")
    titles = (
        "policy entropy (action tokens)",
        "rollout reward (training prompts)",
        "held-out accuracy (greedy, 95% CI)",
        "rollout/learner mismatch (action tokens)",
        "STARE gate on",
        "STARE W / M",
        "trajectories trained on (dynamic sampling)",
        "share of action tokens",
    )
    for ax, title in zip(axes.flat, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("RL step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    accuracy = summary.get("accuracy", {})
    fig.suptitle(
        f"{summary.get('model')} on {summary.get('environment')}: held-out accuracy "
        + ", ".join(f"{k} {v:.3f}" for k, v in accuracy.items() if isinstance(v, int | float))
    )
    fig.tight_layout()
    path = folder / "training.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plotted(ax: Any) -> list[float]:
    """Every finite y value drawn on `ax` (so a log scale is chosen only for data it can show)."""
    values = []
    for line in ax.get_lines():
        values.extend(float(v) for v in line.get_ydata() if isinstance(v, int | float) and math.isfinite(v))
    return values
