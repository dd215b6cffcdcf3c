"""benchmarks/bench_w_sweep.py: short ungated STARE runs at several W, and the entropy drift against W."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import load_script

from stare_agents.models import prepare_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_w_sweep.py"


def load_bench():
    return load_script(SCRIPT)


def test_slope_and_sign_change_by_hand():
    bench = load_bench()
    assert bench.slope({0: 0.3, 1: 0.2, 2: 0.1}) == pytest.approx(-0.1)
    assert bench.slope({0: 0.3, 2: 0.3, 5: 0.3}) == 0.0
    assert bench.slope({4: 0.3}) is None  # one step says nothing of a drift
    # -0.02 at W 1, +0.02 at W 2: zero half-way; a point not measured (None) is stepped over
    assert bench.sign_change([1.0, 1.5, 2.0], [-0.02, None, 0.02]) == pytest.approx(1.5)
    assert bench.sign_change([1.0, 2.0], [-0.02, -0.01]) is None  # never turns
    assert bench.sign_change([1.0, 2.0], [0.01, -0.01]) is None  # falls with W: not the paper's turn
    # C2's drift against M: rising at small M, falling at large M; the turn is where it crosses zero
    assert bench.sign_change([0.25, 0.5, 1.0], [0.03, 0.01, -0.03], falling=True) == pytest.approx(0.625)
    assert bench.sign_change([0.25, 1.0], [-0.01, 0.02], falling=True) is None  # rises with M: no such turn
    assert bench.sign_change([0.25, 1.0], [-0.01, 0.02]) == pytest.approx(0.5)  # the rising turn is the W one


def test_a_c2_point_runs_stare_c2_at_its_m_and_an_o1_point_is_unchanged(tmp_path: Path):
    bench = load_bench()
    o1 = bench.train_command("tiny", "tiny", tmp_path / "a", p=0.1, w=1.5, seed=0, steps=2, extra=[])
    c2 = bench.train_command("tiny", "tiny", tmp_path / "b", p=0.1, w=1.5, m=0.25, seed=0, steps=2, extra=[])
    assert "rl.algorithm=stare" in o1 and not any(x.startswith("rl.stare.m=") for x in o1)
    assert "rl.algorithm=stare-c2" in c2 and "rl.stare.m=0.25" in c2 and "rl.algorithm=stare" not in c2
    for command in (o1, c2):  # both without the gate and with the weights fixed
        assert "rl.stare.gated=false" in command and "rl.stare.adaptive=false" in command
    assert bench.point_folder(tmp_path, 0.1, 1.5, 0).name == "p0.1-w1.5-s0"  # the O1 sweep's folders as before
    assert bench.point_folder(tmp_path, 0.1, 1.5, 0, 0.25).name == "p0.1-w1.5-m0.25-s0"


def entropy_by_hand(model_dir: Path, folder: Path, temperature: float = 0.7) -> float:
    """The token-mean entropy at `temperature` of the run's step-0 action tokens, one trajectory at a time with
    the Hugging Face model itself: position p's token is predicted by the logits at p - 1."""
    import torch
    from transformers import AutoModelForCausalLM

    from stare_agents.rollout_log import read_rollouts

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    for saved in read_rollouts(folder, 0):
        t = saved.trajectory
        if not t.prompt_ids or not any(t.action_mask):
            continue
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].double() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        for j, bit in enumerate(t.action_mask):
            if bit:
                total += float(entropy[len(t.prompt_ids) + j - 1])
                count += 1
    return total / count


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The script in a process of its own; the tiny runs use the local sandbox (the tiny model's code), which
    the trainer refuses unless acknowledged."""
    env = {**os.environ, "STARE_ALLOW_LOCAL_SANDBOX": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


@pytest.mark.slow
def test_a_sweep_runs_each_point_once_reports_the_slope_of_its_metrics_and_keeps_checkpoints_as_asked(
    tmp_path: Path,
):
    """Two points trained once (with `--keep-checkpoints`), their figures checked by hand; `--report` deletes
    nothing, and a point without its final model keeps its checkpoints whatever it says of itself; the next run
    without the flag trains nothing, deletes the done points' checkpoints and gives the same figures."""
    out = tmp_path / "sweep"
    common = ["--recipe", "tiny", "--model", "tiny", "--w", "1.0,3", "--seeds", "0", "--steps", "2",
              "--out", str(out), "--set", "rollout.sandbox=local", "--json", str(tmp_path / "f.json")]  # fmt: skip
    first = run(*common, "--keep-checkpoints")
    assert first.returncode == 0, first.stderr + first.stdout
    assert first.stdout.count("running:") == 2 and "deleted" not in first.stdout
    got = json.loads((tmp_path / "f.json").read_text())
    for w in ("1", "3"):
        folder = out / f"p0.1-w{w}-s0"
        config = (folder / "config.yaml").read_text()
        assert "gated: false" in config and "adaptive: false" in config and f"w: {float(w)}" in config
        assert "enabled: false" in config  # no SFT: the model given is the start
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        entropy = {r["step"]: r["learner/entropy_all"] for r in records if r.get("kind") == "rl"}
        assert sorted(entropy) == [0, 1]
        point = got["points"][f"p0.1-w{w}"]["seeds"]["0"]
        assert point["done"] and point["slope"] == pytest.approx(entropy[1] - entropy[0])
        change = entropy_by_hand(folder / "final_model", folder) - entropy_by_hand(prepare_model("tiny"), folder)
        assert point["fixed_batch_change"] == pytest.approx(change, abs=1e-5)
        assert (folder / "checkpoints").is_dir() and (folder / "final_model").is_dir()  # kept, as asked
    assert run(*common, "--report").returncode == 0
    assert all((out / f"p0.1-w{w}-s0" / "checkpoints").is_dir() for w in ("1", "3"))  # a report deletes nothing
    broken = out / "p0.1-w2-s0"  # says it is done but has no final model: its checkpoints are all it has
    (broken / "checkpoints" / "step-00000001").mkdir(parents=True)
    (broken / "progress.json").write_text(json.dumps({"rl_done": True}))
    # run again without the flag: nothing is trained twice, the same figures come back, the done points'
    # checkpoints (resume only) go and what the report reads stays
    again = run(*common[:5], "1.0,3,2", *common[6:])
    assert again.returncode == 0, again.stderr + again.stdout
    assert "running:" not in again.stdout and again.stdout.count("its checkpoints deleted") == 2
    for w in ("1", "3"):
        folder = out / f"p0.1-w{w}-s0"
        assert f"{folder}: done, its checkpoints deleted" in again.stdout
        assert not (folder / "checkpoints").exists() and (folder / "final_model").is_dir()
    assert (broken / "checkpoints" / "step-00000001").is_dir()
    points = json.loads((tmp_path / "f.json").read_text())["points"]
    assert {k: points[k] for k in got["points"]} == got["points"]
    # one common batch (W 1's step 0) scored by both points: W 1's figure is its fixed-batch one, W 3's its own
    shared = out / "p0.1-w1-s0"
    both = run(*common, "--report", "--common-batch", str(shared))
    assert both.returncode == 0, both.stderr + both.stdout
    points = json.loads((tmp_path / "f.json").read_text())["points"]
    w1, w3 = points["p0.1-w1"]["seeds"]["0"], points["p0.1-w3"]["seeds"]["0"]
    assert w1["common_batch_change"] == pytest.approx(w1["fixed_batch_change"], abs=1e-6)
    change = entropy_by_hand(out / "p0.1-w3-s0" / "final_model", shared) - entropy_by_hand(prepare_model("tiny"), shared)
    assert w3["common_batch_change"] == pytest.approx(change, abs=1e-5)
    assert "common-batch change" in both.stdout
    # a folder with no rollouts is refused before anything runs
    wrong = run(*common, "--common-batch", str(tmp_path / "nothing-here"))
    assert wrong.returncode != 0 and "no rollouts/ there" in wrong.stderr and "running:" not in wrong.stdout


def test_a_point_that_fails_stops_the_sweep_naming_its_log(tmp_path: Path):
    out = tmp_path / "sweep"
    got = run("--recipe", "tiny", "--model", str(tmp_path / "no-such-model"), "--w", "1.0", "--seeds", "0",
              "--steps", "2", "--out", str(out), "--set", "rollout.sandbox=local", timeout=300)  # fmt: skip
    assert got.returncode != 0
    assert "the run failed" in got.stderr and "p0.1-w1-s0.log" in got.stderr
    assert (out / "p0.1-w1-s0.log").read_text().strip()  # the run's own words are kept


def write_point(folder: Path, entropies: list[float]) -> None:
    """A finished point's metrics by hand (no final model: only the drift per step can be read)."""
    folder.mkdir(parents=True)
    lines = [{"kind": "rl", "step": s, "learner/entropy_all": e} for s, e in enumerate(entropies)]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (folder / "progress.json").write_text(json.dumps({"rl_done": True}))


def test_an_m_sweep_reports_the_m_below_which_the_drift_rises(tmp_path: Path):
    out = tmp_path / "sweep"
    write_point(out / "p0.1-w1.5-m0.25-s0", [0.30, 0.32, 0.34])  # +0.02 a step
    write_point(out / "p0.1-w1.5-m1-s0", [0.30, 0.28, 0.26])  # -0.02 a step
    got = run("--model", "unused", "--w", "1.5", "--m", "1,0.25", "--seeds", "0", "--out", str(out), "--report",
              "--json", str(tmp_path / "f.json"))  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert "P 0.1 W 1.5 M 0.25: entropy drift per step +0.0200" in got.stdout
    assert "P 0.1 W 1.5 M 1: entropy drift per step -0.0200" in got.stdout
    assert "P 0.1 W 1.5: the mean slope rises below M = 0.625 and falls above it" in got.stdout
    figures = json.loads((tmp_path / "f.json").read_text())
    assert figures["sign_change_m_p0.1-w1.5_slope"] == pytest.approx(0.625)
    assert figures["points"]["p0.1-w1.5-m0.25"]["m"] == 0.25
    assert figures["sign_change_w_p0.1-m1_slope"] is None  # one W: no turn over W to report
    # an M the trainer would refuse is refused before any run
    wrong = run("--model", "unused", "--w", "1.5", "--m", "0.5,0", "--seeds", "0", "--out", str(tmp_path / "x"))
    assert wrong.returncode != 0 and "every M must be > 0" in wrong.stderr and "running:" not in wrong.stdout


def test_report_reads_only_what_is_there(tmp_path: Path):
    folder = tmp_path / "sweep" / "p0.1-w2-s0"
    folder.mkdir(parents=True)
    lines = [{"kind": "rl", "step": s, "learner/entropy_all": 0.3 + 0.01 * s} for s in range(3)]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (folder / "progress.json").write_text(json.dumps({"rl_done": True}))
    got = run("--model", "unused", "--w", "3,2", "--seeds", "0", "--out", str(tmp_path / "sweep"), "--report")
    assert got.returncode == 0, got.stderr
    assert "running:" not in got.stdout
    assert "P 0.1 W 2: entropy drift per step +0.0100, fixed-batch change -" in got.stdout  # no final model
    assert "P 0.1 W 3: entropy drift per step -, fixed-batch change - (mean of the seeds done; s0 - / -)" in got.stdout
    assert got.stdout.index("W 2:") < got.stdout.index("W 3:")  # reported in increasing W, whatever the order run
