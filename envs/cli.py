"""`stare-agents envs ...` commands: list the registered environments, check one with check_env."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Gymnasium environments: list, check.", no_args_is_help=True)
console = Console()
IMPORT_HELP = (
    "a module that registers your environments (repeatable); the current folder is searched first, as uvicorn "
    "finds its app"
)


@app.command("list")
def list_envs() -> None:
    """List the registered stare_agents/* environments."""
    from stare_agents.envs.registration import ENVIRONMENTS

    table = Table("id", "what it is")
    for env_id, (_, description) in ENVIRONMENTS.items():
        table.add_row(env_id, description)
    console.print(table)


@app.command("check")
def check(
    env_id: str = typer.Argument(
        ..., help="a registered id (stare_agents/MathTIR-v0), yours after --import, or module:Name-v0"
    ),
    backend: str = typer.Option(
        "docker", help="sandbox for tool environments: docker, or local (needs STARE_ALLOW_LOCAL_SANDBOX=1)"
    ),
    seed: int = typer.Option(0, help="seed for the determinism checks"),
    imports: list[str] = typer.Option([], "--import", help=IMPORT_HELP),
    env_kwargs: str = typer.Option("{}", "--env-kwargs", help="JSON keyword arguments for the environment"),
) -> None:
    """Run check_env on an environment (made with its defaults, or --env-kwargs) and report the result."""

    import gymnasium as gym

    from stare_agents.envs.checker import EnvCheckError, check_env
    from stare_agents.envs.registration import accepted_kwargs, env_class, resolve_env_id, unknown_kwargs

    try:
        env_id = resolve_env_id(env_id, imports)
    except ValueError as error:
        console.print(f"[red]unknown environment[/red]: {error}", soft_wrap=True)
        raise typer.Exit(2) from error
    kwargs = _json_object(env_kwargs)
    unknown = unknown_kwargs(env_id, kwargs)
    if unknown:
        allowed = sorted((accepted_kwargs(env_id) or set()) - {"sandbox", "tools"})
        console.print(
            f"[red]--env-kwargs[/red]: {env_id} takes no keyword {unknown[0]!r} (value "
            f"{kwargs[unknown[0]]!r}); allowed: {allowed}",
            soft_wrap=True,
        )
        raise typer.Exit(2)
    sandbox = None
    if getattr(env_class(env_id), "uses_sandbox", False) and "sandbox" not in kwargs:
        from stare_agents.sandbox import make_sandbox

        sandbox = make_sandbox(backend, pool_size=2)  # type: ignore[arg-type]
        kwargs["sandbox"] = sandbox
    started = time.perf_counter()
    try:
        env = gym.make(env_id, **kwargs)
        check_env(env, seed=seed)
    except EnvCheckError as error:
        console.print(f"[red]FAILED[/red] {env_id}: {error}", soft_wrap=True)
        raise typer.Exit(1) from error
    finally:
        if sandbox is not None:
            sandbox.close()
    console.print(f"[green]ok[/green] {env_id} passed check_env in {time.perf_counter() - started:.2f} s")


def _json_object(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except ValueError as error:
        raise typer.BadParameter(f"not JSON: {error}", param_hint="--env-kwargs") from error
    if not isinstance(value, dict):
        raise typer.BadParameter(f"expected a JSON object, got {text!r}", param_hint="--env-kwargs")
    return value


@app.command("export")
def export(
    env_id: str = typer.Argument(
        ..., help="an environment that samples its own tasks, e.g. stare_agents/ArithmeticTIR-v0"
    ),
    out: str = typer.Option(..., help="JSONL file to write: one {id, problem, answer} per line"),
    first_seed: int = typer.Option(
        1_000_000, "--first-seed", help="tasks are drawn with reset(seed=first_seed + i), i = 0, 1, ..."
    ),
    count: int = typer.Option(48, help="how many tasks (all with distinct problems)"),
    split: str = typer.Option(
        "heldout", help="heldout or train, for environments that take a split (ArithmeticTIR-v0)"
    ),
    env_kwargs: str = typer.Option("{}", "--env-kwargs", help="JSON keyword arguments for the environment"),
    imports: list[str] = typer.Option([], "--import", help=IMPORT_HELP),
) -> None:
    """Write an environment's seeded tasks as a benchmark file (`stare-agents eval --benchmark FILE`).

    The defaults are the trainer's held-out evaluation tasks: the held-out split, seeds from `env.eval_seed`
    (1,000,000), a seed whose problem an earlier seed drew skipped, so every id in the file is unique."""
    import json

    import gymnasium as gym

    from stare_agents.envs.registration import resolve_env_id, split_kwargs
    from stare_agents.envs.tasks import unique_tasks

    try:
        env_id = resolve_env_id(env_id, imports)  # registers the stare_agents/* ids, imports yours
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="ENV_ID") from error
    if count < 1:
        raise typer.BadParameter(f"count must be >= 1, got {count}")
    if split not in ("heldout", "train"):
        raise typer.BadParameter(f"split must be heldout or train, got {split!r}")
    env = gym.make(env_id, **split_kwargs(env_id, json.loads(env_kwargs), split))
    try:
        tasks = unique_tasks(env, count, first_seed=first_seed)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    finally:
        env.close()
    with open(out, "w", encoding="utf-8") as handle:
        for task in tasks:
            row = {"id": task.id, "problem": task.problem, "answer": task.answer}
            handle.write(json.dumps(row, allow_nan=False) + "\n")
    console.print(f"wrote {len(tasks)} distinct {split} tasks of {env_id} to {out}")


@app.command("prepare-dapo-math")
def prepare_dapo_math(
    out: Path = typer.Option(..., help="the JSONL to write (the CoT recipes read data/dapo_math_17k.jsonl)"),
    source: str = typer.Option(
        "", help="a .parquet/.jsonl file or a Hugging Face dataset id (default: the hub's DAPO-Math-17k)"
    ),
) -> None:
    """Write DAPO-Math-17k (the official STARE CoT training set) as {problem, answer, id} rows.

    The package ships no training data: the CoT recipes name the file this writes. A hub id needs the network
    once (or the dataset in the Hugging Face cache)."""
    from stare_agents.envs.dapo_math import HUB_ID, prepare

    written = prepare(source or HUB_ID, out)
    typer.echo(f"{written} problems -> {out}")
