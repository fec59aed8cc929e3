"""``ridgeline runs list|show`` and ``ridgeline report``: runs kept in the run store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import DbOption, JsonOption, emit, failing, opened_store, out

app = typer.Typer(help="Runs kept in the run store.", no_args_is_help=True)


@app.command("list")
def runs_list(
    db: DbOption = None, limit: Annotated[int, typer.Option(min=1, help="newest N runs")] = 20
) -> None:
    """List the newest runs."""
    from ridgeline.report.terminal import runs_table

    with failing(), opened_store(db, reading=True) as store:
        out.print(runs_table(store.list_runs(limit)))


@app.command("show")
def runs_show(run_id: int, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Show one run: its steps and their windows."""
    from ridgeline.report._view import step_label
    from ridgeline.report.terminal import step_table
    from ridgeline.telemetry.summary import StepSummary

    with failing(), opened_store(db, reading=True) as store:
        run_ = store.get_run(run_id)
    if as_json:
        emit(json.dumps(run_, indent=2))
        return
    reason = f" ({run_['status_reason']})" if run_["status_reason"] else ""
    out.print(f"run {run_['id']} [{run_['kind']}] {run_['target']}: {run_['status']}{reason}")
    for step in run_["steps"]:
        summary = StepSummary.model_validate(step["summary"])
        out.print(step_table(summary, step_label(step["index"])))


def report_command(
    run_id: Annotated[int, typer.Argument(help="the run, as `ridgeline runs list` shows it")],
    out_path: Annotated[
        Path | None,
        typer.Option("--out", help="HTML file to write (default ./ridgeline-run-RUN_ID.html)"),
    ] = None,
    db: DbOption = None,
) -> None:
    """Write RUN_ID's report as one self-contained HTML file and print its summary."""
    from ridgeline.report.html import write_report
    from ridgeline.report.terminal import summary_table

    with failing():
        with opened_store(db, reading=True) as store:
            run = store.get_run(run_id)
        path = write_report(run, out_path or Path(f"ridgeline-run-{run_id}.html"))
        table = summary_table(run)
    out.print(table)
    out.print(f"report written to {path}", markup=False, highlight=False)


def analyze_command(
    run_ids: Annotated[
        list[int], typer.Argument(help="probe runs of one endpoint, as `ridgeline runs list` shows")
    ],
    truth: Annotated[
        float | None,
        typer.Option(help="the endpoint's capacity measured apart (long runs), req/s"),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """How alike repeated probes of one endpoint are (mean, SD, CV), and with --truth how
    far from it (bias and 95 % limits of agreement)."""
    from dataclasses import asdict

    from ridgeline.analysis.repeats import repeatability
    from ridgeline.errors import ConfigError
    from ridgeline.report.terminal import repeatability_table

    with failing():
        with opened_store(db, reading=True) as store:
            runs_ = [store.get_run(i) for i in run_ids]
        capacities = []
        for r in runs_:
            summary = r["summary"] or {}
            if r["kind"] != "probe" or summary.get("capacity_rps") is None:
                raise ConfigError(
                    f"run {r['id']} ({r['kind']}, {r['status']}) has no capacity: give "
                    "probe runs that found one"
                )
            capacities.append(float(summary["capacity_rps"]))
        targets = sorted({r["target"] for r in runs_})
        if len(targets) > 1:
            raise ConfigError(
                f"the runs probed {len(targets)} endpoints ({', '.join(targets)}); analyse "
                "the repeated probes of one endpoint at a time"
            )
        result = repeatability(capacities, truth)
    if as_json:
        emit(json.dumps({"target": targets[0], "runs": run_ids, **asdict(result)}, indent=2))
    else:
        out.print(repeatability_table(result, targets[0]))
