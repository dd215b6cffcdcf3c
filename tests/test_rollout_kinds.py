"""benchmarks/rollout_kinds.py: per task kind, what RL sampled and trained on, read back from saved rollouts; its
counts agree with a direct count of the same files, a damaged step file is read up to its damage and reported, and a
folder without rollouts is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import load_script

from stare_agents.rollout_log import read_rollouts

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "rollout_kinds.py"
RUN = ROOT / "benchmarks" / "logs" / "default-job-seeds" / "epyc-avx512bf16" / "fast-s0"


def test_the_kind_is_read_from_the_task_id():
    kind_of = load_script(SCRIPT).kind_of
    assert kind_of("arith-count_primes-L1-a9373b91e9") == "count_primes"
    assert kind_of("arith-multiply-L2-1c2d3e4f") == "multiply"
    assert kind_of("gsm8k-123") == "gsm8k-123"  # no level part: the id is its own kind
    assert kind_of("plain") == "plain"


def copy_steps(run: Path, out: Path, steps: list[int]) -> Path:
    (out / "rollouts").mkdir(parents=True)
    for step in steps:
        name = f"step-{step:06d}.jsonl.gz"
        shutil.copy(run / "rollouts" / name, out / "rollouts" / name)
    return out


def test_counts_agree_with_the_files_and_two_runs_of_one_stream_share_every_prompt(tmp_path, capsys):
    if not (RUN / "rollouts").is_dir():
        pytest.skip(f"{RUN} is not in this checkout")
    bench = load_script(SCRIPT)
    a = copy_steps(RUN, tmp_path / "a", [0, 1, 2])
    b = copy_steps(RUN, tmp_path / "b", [0, 1, 2])
    out = tmp_path / "kinds.json"
    assert bench.main([str(a), str(b), "--window", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    saved = read_rollouts(a)
    run = report["runs"][0]
    kinds = run["kinds"].values()
    assert sum(k["sampled"] for k in kinds) == len(saved)
    assert sum(k["trained"] for k in kinds) == sum(s.status == "trained" for s in saved)
    assert (
        sum(k["prompts"] for k in kinds) == len({s.trajectory.task_id for s in saved}) == len(run["prompts"])
    )
    first = [s for s in saved if s.step == 0]
    assert sum(k["first"][1] for k in kinds) == len(first)
    assert sum(k["first"][0] for k in kinds) == sum(s.trajectory.reward > 0 for s in first)
    assert sum(k["last"][1] for k in kinds) == sum(s.step == 2 for s in saved)
    assert report["common_prompts"] == report["union_prompts"] == len(run["prompts"])
    assert "| kind |" in capsys.readouterr().out


def test_a_damaged_step_file_is_read_up_to_its_damage_and_reported(tmp_path, capsys):
    if not (RUN / "rollouts").is_dir():
        pytest.skip(f"{RUN} is not in this checkout")
    bench = load_script(SCRIPT)
    run = copy_steps(RUN, tmp_path / "run", [0, 1])
    damaged = run / "rollouts" / "step-000001.jsonl.gz"
    damaged.write_bytes(damaged.read_bytes()[: len(damaged.read_bytes()) // 2])  # cut mid-stream
    out = tmp_path / "kinds.json"
    assert bench.main([str(run), "--json", str(out)]) == 0
    report = json.loads(out.read_text())["runs"][0]
    assert report["unread"] and "step-000001" in report["unread"][0]
    whole = len(read_rollouts(RUN, 0))
    assert whole < sum(k["sampled"] for k in report["kinds"].values()) < whole + len(read_rollouts(RUN, 1))
    assert "not read" in capsys.readouterr().err


def test_a_folder_without_rollouts_and_a_bad_window_are_refused_by_name(tmp_path):
    bench = load_script(SCRIPT)
    with pytest.raises(SystemExit, match="no saved rollouts"):
        bench.main([str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main([str(tmp_path), "--window", "0"])
