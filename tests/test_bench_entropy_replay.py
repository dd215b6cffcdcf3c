"""benchmarks/bench_entropy_mechanism.py --replay: the probe in the optimiser's geometry along a run's saved steps,
on the tiny model, and the refusals that come before any work."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from support import load_script

from stare_agents.jsonl import dumps
from stare_agents.models import prepare_model
from stare_agents.rollout_log import SavedRollout, write_step
from stare_agents.train.config import load_config, save_config
from stare_agents.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    return load_script(ROOT / "benchmarks" / "bench_entropy_mechanism.py")


def _trajectory(rng: random.Random, group: str, index: int, reward: float) -> Trajectory:
    prompt = [rng.randrange(3, 200) for _ in range(6)]
    length = rng.randrange(8, 20)
    mask = [0 if 3 <= j < 5 else 1 for j in range(length)]  # an observation span
    return Trajectory(
        prompt_ids=prompt,
        response_ids=[rng.randrange(3, 200) for _ in range(length)],
        action_mask=mask,
        rollout_logprobs=[-1.0 * bit for bit in mask],
        reward=reward,
        group_id=group,
        sample_index=index,
        task_id=group,
    )


def write_run(folder: Path, steps: int, *, signs: dict[int, str] | None = None) -> None:
    """A run folder as `stare-agents train` leaves it, as far as the replay reads it: the tiny recipe's config
    (ungated STARE-O1), each step's saved rollouts (two groups of four trained, advantages +-1, one dropped
    group) and metrics.jsonl. `signs[step]` = "+" gives that step positive advantages only."""
    config = load_config(
        recipe="tiny", overrides=[f"out_dir={folder}", "rl.stare.gated=false", "rl.stare.w=2.0"]
    )
    folder.mkdir(parents=True)
    save_config(config, folder / "config.yaml")
    rng = random.Random(0)
    lines = []
    for step in range(steps):
        saved = []
        for g in range(3):
            for i in range(4):
                reward = float(i % 2)
                t = _trajectory(rng, f"s{step}g{g}", i, reward)
                if g == 2:  # left out: the gate's "all sampled" entropy reads it
                    saved.append(SavedRollout(step, t, status="dropped"))
                    continue
                advantage = 1.0 if (signs or {}).get(step) == "+" or reward else -1.0
                saved.append(SavedRollout(step, t, advantage=advantage))
        write_step(folder, step, saved)
        lines.append(dumps({"kind": "rl", "step": step, "stare/gate_on": 1.0, "learner/entropy": 5.0}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_probe_steps_and_settings_by_hand():
    bench = load_bench()
    assert bench.parse_steps("1-3") == [1, 2, 3] and bench.parse_steps("0,5,2-3") == [0, 2, 3, 5]
    with pytest.raises(ValueError, match="1-10"):
        bench.parse_steps("a-3")
    assert bench.setting_problems(temperature=0.7, w=1.0, m=1.0) == []
    problems = bench.setting_problems(temperature=0.0, w=0.9, m=1.5)
    assert [p.split()[0] for p in problems] == ["--temperature", "--w", "--m"]
    assert len(bench.setting_problems(temperature=float("nan"), w=float("inf"), m=0.0)) == 3


def test_the_replay_probes_the_steps_asked_and_summarizes_them(tmp_path: Path):
    bench = load_bench()
    run, out = tmp_path / "run", tmp_path / "probes"
    write_run(run, 3)
    model = str(prepare_model("tiny"))
    argv = ["--replay", str(run), "--model", model, "--probe-steps", "1-2", "--out-dir", str(out), "--w", "3"]
    bench.main(argv)
    probes = {p.name: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    assert set(probes) == {"run-step001.json", "run-step002.json"}
    first = probes["run-step001.json"]
    assert first["replayed_steps"] == 1 and first["command"].endswith("--w 3")
    assert set(first["rows"]) == {"run", "grpo-ds", "stare-o1-w3", "stare-c2-w3-m0.9", "momentum"}
    assert first["rows"]["run"]["gate_on"] is True and first["rows"]["run"]["w"] == 2.0  # ungated, W 2
    assert first["rows"]["momentum"]["step_norm"] > 0  # step 0 left momentum behind
    assert first["batch"]["trajectories"] == 8 and first["batch"]["lplus"] > 0
    for row in first["rows"].values():
        assert all(isinstance(row[k], float) for k in ("predicted", "measured", "step_norm"))
    assert first["rows"]["grpo-ds"]["cos_step_minus_gradient"] < 0.99  # AdamW's step is not along the gradient
    # the plain prediction is linear in the weights: the run's (W 2 on L+, 1 elsewhere) from GRPO-ds's and O1 W 3's
    rows = first["rows"]
    grpo, o1 = rows["grpo-ds"]["plain_predicted"], rows["stare-o1-w3"]["plain_predicted"]
    assert rows["run"]["plain_predicted"] != 0
    assert rows["run"]["plain_predicted"] == pytest.approx(grpo + (o1 - grpo) / 2, rel=1e-6)
    # a probe already written is not probed again (the steps are replayed to reach the next one)
    stamp = (out / "run-step001.json").stat().st_mtime_ns
    bench.main([*argv[:4], "--probe-steps", "1", "--out-dir", str(out)])
    assert (out / "run-step001.json").stat().st_mtime_ns == stamp
    bench.main(["--summarize", str(out), "--json", str(tmp_path / "summary.json")])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["batches"] == 2 and summary["rows"]["run"]["batches"] == 2
    assert len(summary["rows"]["grpo-ds"]["per_batch"]) == 2
    row = summary["rows"]["grpo-ds"]  # of two batches the median is their mean, not the larger one
    ratios = [b["measured"] / b["predicted"] for b in row["per_batch"]]
    assert row["measured_over_predicted_median"] == pytest.approx(sum(ratios) / 2)
    scales = [abs(b["measured"] / b["plain_predicted"]) for b in row["per_batch"]]
    assert row["abs_measured_over_plain_median"] == pytest.approx(sum(scales) / 2)


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--probe-steps", "1-2"], "step 2: no negative-advantage token"),
        (["--w", "0.5"], "--w 0.5"),
        (["--m", "1.5"], "--m 1.5"),
        (["--probe-steps", "two"], "--probe-steps"),
    ],
)
def test_bad_input_is_refused_before_any_work(tmp_path: Path, capsys, extra, said):
    bench = load_bench()
    run, out = tmp_path / "run", tmp_path / "probes"
    write_run(run, 3, signs={2: "+"})
    with pytest.raises(SystemExit) as exit_info:
        bench.main(
            ["--replay", str(run), "--model", str(prepare_model("tiny")), "--out-dir", str(out), *extra]
        )
    assert exit_info.value.code != 0 and said in capsys.readouterr().err
    assert not out.exists()  # nothing written, not even a folder


def test_the_plain_probe_refuses_a_temperature_of_zero_and_a_one_signed_batch(tmp_path: Path, capsys):
    bench = load_bench()
    run = tmp_path / "run"
    write_run(run, 1, signs={0: "+"})
    for args, said in (
        ([f"{run}:0", "--temperature", "0"], "--temperature 0"),
        ([f"{run}:0"], "no negative"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            bench.main([*args, "--json", str(tmp_path / "m.json")])
        assert exit_info.value.code != 0 and said in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
