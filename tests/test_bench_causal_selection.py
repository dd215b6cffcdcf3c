"""benchmarks/bench_causal_selection.py: the causal test's arms, its paired interval by hand, its refusals, and two
arms of it run end to end on the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support import load_script

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    return load_script(ROOT / "benchmarks" / "bench_causal_selection.py")


def test_the_paired_interval_by_hand():
    bench = load_bench()
    got = bench.paired_interval([1.0, 2.0, 3.0])  # mean 2, SD 1, t(2) 4.303: 2 +- 4.303 / sqrt(3)
    assert got["mean"] == 2.0 and got["seeds"] == 3
    assert math.isclose(got["ci_low"], 2 - 4.303 / math.sqrt(3)) and math.isclose(
        got["ci_high"], 2 + 4.303 / math.sqrt(3)
    )
    assert bench.paired_interval([0.5])["ci_low"] is None
    assert bench.t_quantile(5) == 2.571 and bench.t_quantile(22) == 2.086 and bench.t_quantile(40) == 1.96


def test_the_arms_are_the_registered_ones():
    bench = load_bench()
    assert list(bench.ARMS) == ["w1", "phi-w3", "top-w3", "random-w3"]
    assert bench.JUDGED == ("phi-w3", "w1")
    args = bench.argparse.Namespace(
        recipe="smollm2-arith", model="m", temperature=1.0, set=["rl.sampling_rounds=4"]
    )
    command = bench.train_command(args, "phi-w3", 3, Path("runs/x"), 12)
    for part in ("seed=3", "rl.steps=12", "rl.stare.gated=false", "rl.reweighting=phi-negative", "rl.stare.w=3.0",
                 "rollout.temperature=1.0", "sft.enabled=false", "rl.sampling_rounds=4",
                 "rl.learner.precision=fp32", "--recipe"):  # fmt: skip
        assert part in command
    assert command[command.index("--recipe") + 1] == "smollm2-arith"
    assert bench.RECIPE == "smollm2-arith"  # re-registered: the default job's recipe and cold start


@pytest.mark.parametrize(
    "args, said",
    [
        (["--seeds", "0"], "--seeds 0"),
        (["--seeds", "1,1"], "--seeds 1,1"),
        (["--temperature", "0"], "--temperature 0"),
        (["--model", "no/such/folder"], "--model no/such/folder"),
        (["--sft-from", "no/config.yaml"], "--sft-from no/config.yaml"),
    ],
)
def test_bad_input_is_refused_before_any_run(tmp_path: Path, capsys, args, said):
    bench = load_bench()
    base = {"--model": "tiny", "--out": str(tmp_path / "runs"), "--arms": "w1,top-w3"}
    for key, value in zip(args[::2], args[1::2], strict=True):
        base[key] = value
    with pytest.raises(SystemExit) as exit_info:
        bench.main([x for kv in base.items() for x in kv] + ["--json", str(tmp_path / "c.json")])
    assert exit_info.value.code != 0 and said in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_two_arms_on_the_tiny_model_end_to_end(tmp_path: Path, monkeypatch):
    """w1 and phi-w3 (the registered pair), two seeds, one step each, on the tiny recipe (local sandbox): the
    common batch is made from held-out tasks, each run's change is measured, the judged pair has its interval and
    a verdict; a second call runs nothing."""
    monkeypatch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")
    monkeypatch.chdir(ROOT)
    bench = load_bench()
    out = tmp_path / "runs"
    common = ["--model", "tiny", "--recipe", "tiny", "--out", str(out), "--arms", "w1,phi-w3", "--seeds", "0,1",
              "--steps", "1", "--common-tasks", "2", "--common-samples", "2", "--set", "rollout.sandbox=local"]  # fmt: skip
    bench.main([*common, "--json", str(tmp_path / "c.json")])
    got = json.loads((tmp_path / "c.json").read_text())
    assert got["common_batch"]["trajectories"] > 0 and (out / "common-batch.jsonl").exists()
    for arm in ("w1", "phi-w3"):
        assert set(got["arms"][arm]["change_by_seed"]) == {"0", "1"}
        assert (
            not (out / f"{arm}-s0" / "checkpoints").exists() and (out / f"{arm}-s0" / "final_model").is_dir()
        )
    pair = got["phi-w3-minus-w1"]
    assert pair["seeds"] == 2 and pair["ci_low"] <= pair["mean"] <= pair["ci_high"]
    assert got["verdict"] == ("pass" if pair["ci_low"] > 0 else "fail")  # every seed of the judged pair ran
    saved = (out / "phi-w3-s0" / "config.yaml").read_text()
    assert "reweighting: phi-negative" in saved and "w: 3.0" in saved and "precision: fp32" in saved
    run = got["arms"]["w1"]["runs"]["0"]
    assert run["steps"] == 1 and run["unread"] == [] and len(run["entropy_first_last"]) == 2
    stamp = (out / "w1-s0" / "metrics.jsonl").stat().st_mtime_ns
    bench.main([*common, "--report"])
    assert (out / "w1-s0" / "metrics.jsonl").stat().st_mtime_ns == stamp


def test_a_torn_metrics_line_is_named_not_passed_over(tmp_path: Path):
    """A run's metrics with a torn line (a run killed mid-write): the figures of the readable steps, and the torn
    line named with its file and line number."""
    bench = load_bench()
    rows = [
        {"kind": "rl", "step": 0, "data/kept_trajectories": 32, "data/budget_exhausted": 0, "stare/lplus_share": 0.01,
         "learner/action_tokens": 2000, "stare/lplus_negative_phi": 0.5, "learner/entropy": 0.4},
        {"kind": "rl", "step": 1, "data/kept_trajectories": 24, "data/budget_exhausted": 1, "stare/lplus_share": 0.02,
         "learner/action_tokens": 1000, "stare/lplus_negative_phi": float("nan"), "learner/entropy": 0.3},
    ]  # fmt: skip
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "metrics.jsonl").write_text(text + '{"kind": "rl", "step": 2, "learn')
    got = bench.run_figures(tmp_path)
    assert got["steps"] == 2 and got["trained_trajectories_min"] == 24 and got["budget_exhausted_steps"] == 1
    assert got["lplus_tokens_per_step"] == pytest.approx(20.0)  # 0.01 x 2000 and 0.02 x 1000
    assert got["lplus_negative_phi_share"] == pytest.approx(0.5)  # the NaN step (no L+) is left out
    assert got["entropy_first_last"] == [0.4, 0.3]
    assert len(got["unread"]) == 1 and "metrics.jsonl:3" in got["unread"][0]
    rows[1]["learner/entropy"] = float("nan")  # a step with no entropy: None in the strict JSON, not NaN
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.run_figures(tmp_path)["entropy_first_last"] == [0.4, None]
