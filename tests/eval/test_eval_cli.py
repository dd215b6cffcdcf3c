"""`stare-agents eval` / `compare` argument handling and output (the e2e file runs eval for real)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from test_eval_harness import ScriptedRunner, write_benchmark
from typer.testing import CliRunner

from stare_agents.eval.cli import compare_command, eval_command
from stare_agents.eval.harness import EvalConfig, evaluate


@pytest.fixture
def app() -> typer.Typer:
    """The two commands on an app of their own, as stare_agents/cli.py registers them."""
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("compare")(compare_command)
    return app


def test_compare_command(app: typer.Typer, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    bench = str(write_benchmark(tmp_path / "alpha.jsonl", ["q0", "q1", "q2"]))
    for name, k in (("base", 2), ("trained", 4)):
        evaluate(
            model,
            [bench],
            EvalConfig(samples=k, bootstrap=50),
            out=tmp_path / name,
            runner=ScriptedRunner(),
            progress=False,
        )
    png = tmp_path / "bars.png"
    result = CliRunner().invoke(
        app,
        ["compare", str(tmp_path / "base"), str(tmp_path / "trained"), "--out", str(png)],
        terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    assert "base" in result.output and "trained" in result.output and "avg@4 50.0" in result.output
    assert png.stat().st_size > 1000
    bad = CliRunner().invoke(app, ["compare", str(tmp_path), "--out", str(png)])
    assert bad.exit_code == 2 and "results.json does not exist" in " ".join(bad.output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--benchmark", "aime2024"], "unknown benchmark 'aime2024'"),
        (["--benchmark", "X", "--protocol", "tools"], "unknown protocol 'tools'"),
        (["--benchmark", "X", "--preset", "best"], "unknown preset 'best'"),
        (["--benchmark", "X", "--k", "0"], "must be >= 1"),
        (["--benchmark", "X", "--top-p", "0"], "top_p must be in (0, 1]"),
        (["--benchmark", "X", "--protocol", "cot", "--max-turns", "3"], "single-turn"),
        (["--benchmark", "X", "--field", "answer"], "TASK_FIELD=COLUMN"),
        (["--benchmark", "X", "--engine", "tgi"], "engine must be one of ('vllm', 'hf')"),
        (["--benchmark", "X", "--sandbox", "none"], "sandbox must be one of"),
        (["--benchmark", "X", "--chunk-size", "0"], "chunk_size must be >= 1"),
    ],
)
def test_eval_command_user_errors(app: typer.Typer, tmp_path: Path, args: list[str], message: str) -> None:
    bench = write_benchmark(tmp_path / "x.jsonl", ["a"])
    args = [str(bench) if a == "X" else a for a in args]
    result = CliRunner().invoke(
        app, ["eval", "--model", "tiny", "--out", str(tmp_path / "o"), *args], terminal_width=200
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())  # rich wraps long lines
