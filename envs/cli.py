"""`stare-agents envs ...` commands."""

import typer

app = typer.Typer(help="envs commands", no_args_is_help=True)
