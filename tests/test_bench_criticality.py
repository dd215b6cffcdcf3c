"""benchmarks/bench_criticality.py: W* of the tabular simulation against T and credit, judged by the registered
pass line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_criticality.py"


def _points(excess, seed=0, width=0.001):
    """One seed's grid with W* - 1 = excess(T, credit) and an interval of +-width."""
    bench = load_script(SCRIPT)
    out = []
    for seq_len, credit in bench.grid():
        w = 1.0 + excess(seq_len, credit)
        out.append(
            {
                "seed": seed,
                "seq_len": seq_len,
                "credit": credit,
                "w_star": w,
                "ci_low": w - width,
                "ci_high": w + width,
            }
        )
    return out


def test_one_over_t_passes():
    bench = load_script(SCRIPT)
    verdict = bench.judge(_points(lambda t, c: 12 * c / t) + _points(lambda t, c: 9 * c / t, seed=1))
    assert verdict["pass"]
    assert verdict["seeds"]["0"]["against_t"]["log_log_slope"] == pytest.approx(-1.0)
    assert verdict["seeds"]["1"]["against_credit"]["log_log_slope"] == pytest.approx(1.0)
    assert verdict["seeds"]["0"]["weak_credit"]["points"] == 5  # T 256 at credit <= 1, T 1024 at credit 1


def test_each_part_of_the_pass_line_can_fail():
    bench = load_script(SCRIPT)
    # (a) at weak credit W* above 1.1
    assert not bench.judge(_points(lambda t, c: 40 * c / t))["seeds"]["0"]["weak_credit"]["pass"]
    # (a) an interval reaching below 1
    assert not bench.judge(_points(lambda t, c: 12 * c / t, width=0.05))["seeds"]["0"]["weak_credit"]["pass"]
    # (b) W* - 1 as 1 / sqrt(T): monotone but too flat
    flat = bench.judge(_points(lambda t, c: 0.5 * c / t**0.5))["seeds"]["0"]["against_t"]
    assert flat["strictly_monotone"] and not flat["pass"]
    # (c) W* below 1 somewhere: no log, no slope
    below = bench.judge(_points(lambda t, c: -0.01 if c == 0.125 else 12 * c / t))["seeds"]["0"]
    assert below["against_credit"]["log_log_slope"] is None and not below["against_credit"]["pass"]
    # one seed failing fails the verdict
    assert not bench.judge(_points(lambda t, c: 12 * c / t) + _points(lambda t, c: 40 * c / t, seed=1))[
        "pass"
    ]


def test_a_tiny_run_writes_strict_json(tmp_path):
    bench = load_script(SCRIPT)
    out = tmp_path / "c.json"
    assert bench.main(["--seeds", "0", "--batches", "2", "--bootstrap", "5", "--json", str(out)]) == 0
    report = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-finite {c} in the JSON"))
    assert len(report["points"]) == 7 and report["command"].startswith("benchmarks/bench_criticality.py")
    assert set(report["verdict"]["seeds"]) == {"0"}


@pytest.mark.parametrize("args", [["--batches", "1"], ["--seeds", "a,b"]])
def test_bad_input_writes_nothing(tmp_path, args):
    bench = load_script(SCRIPT)
    out = tmp_path / "c.json"
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*args, "--json", str(out)])
    assert exit_info.value.code != 0 and not out.exists()
