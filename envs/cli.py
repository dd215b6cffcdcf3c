"""`stare-agents envs ...` commands: list the registered environments, check one with check_env."""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Gymnasium environments: list, check.", no_args_is_help=True)
console = Console()


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
    env_id: str = typer.Argument(..., help="a registered id, e.g. stare_agents/MathTIR-v0"),
    backend: str = typer.Option(
        "docker", help="sandbox for tool environments: docker, or local (needs STARE_ALLOW_LOCAL_SANDBOX=1)"
    ),
    seed: int = typer.Option(0, help="seed for the determinism checks"),
) -> None:
    """Run check_env on an environment (made with its defaults) and report the result."""
    import gymnasium as gym

    import stare_agents.envs  # noqa: F401  (registers the ids)
    from stare_agents.envs.checker import EnvCheckError, check_env

    try:
        spec = gym.spec(env_id)
    except gym.error.Error as error:
        console.print(f"[red]unknown environment {env_id!r}[/red]: {error}")
        raise typer.Exit(2) from error
    env_class = spec.entry_point if not isinstance(spec.entry_point, str) else None
    if env_class is None:
        module, _, name = spec.entry_point.partition(":")
        env_class = getattr(__import__(module, fromlist=[name]), name)
    sandbox = None
    kwargs = {}
    if getattr(env_class, "uses_sandbox", False):
        from stare_agents.sandbox import make_sandbox

        sandbox = make_sandbox(backend, pool_size=2)  # type: ignore[arg-type]
        kwargs["sandbox"] = sandbox
    started = time.perf_counter()
    try:
        env = gym.make(env_id, **kwargs)
        check_env(env, seed=seed)
    except EnvCheckError as error:
        console.print(f"[red]FAILED[/red] {env_id}: {error}")
        raise typer.Exit(1) from error
    finally:
        if sandbox is not None:
            sandbox.close()
    console.print(f"[green]ok[/green] {env_id} passed check_env in {time.perf_counter() - started:.2f} s")


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
) -> None:
    """Write an environment's seeded tasks as a benchmark file (`stare-agents eval --benchmark FILE`).

    The defaults are the trainer's held-out evaluation tasks: the held-out split, seeds from `env.eval_seed`
    (1,000,000), a seed whose problem an earlier seed drew skipped, so every id in the file is unique."""
    import json

    import gymnasium as gym

    import stare_agents.envs  # noqa: F401  (registers the ids)
    from stare_agents.envs.registration import split_kwargs
    from stare_agents.envs.tasks import unique_tasks

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
            handle.write(json.dumps({"id": task.id, "problem": task.problem, "answer": task.answer}) + "\n")
    console.print(f"wrote {len(tasks)} distinct {split} tasks of {env_id} to {out}")
