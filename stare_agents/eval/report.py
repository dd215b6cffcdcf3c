"""What an evaluation writes, and how runs are read back and compared.

An evaluation folder holds:

    samples.jsonl     one line per sample (`SAMPLE_KEYS`), appended as samples finish; the source of truth
    results.json      per benchmark: avg@k, pass@k (both with bootstrap intervals), strict variants, counts,
                      error rate, behaviour summary, grade reasons; the settings; the model's identity
    results.md        the same as a table
    pass_at_k.png     pass@k against k, one line per benchmark

`results.json` is always recomputed from `samples.jsonl` (`build_results`), so the two agree.
`compare_runs([dir1, dir2, ...])` reads several folders' results.json, returns a rich table side by side
and writes a bar chart.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stare_agents.eval.behavior import ResponseStats, response_stats, summarize_responses
from stare_agents.eval.metrics import BenchmarkMetrics, benchmark_metrics, outcomes_from_samples
from stare_agents.jsonl import Unread, dumps, dumps_line, read_lines, report_unread
from stare_agents.stats import Estimate
from stare_agents.trajectory import Trajectory

RESULTS_FORMAT = "stare-agents-eval/1"
SAMPLES_FILE = "samples.jsonl"
RESULTS_FILE = "results.json"
RESULTS_MD = "results.md"
PASS_AT_K_PLOT = "pass_at_k.png"

# The keys of one samples.jsonl line.
SAMPLE_KEYS: tuple[str, ...] = (
    "benchmark",
    "problem_id",
    "sample_index",
    "seed",
    "correct",
    "reward",
    "failed",
    "error",
    "stop_reason",
    "extracted",
    "grade_reason",
    "answer",
    "num_turns",
    "prompt_tokens",
    "response_tokens",
    "weight_version",
    "text",
    "turns",
    "stats",
)
# and, on lines written since token-level samples (optional: older files have none), the episode's token ids,
# action mask and rollout log-probs, as a saved RL rollout has them (`stare_agents.rollout_log`)
SAMPLE_TOKENS = "tokens"
TOKEN_FIELDS: tuple[str, ...] = ("prompt_ids", "response_ids", "action_mask", "rollout_logprobs")


# -- samples ----------------------------------------------------------------------------------------------------
def trajectory_text(trajectory: Trajectory) -> str:
    """The whole episode after the prompt as text: each policy turn followed by what was inserted after it."""
    return "".join(turn.text + turn.observation for turn in trajectory.turns)


def sample_record(
    *,
    benchmark: str,
    problem_id: str,
    answer: str,
    sample_index: int,
    seed: int | None,
    trajectory: Trajectory,
) -> dict[str, Any]:
    """The samples.jsonl line of one sample. A failed sample is never marked correct."""
    info = trajectory.info
    record = {
        "benchmark": benchmark,
        "problem_id": problem_id,
        "sample_index": sample_index,
        "seed": seed,
        "correct": bool(trajectory.correct) and not trajectory.failed,
        "reward": float(trajectory.reward),
        "failed": trajectory.failed,
        "error": trajectory.error,
        "stop_reason": trajectory.stop_reason,
        "extracted": info.get("extracted"),
        "grade_reason": info.get("grade_reason"),
        "answer": answer,
        "num_turns": trajectory.num_turns,
        "prompt_tokens": len(trajectory.prompt_ids),
        "response_tokens": len(trajectory.response_ids),
        "weight_version": trajectory.weight_version,
        "text": trajectory_text(trajectory),
        "turns": [asdict(turn) for turn in trajectory.turns],
        "stats": response_stats(trajectory).to_dict(),
        SAMPLE_TOKENS: {
            "prompt_ids": list(trajectory.prompt_ids),
            "response_ids": list(trajectory.response_ids),
            "action_mask": list(trajectory.action_mask),
            "rollout_logprobs": [round(float(x), 5) for x in trajectory.rollout_logprobs],
        },
    }
    assert tuple(record)[: len(SAMPLE_KEYS)] == SAMPLE_KEYS
    return record


def sample_key(record: Mapping[str, Any]) -> tuple[str, str, int]:
    return (str(record["benchmark"]), str(record["problem_id"]), int(record["sample_index"]))


def read_samples(path: str | Path, *, unread: list[Unread] | None = None) -> list[dict[str, Any]]:
    """The sample records of a samples.jsonl (lines split at "\\n" only). A torn last line (a killed writer)
    is skipped and reported (into `unread` when given, else as a warning); a bad line elsewhere, a record
    without the sample keys, or the same sample twice is an error."""
    path = Path(path)
    if not path.exists():
        return []
    values, problems = read_lines(path)
    for problem in problems:
        if not problem.torn:
            raise ValueError(f"{problem}: not a JSON sample record; the file is damaged")
    report_unread(problems, unread, "sample lines")
    records: list[dict[str, Any]] = []
    seen: set[tuple[str, str, int]] = set()
    for number, record in values:
        missing = (
            [key for key in SAMPLE_KEYS if key not in record] if isinstance(record, dict) else SAMPLE_KEYS
        )
        if missing:
            raise ValueError(f"{path}:{number}: not a sample record (missing {list(missing)})")
        key = sample_key(record)
        if key in seen:
            raise ValueError(f"{path}:{number}: sample {key} appears twice; the file is damaged")
        seen.add(key)
        records.append(record)
    return records


def drop_torn_tail(path: str | Path) -> int:
    """Cut a partial last line (no trailing newline) off `path` so appends start on a fresh line.

    Returns the number of bytes removed."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "rb+") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if size == 0:
            return 0
        position = size
        block = 65536
        while position > 0:  # find the last b"\n"
            start = max(0, position - block)
            handle.seek(start)
            chunk = handle.read(position - start)
            index = chunk.rfind(b"\n")
            if index >= 0:
                keep = start + index + 1
                break
            position = start
        else:
            keep = 0
        handle.truncate(keep)
        return size - keep


def append_samples(path: str | Path, records: Iterable[Mapping[str, Any]]) -> int:
    """Append records as JSON lines (`dumps_line`: no NaN, no raw line separator), flushed and fsynced (a
    killed run keeps everything written)."""
    count = 0
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(dumps_line(record) + "\n")
            count += 1
        handle.flush()
        os.fsync(handle.fileno())
    return count


# -- model identity ---------------------------------------------------------------------------------------------
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def model_identity(model: str | Path) -> dict[str, Any]:
    """Who was evaluated: the model folder, a hash of its config, its weight files (size, mtime and the
    sha256 of the whole file) and a fingerprint over all of that. A name that is not a folder (a hub
    id) is recorded as given, without a fingerprint."""
    from stare_agents.models import file_sha256

    path = Path(model).expanduser()
    if not path.is_dir():
        return {"path": str(model), "name": str(model), "fingerprint": None}
    path = path.resolve()
    config = path / "config.json"
    config_sha = hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None
    weights = []
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES):
        stat = file.stat()
        weights.append(
            {
                "file": str(file.relative_to(path)),
                "bytes": stat.st_size,
                "mtime": datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat(),
                "sha256": file_sha256(file),  # the whole file (cached by size and mtime)
            }
        )
    fingerprint = hashlib.sha256(
        json.dumps(
            {"config": config_sha, "weights": [(w["file"], w["bytes"], w["sha256"]) for w in weights]}
        ).encode()
    ).hexdigest()[:16]
    return {
        "path": str(path),
        "name": path.name,
        "config_sha256": config_sha,
        "weights": weights,
        "fingerprint": fingerprint,
    }


# -- results ----------------------------------------------------------------------------------------------------
def build_results(
    records: Sequence[Mapping[str, Any]],
    *,
    benchmarks: Mapping[str, Mapping[str, Any]],
    settings: Mapping[str, Any],
    model: Mapping[str, Any],
    bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    timing: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The results.json content, computed from sample records only.

    benchmarks: name -> {"source", "problems", "samples_per_problem"} as planned; a benchmark whose planned
    samples are not all in `records` is marked incomplete (its figures cover what is there).
    """
    by_benchmark: dict[str, list[Mapping[str, Any]]] = {name: [] for name in benchmarks}
    for record in records:
        if record["benchmark"] not in by_benchmark:
            raise ValueError(
                f"sample of benchmark {record['benchmark']!r} but the run plans only {sorted(benchmarks)}"
            )
        by_benchmark[record["benchmark"]].append(record)
    results: dict[str, Any] = {}
    for name, plan in benchmarks.items():
        rows = by_benchmark[name]
        planned = int(plan["problems"]) * int(plan["samples_per_problem"])
        entry: dict[str, Any] = {
            "source": plan.get("source"),
            "problems_planned": int(plan["problems"]),
            "samples_planned": planned,
            "samples_done": len(rows),
            "complete": len(rows) == planned,
        }
        if rows:
            metrics = benchmark_metrics(
                outcomes_from_samples(rows), bootstrap=bootstrap, confidence=confidence, seed=seed
            )
            entry["metrics"] = metrics.to_dict()
            entry["behavior"] = summarize_responses(ResponseStats.from_dict(r["stats"]) for r in rows)
            entry["grade_reasons"] = dict(sorted(Counter(str(r["grade_reason"]) for r in rows).items()))
            entry["stop_reasons"] = dict(sorted(Counter(r["stop_reason"] for r in rows).items()))
            errors = Counter(str(r["error"]) for r in rows if r["failed"])
            entry["errors"] = dict(errors.most_common(10))
        results[name] = entry
    return {
        "format": RESULTS_FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "complete": all(entry["complete"] for entry in results.values()),
        "model": dict(model),
        "settings": dict(settings),
        "timing": dict(timing or {}),
        "benchmarks": results,
    }


def load_results(folder: str | Path) -> dict[str, Any]:
    """Read `folder/results.json` (checked for the format this version writes)."""
    path = Path(folder) / RESULTS_FILE if Path(folder).is_dir() else Path(folder)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: pass an evaluation output folder (stare-agents eval --out)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"{path} is not a stare-agents evaluation result (format {found!r}, expected {RESULTS_FORMAT!r})"
        )
    return data


def metrics_of(entry: Mapping[str, Any]) -> BenchmarkMetrics | None:
    return BenchmarkMetrics.from_dict(entry["metrics"]) if "metrics" in entry else None


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def results_markdown(results: Mapping[str, Any]) -> str:
    """results.md: one row per benchmark, then the settings and the model."""
    settings = results["settings"]
    model = results["model"]
    lines = [
        f"# Evaluation: {model.get('name')} ({settings.get('protocol', {}).get('name', '?')})",
        "",
        "Accuracy in percent with 95% bootstrap intervals over problems; avg@n and pass@k over successful "
        "samples, `strict` counts failed samples as wrong.",
        "",
        "| benchmark | problems | avg@n | pass@1 | pass@k (largest k) | strict avg@n | error rate | "
        "tool calls / response | tokens / response | complete |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, entry in results["benchmarks"].items():
        metrics = metrics_of(entry)
        if metrics is None:
            lines.append(f"| {name} | {entry['problems_planned']} | — | — | — | — | — | — | — | no samples |")
            continue
        top = max(metrics.pass_at)

        def cell(e: Estimate, metrics: BenchmarkMetrics = metrics) -> str:
            # say so when a figure covers fewer problems (failed samples, fewer than k successful)
            partial = f" ({e.problems}/{metrics.problems} problems)" if e.problems < metrics.problems else ""
            return e.format() + partial

        behavior = entry["behavior"]
        calls = behavior["tool_calls_per_response"]
        tokens = behavior["response_tokens_mean"]
        done = "yes" if entry["complete"] else f"{entry['samples_done']}/{entry['samples_planned']}"
        lines.append(
            f"| {name} | {metrics.problems} | avg@{metrics.samples_per_problem} {cell(metrics.avg)} | "
            f"{cell(metrics.pass_at[1])} | pass@{top} {cell(metrics.pass_at[top])} | "
            f"{cell(metrics.avg_strict)} | {_pct(metrics.error_rate)}% ({metrics.failed}/{metrics.samples}) | "
            f"{'—' if calls is None else f'{calls:.2f}'} | {'—' if tokens is None else f'{tokens:.0f}'} | "
            f"{done} |"
        )
    rerun = results.get("timing", {}).get("samples_regraded_rerun")
    if rerun:  # resumed records that did not grade as they said (stare_agents.eval.harness.regrade_resumed)
        lines += [
            "",
            f"Resumed: {rerun} sample(s) did not grade again as their records said and were sampled again "
            "(the records are in samples.rejected.jsonl, with why).",
        ]
    lines += ["", "## Settings", "", "```json", dumps(settings, indent=2, default=str), "```", ""]
    lines += [
        "## Model",
        "",
        f"- path: `{model.get('path')}`",
        f"- fingerprint: `{model.get('fingerprint')}`",
        "",
    ]
    return "\n".join(lines)


def plot_pass_at_k(results: Mapping[str, Any], path: str | Path) -> Path | None:
    """pass@k against k (log2 axis), one line per benchmark with its bootstrap band. None when nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    plotted = False
    for name, entry in results["benchmarks"].items():
        metrics = metrics_of(entry)
        if metrics is None:
            continue
        points = [(k, e) for k, e in sorted(metrics.pass_at.items()) if e.value is not None]
        if not points:
            continue
        ks = [k for k, _ in points]
        ax.plot(ks, [100 * e.value for _, e in points], marker="o", label=name)
        if all(e.ci_low is not None for _, e in points):
            ax.fill_between(
                ks, [100 * e.ci_low for _, e in points], [100 * e.ci_high for _, e in points], alpha=0.15
            )
        plotted = True
    if not plotted:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("pass@k (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"pass@k: {results['model'].get('name')}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def write_results(folder: str | Path, results: Mapping[str, Any]) -> dict[str, Path]:
    """Write results.json, results.md and pass_at_k.png into `folder` (results.json last, atomically)."""
    folder = Path(folder)
    written = {"results.md": folder / RESULTS_MD}
    (folder / RESULTS_MD).write_text(results_markdown(results), encoding="utf-8")
    plot = plot_pass_at_k(results, folder / PASS_AT_K_PLOT)
    if plot is not None:
        written["pass_at_k.png"] = plot
    tmp = folder / (RESULTS_FILE + ".tmp")
    tmp.write_text(dumps(results, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    tmp.replace(folder / RESULTS_FILE)
    written["results.json"] = folder / RESULTS_FILE
    return written


# -- comparison -------------------------------------------------------------------------------------------------
def _labels(folders: Sequence[Path]) -> list[str]:
    labels = [folder.name or str(folder) for folder in folders]
    if len(set(labels)) < len(labels):
        labels = [str(folder) for folder in folders]
    return labels


COMPARED_SETTINGS = (
    "protocol.name",
    "protocol.temperature",
    "protocol.top_p",
    "protocol.max_turns",
    "samples",
)


def _setting(settings: Mapping[str, Any], dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def compare_runs(
    folders: Sequence[str | Path], *, metric: str = "avg", out: str | Path | None = "comparison.png"
) -> tuple[Any, dict[str, Any]]:
    """Runs side by side: a rich Table (one row per benchmark, one column per run) and a grouped bar chart
    of `metric` ("avg" for avg@n, "pass@K", or "strict" for strict avg@n) written to `out`.

    Returns (table, data) where data maps run label -> benchmark -> Estimate as a dict."""
    from rich.table import Table

    from stare_agents.viewer.text import marked

    if len(folders) < 1:
        raise ValueError("compare needs at least one evaluation folder")
    paths = [Path(f) for f in folders]
    runs = [load_results(p) for p in paths]
    for run in runs:  # names as text can show them: invisible characters and lone surrogates as chips
        run["benchmarks"] = {marked(str(name)): entry for name, entry in run["benchmarks"].items()}
        run["model"] = {**run["model"], "name": marked(str(run["model"].get("name")))}
    labels = [marked(label) for label in _labels(paths)]
    names: list[str] = []
    for run in runs:
        names += [n for n in run["benchmarks"] if n not in names]

    def pick(entry: Mapping[str, Any] | None) -> tuple[Estimate | None, str]:
        metrics = metrics_of(entry) if entry else None
        if metrics is None:
            return None, ""
        if metric == "avg":
            return metrics.avg, f"avg@{metrics.samples_per_problem}"
        if metric == "strict":
            return metrics.avg_strict, f"strict avg@{metrics.samples_per_problem}"
        if metric.startswith("pass@"):
            try:
                k = int(metric[5:])
            except ValueError:
                raise ValueError(f"metric must be 'avg', 'strict' or 'pass@K', got {metric!r}") from None
            return metrics.pass_at.get(k), metric
        raise ValueError(f"metric must be 'avg', 'strict' or 'pass@K', got {metric!r}")

    table = Table(title=f"{metric} (%) with 95% bootstrap intervals", show_lines=False)
    table.add_column("benchmark")
    for label in labels:
        table.add_column(label, justify="right")
    for setting in ("model", *COMPARED_SETTINGS):
        if setting == "model":
            values = [str(run["model"].get("name")) for run in runs]
        else:
            values = [json.dumps(_setting(run["settings"], setting)) for run in runs]
        style = "bold yellow" if len(set(values)) > 1 else "dim"
        table.add_row(f"[{style}]{setting}[/]", *(f"[{style}]{v}[/]" for v in values))
    table.add_section()
    data: dict[str, Any] = {label: {} for label in labels}
    for name in names:
        cells = []
        for label, run in zip(labels, runs, strict=True):
            entry = run["benchmarks"].get(name)
            estimate, title = pick(entry)
            if estimate is None:
                cells.append("—")
                continue
            data[label][name] = asdict(estimate)
            extra = "" if entry["complete"] else " (incomplete)"
            error = f" err {_pct(entry['metrics']['error_rate'])}%" if entry["metrics"]["failed"] else ""
            cells.append(f"{title} {estimate.format()}{error}{extra}")
        table.add_row(name, *cells)
    if out is not None:
        _bar_chart(data, names, labels, metric, Path(out))
    return table, data


def _bar_chart(data: Mapping[str, Any], names: list[str], labels: list[str], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    width = 0.8 / max(1, len(labels))
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names) * max(1, len(labels)) * 0.6 + 2), 4.2))
    for i, label in enumerate(labels):
        values, low, high = [], [], []
        for name in names:
            e = data[label].get(name)
            v = e["value"] if e and e["value"] is not None else np.nan
            values.append(100 * v)
            lo = e["ci_low"] if e and e["ci_low"] is not None else None
            hi = e["ci_high"] if e and e["ci_high"] is not None else None
            low.append(0.0 if lo is None else 100 * (v - lo))
            high.append(0.0 if hi is None else 100 * (hi - v))
        ax.bar(
            x + (i - (len(labels) - 1) / 2) * width, values, width, yerr=[low, high], capsize=3, label=label
        )
    ax.set_xticks(x, names, rotation=20 if len(names) > 4 else 0)
    ax.set_ylabel(f"{metric} (%)")
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
