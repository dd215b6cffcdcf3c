"""`stare-agents eval` and `stare-agents compare` (registered in stare_agents/cli.py)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError)


def _split(values: list[str]) -> list[str]:
    """`--benchmark a --benchmark b,c` -> [a, b, c]."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def eval_command(
    model: str = typer.Option(
        ...,
        "--model",
        help="Model to evaluate: a local HF folder or checkpoint, 'tiny', 'smollm2-135m' or a hub id.",
    ),
    benchmark: list[str] = typer.Option(
        ...,
        "--benchmark",
        "-b",
        help="aime24, aime25, amc23, math500, minerva, olympiadbench, a .jsonl/.parquet file or a HF dataset id. "
        "Repeat the option or separate with commas.",
    ),
    out: Path = typer.Option(..., "--out", help="Output folder; run again with the same folder to resume."),
    protocol: str = typer.Option(
        "tir",
        help="tir (MathTIR-v0 defaults), cot (single turn), cot-long (the long-CoT prompt, 16k tokens), simpletir, "
        "arith, or one an --import module adds to stare_agents.eval.benchmarks.PROTOCOLS (for your own environment).",
    ),
    k: int | None = typer.Option(
        None, "--k", help="Samples per problem (the k of avg@k). Default: the preset's, else 1."
    ),
    preset: str | None = typer.Option(
        None, help="'paper': avg@32 on AIME/AMC, avg@4 on the rest, temperature 1.0, top_p 0.7."
    ),
    temperature: float | None = typer.Option(None, help="Sampling temperature (default: the protocol's)."),
    top_p: float | None = typer.Option(
        None, "--top-p", help="Nucleus sampling top_p (default: the protocol's)."
    ),
    max_turns: int | None = typer.Option(None, "--max-turns", help="Turn limit (tool protocols)."),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", help="Response token budget per episode (all turns together)."
    ),
    max_tokens_per_turn: int | None = typer.Option(None, "--max-tokens-per-turn", help="Tokens per turn."),
    workers: int = typer.Option(
        0, help="Ray rollout workers (one engine + one sandbox each); 0: in-process."
    ),
    limit: int | None = typer.Option(None, help="Only the first N problems of each benchmark."),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Folder of <name>.jsonl benchmark files (else $STARE_DATA_DIR, else ../shared/data/benchmarks).",
    ),
    field: list[str] = typer.Option(
        [],
        "--field",
        help="Column mapping for files/datasets: TASK_FIELD=COLUMN, e.g. --field answer=solution.",
    ),
    split: str = typer.Option("test", help="Split of Hugging Face dataset ids."),
    seed: int = typer.Option(0, help="Run seed (each sample's seed derives from it)."),
    engine: str = typer.Option("vllm", help="Inference engine: vllm or hf."),
    dtype: str = typer.Option(
        "auto", help="Model dtype: auto (the checkpoint's), float32, bfloat16 or fast."
    ),
    rendering: str = typer.Option(
        "auto", help="auto, chat (chat template, tool turns) or inline (one running assistant turn)."
    ),
    sandbox: str = typer.Option(
        "docker",
        help="Sandbox backend: docker, or local (model-written code on this host: needs STARE_ALLOW_LOCAL_SANDBOX=1).",
    ),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", help="Engine context window (default: 1024 + the response budget)."
    ),
    chunk_size: int = typer.Option(64, "--chunk-size", help="Samples per chunk written to samples.jsonl."),
    bootstrap: int = typer.Option(1000, help="Bootstrap resamples for the confidence intervals (0: none)."),
    imports: list[str] = typer.Option(
        [],
        "--import",
        help="A module that registers your environments and protocols (repeatable), also in every worker. The "
        "current folder is searched first, as uvicorn finds its app.",
    ),
) -> None:
    """Evaluate a model on math benchmarks: avg@k, pass@k with bootstrap intervals, behaviour analysis.

    Writes OUT/samples.jsonl (one line per sample, appended as they finish), OUT/results.json,
    OUT/results.md and OUT/pass_at_k.png. An interrupted run resumes when started again with the same
    --out and settings.
    """
    from stare_agents.eval.benchmarks import parse_fields
    from stare_agents.eval.harness import EvalConfig, evaluate

    try:
        config = EvalConfig(
            protocol=protocol,
            samples=k,
            preset=preset,
            temperature=temperature,
            top_p=top_p,
            max_turns=max_turns,
            max_tokens_per_turn=max_tokens_per_turn,
            max_total_tokens=max_tokens,
            limit=limit,
            data_dir=None if data_dir is None else str(data_dir),
            fields=parse_fields(field),
            split=split,
            workers=workers,
            engine=engine,
            dtype=dtype,
            rendering=rendering,
            sandbox=sandbox,
            max_model_len=max_model_len,
            seed=seed,
            chunk_size=chunk_size,
            bootstrap=bootstrap,
            imports=imports,
        )
        results = evaluate(model, _split(benchmark), config, out=out)
    except USER_ERRORS as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from error
    console.print(summary_table(results))
    console.print(f"wrote {out}/results.json, results.md, samples.jsonl, pass_at_k.png")


def summary_table(results: dict) -> Table:
    """One row per benchmark: avg@n, pass@1, pass@k (largest k), error rate."""
    from stare_agents.eval.report import metrics_of

    protocol = results["settings"]["protocol"]
    table = Table(
        title=f"{results['model'].get('name')} | {protocol['name']} | T={protocol['temperature']} "
        f"top_p={protocol['top_p']}  (%, 95% bootstrap intervals)"
    )
    for column in ("benchmark", "problems", "avg@n", "pass@1", "pass@k", "error rate"):
        table.add_column(column, justify="left" if column == "benchmark" else "right")
    for name, entry in results["benchmarks"].items():
        metrics = metrics_of(entry)
        if metrics is None:
            table.add_row(name, str(entry["problems_planned"]), "—", "—", "—", "—")
            continue
        top = max(metrics.pass_at)
        table.add_row(
            name,
            str(metrics.problems),
            f"avg@{metrics.samples_per_problem} {metrics.avg.format()}",
            metrics.pass_at[1].format(),
            f"pass@{top} {metrics.pass_at[top].format()}",
            f"{100 * metrics.error_rate:.1f} ({metrics.failed}/{metrics.samples})",
        )
    return table


def compare_command(
    runs: list[Path] = typer.Argument(..., help="Evaluation folders (each with a results.json)."),
    metric: str = typer.Option("avg", help="avg (avg@n), strict (failed samples count as wrong) or pass@K."),
    out: Path = typer.Option(Path("comparison.png"), "--out", help="Where the bar chart is written."),
) -> None:
    """Print evaluation runs side by side and write a bar chart (one group per benchmark, one bar per run)."""
    from stare_agents.eval.report import compare_runs

    try:
        table, _ = compare_runs(runs, metric=metric, out=out)
    except USER_ERRORS as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2) from error
    console.print(table)
    console.print(f"wrote {out}")
