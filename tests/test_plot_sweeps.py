"""benchmarks/plot_sweeps.py: the W and M sweeps drawn from their JSON files alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "plot_sweeps.py"


def sweep(points: dict) -> dict:
    return {"steps": 6, "model": "m", "recipe": "r", "points": points}


def seeds(*values, figure="common_batch_change"):
    return {str(i): {"steps": 6, "done": True, figure: v, "fixed_batch_change": v} for i, v in enumerate(values)}


def test_series_means_by_hand_and_keeps_o1_and_c2_apart():
    plot = load_script(SCRIPT)
    points = [
        {"p": 0.1, "w": 1.5, "seeds": seeds(-0.02, 0.00)},
        {"p": 0.1, "w": 1.0, "seeds": seeds(0.01, None)},  # a seed without the figure is left out of the mean
        {"p": 0.2, "w": 3.0, "seeds": seeds(0.03, 0.01)},
        {"p": 0.1, "w": 1.5, "m": 0.25, "seeds": seeds(0.02, 0.04)},
    ]
    o1 = plot.series(points, "common_batch_change", "w")
    assert set(o1) == {(0.1,), (0.2,)}
    assert o1[(0.1,)]["mean"] == {1.0: pytest.approx(0.01), 1.5: pytest.approx(-0.01)}  # in increasing W
    assert list(o1[(0.1,)]["mean"]) == [1.0, 1.5]
    assert sorted(o1[(0.1,)]["seeds"]) == [(1.0, 0.01), (1.5, -0.02), (1.5, 0.0)]
    c2 = plot.series(points, "common_batch_change", "m")
    assert set(c2) == {(0.1, 1.5)} and c2[(0.1, 1.5)]["mean"] == {0.25: pytest.approx(0.03)}
    assert plot.figure_of(points) == "common_batch_change"
    # a sweep run without --common-batch has only the fixed-batch change
    fixed = [{"p": 0.1, "w": 1.0, "seeds": {"0": {"fixed_batch_change": 0.01}}}]
    assert plot.figure_of(fixed) == "fixed_batch_change"


def test_the_command_writes_the_png_from_the_json_files(tmp_path: Path):
    w = tmp_path / "w.json"
    w.write_text(json.dumps(sweep({"p0.1-w1": {"p": 0.1, "w": 1.0, "seeds": seeds(-0.01, 0.01)},
                                   "p0.1-w2": {"p": 0.1, "w": 2.0, "seeds": seeds(-0.02, -0.01)}})))
    m = tmp_path / "m.json"
    m.write_text(json.dumps(sweep({"p0.1-w1.5-m0.5": {"p": 0.1, "w": 1.5, "m": 0.5, "seeds": seeds(0.0, 0.01)}})))
    out = tmp_path / "docs" / "sweeps.png"
    done = subprocess.run([sys.executable, str(SCRIPT), str(w), str(m), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "2 O1 points, 1 C2 points" in done.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "content, says",
    [
        ("{not json", "not a readable JSON file"),
        ('{"steps": 6}', "no 'points' in it"),
        ('[1, 2]', "no 'points' in it"),
        ('{"points": {"x": {"w": 1.0}}}', "point 'x' has no p, w and seeds"),
    ],
)
def test_a_file_that_is_not_a_sweep_is_refused_with_its_name(tmp_path: Path, content: str, says: str):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "x.png"
    done = subprocess.run([sys.executable, str(SCRIPT), str(bad), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and says in done.stderr and str(bad) in done.stderr
    assert not out.exists()
