"""The algorithm demo: GRPO and STARE side by side on the near-criticality simulation."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from stare_agents.algo.simulation import SimulationConfig, SimulationResult, simulate
from stare_agents.jsonl import dumps


def _window_mean(values: list[float], start: int, stop: int) -> float:
    window = [v for v in values[start:stop] if v == v]  # drop NaN
    return sum(window) / len(window) if window else float("nan")


def plot_entropy(results: list[SimulationResult], target_entropy: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_h, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
    for result in results:
        ax_h.plot(result.entropy, label=result.config.algorithm.upper())
        window = 10
        smoothed = [
            sum(result.reward[max(0, i - window + 1) : i + 1]) / min(i + 1, window)
            for i in range(len(result.reward))
        ]
        ax_r.plot(smoothed, label=result.config.algorithm.upper())
    ax_h.axhline(target_entropy, color="gray", linestyle="--", label=f"target {target_entropy}")
    ax_h.set(xlabel="step", ylabel="mean policy entropy (nats)", title="Policy entropy")
    ax_r.set(xlabel="step", ylabel="mean reward (10-step moving average)", title="Reward")
    ax_h.legend()
    ax_r.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_demo(
    *, steps: int, target_entropy: float, w: float, top_ratio: float, seed: int, output_dir: Path
) -> list[SimulationResult]:
    console = Console()
    base = replace(
        SimulationConfig(), steps=steps, target_entropy=target_entropy, w=w, top_ratio=top_ratio, seed=seed
    )
    results = []
    with Progress(console=console, transient=True) as progress:
        for algorithm in ("grpo", "stare"):
            task = progress.add_task(f"training {algorithm.upper()}", total=None)
            results.append(simulate(replace(base, algorithm=algorithm)))
            progress.remove_task(task)

    table = Table(
        title=f"Entropy simulation: {steps} steps, target H = {target_entropy}, W = {w}, P = {top_ratio}"
    )
    for column in (
        "algorithm",
        "entropy start",
        "entropy end (last 20%)",
        "reward end",
        "gate on",
        "L+ with Phi<0",
    ):
        table.add_column(column)
    tail = max(1, steps // 5)
    for result in results:
        table.add_row(
            result.config.algorithm.upper(),
            f"{result.entropy[0]:.3f}",
            f"{_window_mean(result.entropy, steps - tail, steps):.3f}",
            f"{_window_mean(result.reward, steps - tail, steps):.3f}",
            f"{sum(result.gate_on)}/{steps}",
            f"{_window_mean(result.lplus_negative_phi, 0, len(result.lplus_negative_phi)):.0%}"
            if result.lplus_negative_phi
            else "-",
        )
    console.print(table)

    output_dir.mkdir(parents=True, exist_ok=True)
    plot_entropy(results, target_entropy, output_dir / "entropy.png")
    metrics = {r.config.algorithm: asdict(r) for r in results}
    (output_dir / "metrics.json").write_text(dumps(metrics, indent=1))
    console.print(f"wrote {output_dir / 'entropy.png'} and {output_dir / 'metrics.json'}")
    return results
