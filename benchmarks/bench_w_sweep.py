"""The near-critical weight on a real model (issue 28, item 2): STARE without its gate, short runs from one SFT
model at several W (and P), a few seeds each, and the entropy drift per RL step against W.

    .venv/bin/python benchmarks/bench_w_sweep.py --model runs/long-s0/sft_model --recipe smollm2-arith-long \\
        --w 1.0,1.1,1.25,1.5,2,3 --p 0.1 --seeds 0,1 --steps 6 --out runs/w-sweep --json runs/w-sweep.json

Each point is one `stare-agents train` run into OUT/p<P>-w<W>-s<seed>: the recipe's RL (its task mix, sampling,
learning rate) with `rl.algorithm=stare` (O1), `rl.stare.gated=false`, `rl.stare.adaptive=false`, the given W
and P, no SFT (the model is the SFT model given) and no held-out evaluation. A point already done is not run
again, and one cut short resumes from its checkpoint, so the sweep can be spread over sessions (`--report` only
reads what is there). A point done keeps its `final_model/`, metrics and rollouts, all the report reads; its
`checkpoints/` (model and optimizer state, only for resuming) are deleted unless `--keep-checkpoints`: kept, the
checkpoints of the W and M sweeps once filled this machine's disk to 95%.

The drift of a run is the least-squares slope of `learner/entropy_all` (the learner's entropy at the rollout
temperature over every sampled action token, measured before each step's update) against the step. The engine
is seeded, but vLLM on CPU does not sample the same tokens run to run: two points of one seed drew different
first batches (0.33 and 0.28 entropy, 4 and 8 trained trajectories), so points differ by their batches too.
Each step samples a new batch, so that slope carries the batches' own spread. A second figure has none: the
run's first batch (every trajectory sampled at step 0) scored by the final model and by the start model at the rollout temperature, the difference of their token-mean entropies
over its action tokens ("fixed-batch change"). Per (P, W) it prints each seed's figures and their mean, and per
P the W at which the mean changes sign (linear between the neighbouring W's), to set beside the first-order
critical W of `bench_entropy_mechanism.py` and the paper's W* = 1 + O(1/T).

With `--common-batch RUN` a third figure takes the batch's difference out as well: every point's final model and
the start model score one and the same batch, RUN's step-0 rollouts (a run from the same start model, e.g.
`runs/long-s0`, whose step 0 the SFT model sampled), "common-batch change". What is left between two points of
one seed is the W and the batches each trained on.

With `--m` the points are STARE-C2 instead (`rl.algorithm=stare-c2`: W on L+ and M on L-, still without the gate
and with W and M fixed), one at each (W, M), into OUT/p<P>-w<W>-m<M>-s<seed>; per W it also reports the M below
which the mean drift turns from falling to rising, to set beside the first-order critical M of
`bench_entropy_mechanism.py` (`critical_m_c2`):

    .venv/bin/python benchmarks/bench_w_sweep.py --model runs/long-s0/sft_model --w 1.5 --m 1,0.5,0.33,0.25,0.1 \
        --seeds 0,1 --steps 6 --out runs/m-sweep --json runs/m-sweep.json --common-batch runs/long-s0
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from stare_agents.jsonl import read_lines, report_unread

KEY = "learner/entropy_all"


def point_name(p: float, w: float, m: float | None = None) -> str:
    """A point's name: P and W, and M for a STARE-C2 point (None: O1)."""
    return f"p{p:g}-w{w:g}" + (f"-m{m:g}" if m is not None else "")


def point_folder(out: Path, p: float, w: float, seed: int, m: float | None = None) -> Path:
    return out / f"{point_name(p, w, m)}-s{seed}"


def train_command(
    recipe: str,
    model: str,
    folder: Path,
    *,
    p: float,
    w: float,
    seed: int,
    steps: int,
    extra: list[str],
    m: float | None = None,
) -> list[str]:
    """The `stare-agents train` command of one point (resuming when the folder holds a run cut short): STARE-O1
    at W, or STARE-C2 at W and M when `m` is given."""
    algorithm = ["rl.algorithm=stare"] if m is None else ["rl.algorithm=stare-c2", f"rl.stare.m={m}"]
    command = [
        sys.executable, "-m", "stare_agents.cli", "train", "--recipe", recipe, "--out", str(folder),
        f"seed={seed}", f"model.name={model}", "sft.enabled=false", f"rl.steps={steps}",
        *algorithm, "rl.stare.gated=false", "rl.stare.adaptive=false",
        f"rl.stare.w={w}", f"rl.stare.top_ratio={p}", "eval.num_tasks=0", "eval.every=0", *extra,
    ]  # fmt: skip
    if (folder / "progress.json").exists():
        command.append("--resume")
    return command


def drop_checkpoints(folder: Path) -> None:
    """Delete a done point's `checkpoints/`: what the report reads (`final_model/`, metrics, rollouts) stays."""
    checkpoints = folder / "checkpoints"
    if done(folder) and (folder / "final_model").is_dir() and checkpoints.is_dir():
        shutil.rmtree(checkpoints)
        print(f"{folder}: done, its checkpoints deleted (--keep-checkpoints keeps them)", flush=True)


def done(folder: Path) -> bool:
    progress = folder / "progress.json"
    return progress.exists() and bool(json.loads(progress.read_text()).get("rl_done"))


def entropies(folder: Path) -> dict[int, float]:
    """`learner/entropy_all` by RL step (a resumed run's last record of a step)."""
    metrics = folder / "metrics.jsonl"
    if not metrics.exists():
        return {}
    records, unread = read_lines(metrics)
    report_unread(unread, None, f"lines of {metrics}")
    values: dict[int, float] = {}
    for _, record in records:
        if isinstance(record, dict) and record.get("kind") == "rl":
            value = record.get(KEY)
            if isinstance(value, int | float) and math.isfinite(value):
                values[int(record["step"])] = float(value)
    return values


def batch_entropy(model: str | Path, trajectories: list, temperature: float) -> float:
    """Token-mean entropy at `temperature` over the action tokens of `trajectories`, under `model`."""
    import torch

    from stare_agents.models import prepare_model
    from stare_agents.train.policy import PolicyModel, load_causal_lm
    from stare_agents.trajectory import collate

    policy = PolicyModel(load_causal_lm(prepare_model(str(model))), temperature=temperature)
    policy.eval()
    batch = collate(trajectories, pad_token_id=0)
    with torch.no_grad():
        stats = policy(batch)
    mask = batch.action_mask > 0
    return float(stats.entropy[mask].sum()) / max(1, int(mask.sum()))


def first_batch(folder: Path) -> list:
    """Every trajectory the run sampled at step 0 (trained or not) that has action tokens."""
    from stare_agents.rollout_log import read_rollouts

    saved = read_rollouts(folder, 0)
    return [r.trajectory for r in saved if r.trajectory.prompt_ids and any(r.trajectory.action_mask)]


def slope(points: dict[int, float]) -> float | None:
    """Least-squares slope of value against step; None with fewer than two steps."""
    if len(points) < 2:
        return None
    xs, ys = list(points), list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def sign_change(xs: list[float], drifts: list[float | None], *, falling: bool = False) -> float | None:
    """The first x (in increasing x) at which the drift goes from below zero to zero or above, linear between
    neighbours; with `falling`, from zero or above to below zero (C2's drift against M, which rises as M falls)."""
    known = [(x, d) for x, d in zip(xs, drifts, strict=True) if d is not None]
    for (x0, d0), (x1, d1) in itertools.pairwise(known):
        if (d0 >= 0 > d1) if falling else (d0 < 0 <= d1):
            return x0 + (x1 - x0) * (-d0) / (d1 - d0)
    return None


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the SFT model every point starts from (a local folder)")
    parser.add_argument("--recipe", default="smollm2-arith-long", help="recipe whose RL settings the runs use")
    parser.add_argument(
        "--w", default="1.0,1.05,1.1,1.25,1.5,2,3", help="W values (comma-separated; run in this order)"
    )
    parser.add_argument("--p", default="0.1", help="P values, top_ratio (comma-separated)")
    parser.add_argument(
        "--m", help="M values (comma-separated): STARE-C2 points at each (W, M) in place of STARE-O1 at each W"
    )
    parser.add_argument("--seeds", default="0,1", help="training seeds (comma-separated)")
    parser.add_argument("--steps", type=int, default=6, help="RL steps of each run")
    parser.add_argument("--temperature", type=float, default=0.7, help="the recipe's rollout temperature")
    parser.add_argument("--out", type=Path, required=True, help="folder of the runs, one sub-folder a point")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="another override for every run (repeat)"
    )
    parser.add_argument(
        "--common-batch", type=Path, metavar="RUN",
        help="a run folder from the same start model: its step-0 rollouts are the batch every point is scored on",
    )  # fmt: skip
    parser.add_argument("--report", action="store_true", help="only report the runs already there")
    parser.add_argument(
        "--keep-checkpoints", action="store_true", help="keep a done point's checkpoints/ (only needed to train it on)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    ws, ps, seeds = floats(args.w), floats(args.p), [int(s) for s in args.seeds.split(",") if s]
    ms: list[float | None] = list(floats(args.m)) if args.m else [None]
    if any(m is not None and not m > 0 for m in ms):
        raise SystemExit(f"--m {args.m}: every M must be > 0 (rl.stare.m)")
    common: list = []
    if args.common_batch is not None:  # checked before any point runs, not after hours of them
        if not (args.common_batch / "rollouts").is_dir():
            raise SystemExit(f"--common-batch {args.common_batch}: no rollouts/ there (a train run's folder)")
        common = first_batch(args.common_batch)
        if not common:
            raise SystemExit(f"--common-batch {args.common_batch}: its step 0 saved no trajectory with action tokens")

    if not args.report:
        for seed in seeds:  # a seed at a time, so that a sweep cut short has whole seeds to compare
            for p in ps:
                for w, m in itertools.product(ws, ms):
                    folder = point_folder(args.out, p, w, seed, m)
                    if not done(folder):
                        folder.parent.mkdir(parents=True, exist_ok=True)
                        command = train_command(
                            args.recipe, args.model, folder, p=p, w=w, m=m, seed=seed, steps=args.steps, extra=args.set
                        )
                        print("running:", " ".join(command), flush=True)
                        with open(folder.parent / f"{folder.name}.log", "a") as log:
                            finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
                        if finished.returncode != 0:
                            raise SystemExit(
                                f"{folder}: the run failed (exit {finished.returncode}); its log is {folder}.log"
                            )
                    if not args.keep_checkpoints:  # done, now or before: resuming is all they serve
                        drop_checkpoints(folder)

    ws = sorted(ws)  # run in the order given (the most telling W's first), reported in increasing W (and M)
    ms = sorted(ms) if ms != [None] else ms
    out: dict[str, Any] = {"steps": args.steps, "model": args.model, "recipe": args.recipe, "points": {}}
    start: dict[tuple, float] = {}  # the start model's entropy on a first batch, by its tokens

    def fixed_change(folder: Path, finished: bool, batch: list | None = None) -> float | None:
        """The final model's entropy on `batch` (the point's own first batch when None) minus the start's."""
        if not finished or not (folder / "final_model").is_dir():
            return None
        batch = first_batch(folder) if batch is None else batch
        key = tuple(tuple(t.prompt_ids + t.response_ids) for t in batch)
        if key not in start:
            start[key] = batch_entropy(args.model, batch, args.temperature)
        return batch_entropy(folder / "final_model", batch, args.temperature) - start[key]

    def text(value: float | None) -> str:
        return f"{value:+.4f}" if value is not None else "-"

    for p in ps:
        figures = ["slope", "fixed_batch_change"] + (["common_batch_change"] if common else [])
        means: dict[tuple[float, float | None], dict[str, float | None]] = {}
        for w, m in itertools.product(ws, ms):
            per_seed: dict[str, Any] = {}
            for seed in seeds:
                folder = point_folder(args.out, p, w, seed, m)
                values, finished = entropies(folder), done(folder)
                per_seed[str(seed)] = {
                    "steps": len(values),
                    "done": finished,
                    "first": values.get(0),
                    "slope": slope(values) if finished else None,
                    "fixed_batch_change": fixed_change(folder, finished),
                }
                if common:
                    per_seed[str(seed)]["common_batch_change"] = fixed_change(folder, finished, common)
            point: dict[str, Any] = {"p": p, "w": w, "seeds": per_seed}
            if m is not None:
                point["m"] = m
            for figure in figures:
                got = [s[figure] for s in per_seed.values() if s[figure] is not None]
                point[f"mean_{figure}"] = sum(got) / len(got) if got else None
                point[f"spread_{figure}"] = max(got) - min(got) if len(got) > 1 else None
            means[w, m] = {figure: point[f"mean_{figure}"] for figure in figures}
            out["points"][point_name(p, w, m)] = point
            shown = ", ".join(
                f"s{seed} " + " / ".join(text(s[figure]) for figure in figures) for seed, s in per_seed.items()
            )
            also = f", common-batch change {text(point['mean_common_batch_change'])}" if common else ""
            at = f"P {p:g} W {w:g}" + (f" M {m:g}" if m is not None else "")
            print(f"{at}: entropy drift per step {text(point['mean_slope'])}, fixed-batch change "
                  f"{text(point['mean_fixed_batch_change'])}{also} (mean of the seeds done; {shown})")
        for figure in figures:
            for m in ms:  # the W at which the drift turns up, at each M (O1: the one row)
                crossing = sign_change(ws, [means[w, m][figure] for w in ws])
                where = f"p{p:g}" + (f"-m{m:g}" if m is not None else "")
                out[f"sign_change_w_{where}_{figure}"] = crossing
                at = f"P {p:g}" + (f" M {m:g}" if m is not None else "")
                print(f"{at}: the mean {figure} changes sign at W = {crossing:.3g}" if crossing is not None
                      else f"{at}: the mean {figure} does not turn from below zero over W {ws[0]:g}-{ws[-1]:g}")
            if ms == [None] or len(ms) < 2:
                continue
            for w in ws:  # C2: the M below which the drift turns up, at each W
                crossing = sign_change(ms, [means[w, m][figure] for m in ms], falling=True)
                out[f"sign_change_m_p{p:g}-w{w:g}_{figure}"] = crossing
                print(f"P {p:g} W {w:g}: the mean {figure} rises below M = {crossing:.3g} and falls above it"
                      if crossing is not None else
                      f"P {p:g} W {w:g}: the mean {figure} does not turn from rising to falling over M {ms[0]:g}-{ms[-1]:g}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, allow_nan=False))


if __name__ == "__main__":
    main()
