"""The W and M sweeps of issue 28 (item 2) as one figure, from the JSON files `bench_w_sweep.py --json` wrote:

    .venv/bin/python benchmarks/plot_sweeps.py benchmarks/logs/w-sweep.json benchmarks/logs/w-sweep-p0.2.json \\
        benchmarks/logs/m-sweep.json --out docs/entropy-sweeps.png

Left: STARE-O1 points (no gate, W fixed), the entropy change against W, one marker a seed and a line through
the mean of the seeds, one colour a P. Right: STARE-C2 points, the change against M, one colour a (P, W). The
change is the common-batch change where the sweep scored one (every point's final model and the start model on
one shared batch), else the fixed-batch change; the axis label says which. It reads only the JSON files, so a
clone reproduces the figure without the runs' models.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

FIGURES = ("common_batch_change", "fixed_batch_change")


def figure_of(points: list[dict[str, Any]]) -> str:
    """The figure to draw: the common-batch change when every point has it for some seed, else the fixed-batch
    change."""
    if points and all(any(s.get("common_batch_change") is not None for s in p["seeds"].values()) for p in points):
        return "common_batch_change"
    return "fixed_batch_change"


def load_points(paths: list[Path]) -> list[dict[str, Any]]:
    """Every point of the given sweep files. A file that is not a sweep's JSON is refused with its name."""
    points: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise SystemExit(f"{path}: not a readable JSON file ({error})") from None
        found = data.get("points") if isinstance(data, dict) else None
        if not isinstance(found, dict) or not found:
            raise SystemExit(f"{path}: no 'points' in it (the file `bench_w_sweep.py --json` writes)")
        for name, point in found.items():
            if not (isinstance(point, dict) and isinstance(point.get("seeds"), dict) and "w" in point and "p" in point):
                raise SystemExit(f"{path}: point {name!r} has no p, w and seeds")
            points.append(point)
    return points


def series(points: list[dict[str, Any]], figure: str, by: str) -> dict[tuple, dict[str, Any]]:
    """Per line (O1, by="w": keyed by P; C2, by="m": keyed by (P, W)): x, each seed's (x, value) and the mean
    at each x over the seeds that have the figure, in increasing x."""
    lines: dict[tuple, dict[str, Any]] = {}
    for point in points:
        if (by == "m") != ("m" in point):
            continue
        key = (point["p"],) if by == "w" else (point["p"], point["w"])
        x = point[by]
        values = [s[figure] for s in point["seeds"].values() if s.get(figure) is not None]
        line = lines.setdefault(key, {"seeds": [], "mean": {}})
        line["seeds"].extend((x, v) for v in values)
        if values:
            line["mean"][x] = sum(values) / len(values)
    for line in lines.values():
        line["mean"] = dict(sorted(line["mean"].items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="JSON files written by bench_w_sweep.py --json")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    points = load_points(args.sweeps)
    o1 = [p for p in points if "m" not in p]
    c2 = [p for p in points if "m" in p]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(o1, "w", "W (on L+)"), (c2, "m", "M (on L-)")]
    panels = [panel for panel in panels if panel[0]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (group, by, label) in zip(axes[0], panels, strict=True):
        figure = figure_of(group)
        steps = sorted({int(s.get("steps") or 0) for p in group for s in p["seeds"].values()})
        for key, line in sorted(series(group, figure, by).items()):
            name = f"P {key[0]:g}" + (f", W {key[1]:g}" if by == "m" else "")
            drawn = ax.plot(list(line["mean"]), list(line["mean"].values()), marker="o", label=f"{name}, mean")
            ax.scatter(*zip(*line["seeds"], strict=True), s=14, alpha=0.5, color=drawn[0].get_color(), label=f"{name}, a seed")
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel(label)
        what = "common batch" if figure == "common_batch_change" else "the point's own first batch"
        ax.set_ylabel(f"entropy change on {what}")
        kind = "STARE-O1, no gate" if by == "w" else "STARE-C2, no gate"
        ax.set_title(f"{kind}, {'/'.join(map(str, steps))} RL steps a point")
        ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out} ({len(o1)} O1 points, {len(c2)} C2 points)")


if __name__ == "__main__":
    main()
