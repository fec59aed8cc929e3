"""``ridgeline report RUN_ID``: write a run's HTML report and print its summary.

Mounted by the main app: ``app.command("report")(report_command)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ridgeline._cli_common import DbOption, out
from ridgeline._cli_common import fail as _fail
from ridgeline.errors import RidgelineError
from ridgeline.report.html import write_report
from ridgeline.report.terminal import summary_table
from ridgeline.telemetry.store import RunStore


def report_command(
    run_id: Annotated[int, typer.Argument(help="the run, as `ridgeline runs list` shows it")],
    out_path: Annotated[
        Path | None,
        typer.Option("--out", help="HTML file to write (default ./ridgeline-run-RUN_ID.html)"),
    ] = None,
    db: DbOption = None,
) -> None:
    """Write RUN_ID's report as one self-contained HTML file and print its summary."""
    try:
        with RunStore(db) as store:
            run = store.get_run(run_id)
        path = write_report(run, out_path or Path(f"ridgeline-run-{run_id}.html"))
        table = summary_table(run)
    except RidgelineError as exc:
        _fail(exc)
    out.print(table)
    out.print(f"report written to {path}", markup=False, highlight=False)
