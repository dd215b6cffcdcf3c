"""benchmarks/bench_hold_control.py: the hold ablation's random-token control. Its refusals, the control's
command (the hold run's own SFT model, variant C2, the recipe's M), and both arms of one seed end to end on the
tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import load_script

ROOT = Path(__file__).resolve().parents[1]
C2 = ["--set", "rl.algorithm=stare-c2", "--set", "rl.stare.m=0.25"]  # tiny made a hold-like STARE-C2 recipe


def load_bench():
    return load_script(ROOT / "benchmarks" / "bench_hold_control.py")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--recipe", "tiny"], "is not STARE-C2"),  # tiny is STARE-O1: the control would differ in the variant
        ([*C2, "--set", "rl.stare.variant=O1"], "--set rl.stare.variant=O1"),
        ([*C2, "--set", "rl.algorithm=stare-random"], "--set rl.algorithm=stare-random"),
        ([*C2, "--set", "rl.reweighting=phi-negative"], "--set rl.reweighting=phi-negative"),
        ([*C2, "--seeds", ","], "at least one seed"),
        ([*C2, "--seeds", "zero"], "comma-separated integers"),
        ([*C2, "--set", "rl.steps=many"], "rl.steps"),
    ],
)
def test_bad_input_is_refused_before_any_run(tmp_path: Path, capsys, args, said):
    bench = load_bench()
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--recipe", "tiny", "--out", str(tmp_path / "runs"), *args, "--json", str(tmp_path / "h.json")])
    message = str(exit_info.value.code) + capsys.readouterr().err
    assert exit_info.value.code != 0 and said in message, message
    assert not (tmp_path / "h.json").exists() and not (tmp_path / "runs").exists()


def test_the_control_starts_from_the_hold_runs_sft_model_with_the_recipes_m_under_c2(tmp_path: Path):
    """The hold recipe itself passes the refusals, and the control's command is the hold run's start with L-
    drawn at random: variant C2 (O1 would leave M 0.25 unread), no SFT of its own."""
    bench = load_bench()
    args = type("Args", (), {"recipe": "smollm2-arith-hold", "set": ["rl.sampling_rounds=1"], "seeds_list": [3]})()
    assert bench.refusals(args) == []
    hold = bench.train_command(args, "hold", 3, tmp_path)
    control = bench.train_command(args, "random", 3, tmp_path)
    assert hold[hold.index("--out") + 1] == str(tmp_path / "hold-s3")
    same = [str(tmp_path / "random-s3") if item == str(tmp_path / "hold-s3") else item for item in hold]
    assert control[: len(hold)] == same  # the same recipe, seed and overrides, its own folder
    extra = control[len(hold) :]
    assert extra == ["sft.enabled=false", f"model.name={tmp_path / 'hold-s3' / 'sft_model'}",
                     "rl.algorithm=stare-random", "rl.stare.variant=C2"]  # fmt: skip
    (tmp_path / "random-s3").mkdir()
    (tmp_path / "random-s3" / "progress.json").write_text("{}")
    assert bench.train_command(args, "random", 3, tmp_path)[-1] == "--resume"  # a run cut short resumes


@pytest.mark.slow
def test_both_arms_of_one_seed_on_the_tiny_model_end_to_end(tmp_path: Path, monkeypatch):
    """hold then random, one seed, 8 RL steps each (a second half of 2 blocks), on the tiny recipe made STARE-C2 (local sandbox): the control
    trained from the hold run's SFT model with random L-, the report has both runs and their difference; a
    second call runs nothing."""
    monkeypatch.setenv("STARE_ALLOW_LOCAL_SANDBOX", "1")
    monkeypatch.chdir(ROOT)
    bench = load_bench()
    out = tmp_path / "runs"
    common = ["--recipe", "tiny", "--out", str(out), "--seeds", "0", *C2, "--set", "rl.steps=8",
              "--set", "rollout.sandbox=local"]  # fmt: skip
    bench.main([*common, "--json", str(tmp_path / "h.json")])
    got = json.loads((tmp_path / "h.json").read_text())
    seed = got["seeds"]["0"]
    for arm in ("hold", "random"):
        assert seed[arm]["accuracy"]["rl"] is not None and not (out / f"{arm}-s0" / "checkpoints").exists()
    control = yaml.safe_load((out / "random-s0" / "config.yaml").read_text())
    assert control["rl"]["algorithm"] == "stare-random" and control["rl"]["reweighting"] == "random-tokens"
    assert control["rl"]["stare"]["variant"] == "C2" and control["rl"]["stare"]["m"] == 0.25
    assert control["model"]["name"] == str(out / "hold-s0" / "sft_model") and not control["sft"]["enabled"]
    hold = yaml.safe_load((out / "hold-s0" / "config.yaml").read_text())
    assert hold["rl"]["algorithm"] == "stare-c2" and hold["rl"]["reweighting"] == "stare"
    for arm in ("hold", "random"):
        interval = seed[arm]["second_half"]
        assert interval["blocks"] == 2 and interval["ci_low"] <= interval["mean"] <= interval["ci_high"]
    assert seed["second_half_hold_minus_random"] == seed["hold"]["second_half"]["mean"] - seed["random"][
        "second_half"]["mean"]
    assert seed["accuracy_hold_minus_random"]["problems"] == 4  # paired over tiny's 4 held-out tasks
    assert got["second_half_hold_minus_random"] is None  # one seed: no interval over seeds
    stamp = (out / "hold-s0" / "metrics.jsonl").stat().st_mtime_ns
    bench.main([*common, "--report"])
    assert (out / "hold-s0" / "metrics.jsonl").stat().st_mtime_ns == stamp
