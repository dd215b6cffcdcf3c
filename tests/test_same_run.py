"""scripts/same_run.py: two runs are the same when every figure but the timings agrees, record by record."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "same_run.py"


def _run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def _same(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True)


def test_timings_differ_and_the_run_is_the_same_a_figure_differs_and_it_is_not(tmp_path):
    base = {"kind": "rl", "step": 0, "learner/loss": 0.25, "stare/gate_input": float("nan")}
    a = _run(tmp_path / "a", [{**base, "time/update_s": 1.0, "learner/step_s": 2.0, "seconds": 3.0}])
    b = _run(tmp_path / "b", [{**base, "time/update_s": 9.0, "learner/step_s": 8.0, "seconds": 7.0}])
    assert _same(a, b).returncode == 0 and "same run" in _same(a, b).stdout
    c = _run(tmp_path / "c", [{**base, "learner/loss": 0.2500001}])
    result = _same(a, c)
    assert result.returncode == 1 and "learner/loss: 0.25 -> 0.2500001" in result.stdout
    d = _run(tmp_path / "d", [base, base])  # an extra record
    assert _same(a, d).returncode == 1 and "1 records against 2" in _same(a, d).stdout
