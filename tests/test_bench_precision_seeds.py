"""benchmarks/bench_precision_seeds.py: the per-seed, per-precision figures by hand on written run folders, the
bar at its edges, and presets that load as the precisions they name."""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from support import load_script

from stare_agents import hardware
from stare_agents.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_precision_seeds.py"


def bench():
    return load_script(SCRIPT)


def write_point(folder: Path, gain: float, low: float, *, rewards=(0.25, 0.5, 0.75), torn: bool = False) -> None:
    folder.mkdir(parents=True)
    summary = {
        "accuracy": {"base": 0.0, "sft": 0.5, "rl": 0.5 + gain},
        "rl_gain": {"of": "rl - sft", "value": gain, "ci_low": low, "ci_high": gain + 0.06, "tasks": 200},
        "precision": {"rollout_dtype": "bfloat16", "learner": "bf16"},
        "mismatch": {"logprob_abs_diff_mean": 0.01, "kl_mean": 1.1e-3, "ratio_outside_mean": 0.03},
        "wall_time_s": 500.0,
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    lines = [json.dumps({"kind": "rl", "step": i, "rollout/mean_reward": r}) for i, r in enumerate(rewards)]
    lines.insert(1, json.dumps({"kind": "rl", "step": 99}))  # a step without a reward figure: left out
    lines.append(json.dumps({"kind": "eval", "point": "sft", "tool_error_rate": 0.4}))
    lines.append(json.dumps({"kind": "eval", "point": "rl", "tool_error_rate": 0.02}))
    if torn:
        lines.append('{"kind": "rl", "step": 3, "rollout/mean_')  # a run killed mid-line
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_point_read_by_hand_and_the_bar_at_its_edges(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    b = bench()
    write_point(tmp_path / "bf16-s0", 0.25, 0.15, torn=True)  # on the bar: passes
    write_point(tmp_path / "bf16-s1", 0.40, 0.149)  # the interval's lower end just under: misses
    write_point(tmp_path / "bf16-s2", 0.249, 0.20)  # the gain just under: misses
    with caplog.at_level(logging.WARNING):
        p0 = b.read_point(tmp_path / "bf16-s0")
    assert "could not be read" in caplog.text and "metrics.jsonl" in caplog.text  # the torn line is named
    assert p0["passes"] and p0["reward"] == {"first": 0.25, "last": 0.75, "max": 0.75}
    assert p0["tool_error_rate_after_rl"] == 0.02 and p0["ci"] == [0.15, 0.31]
    p1, p2 = b.read_point(tmp_path / "bf16-s1"), b.read_point(tmp_path / "bf16-s2")
    assert not p1["passes"] and not p2["passes"]
    a = b.aggregate({0: p0, 1: p1, 2: p2})
    assert a["rl_minus_sft_mean"] == pytest.approx((0.25 + 0.40 + 0.249) / 3)
    assert a["rl_minus_sft_range"] == [0.249, 0.40] and not a["every_seed_passes"]
    assert b.aggregate({0: p0})["every_seed_passes"]
    assert b.read_point(tmp_path / "missing") is None


def write_heldout(folder: Path, stage: str, outcomes: dict[str, list[bool]], extra: str = "") -> None:
    """heldout/<stage>.jsonl.gz as the trainer keeps it: one episode a line, the task id naming its kind."""
    import gzip

    (folder / "heldout").mkdir(exist_ok=True)
    lines = [
        json.dumps({"step": 0, "trajectory": {"task_id": f"arith-{kind}-L{1 + i % 3}-{i:010x}", "correct": ok}})
        for kind, oks in outcomes.items()
        for i, ok in enumerate(oks)
    ]
    with gzip.open(folder / "heldout" / f"{stage}.jsonl.gz", "wt") as handle:
        handle.write("\n".join(lines) + "\n" + extra)


def test_the_task_kinds_a_run_gained_and_lost_are_reported(tmp_path: Path):
    """A net gain can hide a forgetting: the report names the kinds whose held-out accuracy moved by >= 0.2."""
    b = bench()
    folder = tmp_path / "fast-s0"
    write_point(folder, 0.10, 0.02)
    assert "kinds" not in b.read_point(folder)  # a run that kept no held-out episodes: no kinds, no error
    write_heldout(folder, "sft", {"gcd": [False] * 5, "modinv": [True] * 5, "isqrt": [True, True, False, False, False]})
    write_heldout(folder, "rl", {"gcd": [True] * 4 + [False], "modinv": [True, True, False, False, False],
                                 "isqrt": [True, True, True, False, False], "new_kind": [True]})
    point = b.read_point(folder)
    assert point["kinds"] == {"gcd": [0.0, 0.8], "isqrt": [0.4, 0.6], "modinv": [1.0, 0.4], "new_kind": [0.0, 1.0]}
    gained, lost = b.kinds_moved(point["kinds"])
    assert gained == ["gcd 0.00 -> 0.80", "isqrt 0.40 -> 0.60", "new_kind 0.00 -> 1.00"]  # 0.2 is on the edge
    assert lost == ["modinv 1.00 -> 0.40"]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--report", "--seeds", "0", "--precisions", "fast"],
        capture_output=True, text=True, check=True,
    )
    assert "fast-s0 by task kind (SFT -> RL): gained gcd 0.00 -> 0.80, isqrt" in result.stdout
    assert "lost modinv 1.00 -> 0.40" in result.stdout
    assert b.task_kind("some-other-id") == "some-other-id"
    write_heldout(folder, "rl", {"gcd": [True]}, extra='{"step": 0, "trajectory": {"task_id": 3}}\n')
    with pytest.raises(SystemExit, match=r"rl.jsonl.gz:2: not a held-out episode"):
        b.read_point(folder)


def test_report_prints_the_table_and_strict_json(tmp_path: Path):
    write_point(tmp_path / "fp32-s0", 0.30, 0.22)
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--report", "--seeds", "0,1",
         "--precisions", "fp32,bf16", "--json", str(out)],
        capture_output=True, text=True, check=True,
    )
    assert "fp32-s1: not finished" in result.stdout and "bf16-s0: not finished" in result.stdout
    assert "| fp32 | 0 | 0.500 | 0.800 | +0.300 [+0.220, +0.360] | pass |" in result.stdout
    figures = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert figures["aggregate"] == {
        "fp32": {"seeds": ["0"], "runs": 1, "rl_minus_sft_mean": 0.30, "rl_minus_sft_range": [0.30, 0.30],
                 "rl_minus_sft_spread": 0.0, "every_seed_passes": True, "spread_passes": True,
                 "wall_time_s_max": 500.0, "wall_time_passes": True}
    }
    assert "bf16" not in figures["aggregate"]  # no point of it: absent, not NaN


def test_an_unknown_precision_is_refused_before_any_run(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--precisions", "fp32,fastest"],
        capture_output=True, text=True,
    )
    assert result.returncode == 2 and "unknown precision(s) ['fastest']" in result.stderr
    assert not any(tmp_path.iterdir())
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--replicates", "0"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "--replicates must be >= 1" in result.stderr
    assert not any(tmp_path.iterdir())


def test_the_spread_the_wall_time_the_load_and_same_setting_pairs(tmp_path: Path):
    """Five runs: the spread (max - min) against 0.15 at its edge, a job over 15 minutes, the load a point
    sampled, the kept trajectories per step, and two runs of one seed in one resolved precision paired."""
    b = bench()
    gains = {"0": 0.30, "1": 0.45, "2": 0.31, "3": 0.35, "4": 0.40}  # spread 0.15: on the bar
    points = {}
    for label, g in gains.items():
        write_point(tmp_path / f"fast-s{label}", g, g - 0.07)
        points[label] = b.read_point(tmp_path / f"fast-s{label}")
    a = b.aggregate(points)
    assert a["runs"] == 5 and a["spread_passes"] and a["every_seed_passes"] and a["wall_time_passes"]
    assert a["rl_minus_sft_spread"] == pytest.approx(0.15)
    points["4"] = dict(points["4"], rl_minus_sft=0.451, wall_time_s=901.0)  # spread 0.151, a job of 901 s
    a = b.aggregate(points)
    assert not a["spread_passes"] and not a["wall_time_passes"]
    folder = tmp_path / "fast-s0"
    (folder / b.LOAD_FILE).write_text(json.dumps({"every_s": 15, "samples": [1.0, 3.0, 2.0]}))
    records = [{"kind": "rl", "step": i, "data/kept_trajectories": k, "data/budget_exhausted": int(k < 32)}
               for i, k in enumerate([32, 32, 24])]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    p = b.read_point(folder)
    assert p["load_1m"] == {"mean": 2.0, "max": 3.0, "samples": 3}
    assert p["kept_trajectories"] == [32, 32, 24] and p["budget_exhausted_steps"] == [2]
    write_point(tmp_path / "fp32-s0", 0.20, 0.10)  # same resolved precision as fast-s0 (write_point's)
    pairs = b.same_setting_pairs({"fast": {"0": p}, "fp32": {"0": b.read_point(tmp_path / "fp32-s0")}})
    assert len(pairs) == 1 and pairs[0]["seed"] == 0 and pairs[0]["difference"] == pytest.approx(0.10)


def test_the_load_sampler_adds_to_what_an_earlier_attempt_sampled(tmp_path: Path):
    b = bench()
    with b.LoadSampler(tmp_path, every=0.01) as sampler:
        while len(sampler.samples) < 2:
            pass
    first = json.loads((tmp_path / b.LOAD_FILE).read_text())["samples"]
    with b.LoadSampler(tmp_path, every=0.01) as sampler:
        while len(sampler.samples) < 1:
            pass
    assert len(json.loads((tmp_path / b.LOAD_FILE).read_text())["samples"]) >= len(first) + 1


@pytest.mark.parametrize(
    "name, engine, learner",
    [("fp32", "float32", "fp32"), ("bf16", "bfloat16", "bf16"), ("engine-bf16", "bfloat16", "fp32"),
     ("learner-bf16", "float32", "bf16"), ("bf16-head-tis", "bfloat16", "bf16")],
)
def test_each_precision_loads_as_what_it_names_on_any_cpu(name, engine, learner):
    config = load_config(recipe="smollm2-arith", overrides=bench().PRECISIONS[name])
    assert hardware.resolve_dtype(config.model.rollout_dtype) == engine
    assert hardware.resolve_precision(config.rl.learner.precision) == learner
    assert config.model.fp32_lm_head == (name == "bf16-head-tis")
    assert config.rl.learner.importance.active == (name == "bf16-head-tis")


def test_a_point_that_dies_is_resumed_and_each_failed_attempt_is_logged(tmp_path: Path, monkeypatch):
    """A run killed on a shared machine (exit 1: e.g. Ray's memory monitor) is run again with --resume once its
    folder has progress.json; after `attempts` failures the bench stops, naming the folder."""
    b = bench()
    calls: list[list[str]] = []
    codes = iter([1, 0])

    def fake_run(command, **kwargs):
        calls.append(command)
        (tmp_path / "p" / "progress.json").write_text("{}")  # the first attempt got as far as a checkpoint
        return subprocess.CompletedProcess(command, next(codes))

    (tmp_path / "p").mkdir()
    monkeypatch.setattr(b.subprocess, "run", fake_run)
    b.run_point(tmp_path / "p", "fp32", 3, attempts=2)
    assert "--resume" not in calls[0] and "--resume" in calls[1] and "seed=3" in calls[1]
    assert (tmp_path / "p" / "bench_attempts.txt").read_text() == "attempt 1: exit 1\n"
    codes = iter([1, 1])
    with pytest.raises(SystemExit, match="2 attempt"):
        b.run_point(tmp_path / "p", "fp32", 3, attempts=2)


def test_a_point_cut_short_before_its_first_checkpoint_is_resumed(tmp_path: Path, monkeypatch):
    """The trainer writes config.yaml first: a point killed before any progress.json is continued with --resume
    (`train` without it refuses a folder that holds a run, and every attempt would fail the same way)."""
    b = bench()
    calls: list[list[str]] = []
    monkeypatch.setattr(
        b.subprocess, "run", lambda command, **kw: calls.append(command) or subprocess.CompletedProcess(command, 0)
    )
    (tmp_path / "p").mkdir()
    b.run_point(tmp_path / "p", "fast", 4)  # a fresh folder: a new run
    (tmp_path / "p" / "config.yaml").write_text("name: x\n")
    b.run_point(tmp_path / "p", "fast", 4)
    assert "--resume" not in calls[0] and "--resume" in calls[1]


def test_two_precisions_are_compared_paired_by_seed(tmp_path: Path):
    """fp32 against fast over three seeds: the per-seed differences, their mean and t-interval over seeds, how often
    the second gained as much; a replicate is left out of the pairs, one seed in common is too few, and two presets
    that resolve to one precision are replicates, not a comparison."""
    b = bench()
    results: dict[str, dict[str, dict]] = {"fast": {}, "fp32": {}}
    for label, (g_fast, g_fp32) in {
        "0": (0.30, 0.35),
        "1": (0.20, 0.20),
        "2": (0.40, 0.30),
        "0-r1": (0.1, 0.9),
    }.items():
        for name, gain in (("fast", g_fast), ("fp32", g_fp32)):
            write_point(tmp_path / f"{name}-s{label}", gain, gain - 0.07)
            results[name][label] = b.read_point(tmp_path / f"{name}-s{label}")
    for point in results["fp32"].values():
        point["precision"] = {"rollout_dtype": "float32", "learner": "fp32"}
    pair = b.paired_by_seed(results, "fast", "fp32")
    assert pair["of"] == "fp32 - fast" and pair["seeds"] == [0, 1, 2]
    assert pair["rl_minus_sft_difference"] == pytest.approx([0.05, 0.0, -0.10])
    assert pair["rl_minus_sft_difference_mean"] == pytest.approx(-0.05 / 3)
    half = 4.303 * statistics.stdev([0.05, 0.0, -0.10]) / 3**0.5  # t with 2 degrees of freedom
    assert pair["rl_minus_sft_difference_ci95"] == pytest.approx([-0.05 / 3 - half, -0.05 / 3 + half])
    assert pair["rl_difference"] == pytest.approx([0.05, 0.0, -0.10]) and pair["second_at_least_as_good"] == 2
    assert (
        b.paired_by_seed(
            {"fast": {"0": results["fast"]["0"]}, "fp32": {"0": results["fp32"]["0"]}}, "fast", "fp32"
        )
        is None
    )
    same = {"fast": results["fast"], "bf16": {k: dict(v) for k, v in results["fast"].items()}}
    assert b.paired_by_seed(same, "fast", "bf16") is None
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(tmp_path),
            "--report",
            "--seeds",
            "0,1,2",
            "--precisions",
            "fast,fp32",
            "--json",
            str(tmp_path / "f.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    # the report reads the folders: write_point's precision is the same bf16 for both names, so no pairing there
    assert "paired by seed" not in result.stdout
    assert json.loads((tmp_path / "f.json").read_text())["paired_by_seed"] == []
