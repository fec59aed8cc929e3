"""What every command module shares: the consoles, the --db option, the error exit."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from rich.console import Console

from ridgeline.errors import RidgelineError, RunInterrupted
from ridgeline.telemetry.store import default_store_path

out = Console()
err = Console(stderr=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"run store: a SQLite file path (default {default_store_path()}, or $RIDGELINE_DB)",
    ),
]


def fail(exc: RidgelineError) -> NoReturn:
    """Print ``error: ...`` to stderr and exit 2 (130 for an interrupted run)."""
    err.print(f"[red]error:[/] {exc}", highlight=False)
    raise typer.Exit(130 if isinstance(exc, RunInterrupted) else 2)
