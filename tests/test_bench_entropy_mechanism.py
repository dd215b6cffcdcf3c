"""benchmarks/bench_entropy_mechanism.py: which batch and which model a RUN[:STEP[:MODEL]] names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location(
        "bench_entropy_mechanism", ROOT / "benchmarks" / "bench_entropy_mechanism.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
