"""benchmarks/bench_entropy_mechanism.py: which batch and which model a RUN[:STEP[:MODEL]] names."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import load_script

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    return load_script(ROOT / "benchmarks" / "bench_entropy_mechanism.py")


def test_a_run_alone_is_its_first_batch_under_its_sft_model():
    bench = load_bench()
    assert bench.batch_spec("runs/long-s0") == ("runs/long-s0", 0, "sft_model")
    assert bench.batch_spec("runs/long-s0:63") == ("runs/long-s0", 63, "sft_model")
    assert bench.batch_spec("runs/long-s0/grpo-ds:63:final_model") == (
        "runs/long-s0/grpo-ds",
        63,
        "final_model",
    )


@pytest.mark.parametrize("spec", ["runs/a:last", "runs/a:-1:final_model", "runs/a:6.5"])
def test_a_step_that_is_not_a_number_is_refused_by_name(spec):
    with pytest.raises(SystemExit, match="must be a number"):
        load_bench().batch_spec(spec)


@pytest.mark.slow
def test_the_bench_probes_a_named_step_under_a_named_model(tmp_path: Path):
    """A one-step tiny run, then the bench on its step-0 batch under its final model, without the control."""
    run = tmp_path / "run"
    env = {**os.environ, "STARE_ALLOW_LOCAL_SANDBOX": "1"}  # the tiny model's code runs in the local sandbox
    trained = subprocess.run(
        [sys.executable, "-m", "stare_agents.cli", "train", "--recipe", "tiny", "--out", str(run), "model.name=tiny",
         "sft.enabled=false", "rl.steps=1", "eval.num_tasks=0", "rollout.sandbox=local"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    # the tiny random model rarely scores, so its advantages are all 0; give the saved batch signs of both kinds
    # (+1, -1, ... by trajectory) so that every quadrant the bench splits by can hold tokens
    saved = run / "rollouts" / "step-000000.jsonl.gz"
    records = [json.loads(line) for line in gzip.decompress(saved.read_bytes()).decode().splitlines()]
    for index, record in enumerate(records):
        record["advantage"] = 1.0 if index % 2 == 0 else -1.0
    saved.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_entropy_mechanism.py"), f"{run}:0:final_model",
         "--no-control", "--lrs", "1e-5,3e-5", "--json", str(tmp_path / "m.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads((tmp_path / "m.json").read_text())
    batch = got["batches"][f"{run}:0:final_model"]
    assert batch["step"] == 0 and batch["model"] == "final_model" and batch["trajectories"] > 0
    assert set(batch["weightings"]) == {"grpo-ds", "stare-o1", "stare-c2"}  # no random control
    assert sum(batch["quadrants"].values()) == batch["action_tokens"]
    for row in batch["weightings"].values():
        assert [s["lr"] for s in row["steps"]] == [1e-5, 3e-5]
        # first order: the prediction is linear in the step size, and not zero with advantages of both signs
        assert row["steps"][0]["predicted"] != 0
        assert row["steps"][1]["predicted"] == pytest.approx(3 * row["steps"][0]["predicted"])
    # STARE's reweighting changes the step, so its prediction differs from GRPO-ds's
    rows = batch["weightings"]
    assert rows["stare-c2"]["steps"][0]["predicted"] != rows["grpo-ds"]["steps"][0]["predicted"]
    # the critical M of C2 at the bench's W, from O1 (M 1) and C2 (the bench's M): the drift is linear in M
    o1, c2 = rows["stare-o1"]["steps"][0]["predicted"], rows["stare-c2"]["steps"][0]["predicted"]
    per_m = (o1 - c2) / (1 - got["m"])  # the drift's change per unit of M
    assert batch["w_sweep"]["critical_m_c2"] == pytest.approx(1 - o1 / per_m, rel=1e-6)
