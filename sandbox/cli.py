"""`stare-agents sandbox ...` commands: build the image, check the setup."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from stare_agents.sandbox.docker_backend import DEFAULT_IMAGE

app = typer.Typer(help="sandbox commands", no_args_is_help=True)
console = Console()


@app.command()
def build(
    offline: bool = typer.Option(
        False, "--offline", help="no registry: debootstrap Debian from a mirror and `docker import` it (root)"
    ),
    tag: str = typer.Option(DEFAULT_IMAGE, help="image tag"),
    force: bool = typer.Option(False, "--force", help="rebuild even if the image exists"),
    mirror: str = typer.Option("http://deb.debian.org/debian", help="Debian mirror (--offline)"),
    rootfs: Path | None = typer.Option(
        None, help="keep the debootstrapped tree here and reuse it next time (--offline)"
    ),
) -> None:
    """Build the sandbox image (python3 with numpy, scipy, sympy; user 1000)."""
    from stare_agents.sandbox.errors import SandboxError
    from stare_agents.sandbox.image import build_image, image_exists

    try:
        if image_exists(tag) and not force:
            console.print(f"{tag} already exists (use --force to rebuild)")
            return
        build_image(tag, offline=offline, mirror=mirror, rootfs=rootfs, log=console.print)
    except SandboxError as exc:
        console.print(f"[red]build failed:[/red] {exc}")
        raise typer.Exit(1) from exc


@app.command()
def doctor(
    image: str = typer.Option(DEFAULT_IMAGE, help="image to check"),
    runtime: str | None = typer.Option(
        None, help="container runtime to check, e.g. runsc (gVisor); default: the engine's (runc)"
    ),
) -> None:
    """Report the engine, the runtimes, the image, every limit, the syscall filter, isolation between
    sessions and a round trip."""
    from stare_agents.sandbox.doctor import run_doctor

    with console.status(f"checking the Docker sandbox{f' under {runtime}' if runtime else ''}"):
        checks = run_doctor(image, runtime)
    table = Table("check", "", "detail")
    for check in checks:
        table.add_row(check.name, "[green]ok[/green]" if check.ok else "[red]FAIL[/red]", check.detail)
    console.print(table)
    if not all(check.ok for check in checks):
        console.print(
            "[red]the Docker sandbox is not ready[/red]; make_sandbox('auto') would use LocalSandbox"
        )
        raise typer.Exit(1)
