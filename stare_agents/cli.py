"""The `stare-agents` command line."""

from __future__ import annotations

from pathlib import Path

import typer

from stare_agents import __version__
from stare_agents.envs.cli import app as envs_app
from stare_agents.eval.cli import compare_command, eval_command
from stare_agents.sandbox.cli import app as sandbox_app

app = typer.Typer(
    name="stare-agents",
    help="Train and evaluate tool-using LLM agents with STARE (surprisal-guided token-level advantage reweighting).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.add_typer(sandbox_app, name="sandbox", help="Build, check and benchmark the Docker Python sandbox.")
app.add_typer(envs_app, name="envs", help="List and check the registered Gymnasium environments.")
app.command("eval")(eval_command)
app.command("compare")(compare_command)


@app.command()
def demo(
    steps: int = typer.Option(300, help="Training steps for each algorithm."),
    target_entropy: float = typer.Option(0.3, help="STARE's entropy target H_tgt."),
    w: float = typer.Option(
        1.1, help="STARE's amplification W of the top-surprisal positive-advantage tokens."
    ),
    top_ratio: float = typer.Option(0.1, help="STARE's top fraction P of tokens that are reweighted."),
    seed: int = typer.Option(0, help="Random seed."),
    output_dir: Path = typer.Option(Path("outputs/demo"), help="Where the plot and metrics are written."),
) -> None:
    """Entropy simulation: the same synthetic softmax policy trained with GRPO and with STARE.

    GRPO collapses the policy entropy; STARE's gated reweighting holds it near the target. Prints a
    summary table and writes entropy.png and metrics.json to OUTPUT_DIR.
    """
    from stare_agents.demo import run_demo

    run_demo(
        steps=steps, target_entropy=target_entropy, w=w, top_ratio=top_ratio, seed=seed, output_dir=output_dir
    )


@app.command()
def version() -> None:
    """Print the installed version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
