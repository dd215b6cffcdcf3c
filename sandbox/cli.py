"""`stare-agents sandbox ...` commands."""

import typer

app = typer.Typer(help="sandbox commands", no_args_is_help=True)
