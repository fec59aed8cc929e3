"""``ridgeline verify`` and ``ridgeline demo``: a served plan checked at its demand, and the
whole loop on this machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import (
    DbOption,
    JsonOption,
    ZooOption,
    err,
    failing,
    opened_store,
    out,
)
from ridgeline.cli._exit import loop_code, verify_code


def verify(
    plan: Annotated[Path, typer.Argument(help="the plan YAML the server runs")],
    target: Annotated[
        str, typer.Argument(help="its pipeline's v2 URL, e.g. http://127.0.0.1:8000/v2/models/NAME")
    ],
    seconds: Annotated[
        float,
        typer.Option(
            help="length of each step at the demand, s: one per arrival process the plan "
            "was checked under (its checked_arrivals; Poisson when it names none)"
        ),
    ] = 10.0,
    max_fail: Annotated[
        float, typer.Option(help="largest share of errors, timeouts and drops that passes")
    ] = 0.01,
    search: Annotated[bool, typer.Option(help="also measure the capacity (the margin)")] = True,
    as_json: JsonOption = False,
) -> None:
    """Probe a served plan at its planned demand: pass or fail against its SLO, and the
    margin its measured capacity leaves. Exit status 0 on PASS, 1 on FAIL (the server
    missed its SLO), 3 on INCONCLUSIVE (the host was too busy to measure)."""
    import asyncio

    from ridgeline.aio import cancelled_on_signal, run_coroutine, signal_name
    from ridgeline.errors import RunInterrupted
    from ridgeline.loop.verify import verify as verify_plan
    from ridgeline.pipeline.plan import load_plan

    got: list[int] = []
    with failing(flags={"duration_s": "--seconds"}):
        checking = verify_plan(
            load_plan(plan),
            target,
            seconds=seconds,
            max_fail=max_fail,
            search=search,
            say=lambda line: err.print(f"verify: {line}", highlight=False),
        )
        try:
            result = run_coroutine(cancelled_on_signal(checking, got))
        except asyncio.CancelledError:
            raise RunInterrupted(
                None, f"verify interrupted by {signal_name(got)}: no verdict (verify stores no run)"
            ) from None
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        out.print(result.summary())
    raise typer.Exit(verify_code(result))


def demo(
    out_dir: Annotated[
        Path, typer.Option("--out", help="where the plan, profiles and report go")
    ] = Path("ridgeline-demo"),
    zoo: ZooOption = None,
    short: Annotated[bool, typer.Option(help="a quick pass: fewer points, shorter phases")] = False,
    db: DbOption = None,
) -> None:
    """The whole loop on this machine: profile the example pipeline on CPU, plan it, serve
    it, verify it at its demand, move the demand up and back down while it reconfigures
    live, and write one HTML report. Its verdict is verify's at the demand, then the demand
    phases': more than 1 % of their requests dropped, failed or later than the SLO (outside
    the seconds right after each change of demand) is a FAIL, and so is a request lost.
    Exit status 0 PASS, 1 FAIL, 3 INCONCLUSIVE (the host too busy to measure)."""
    from ridgeline.errors import HostTooSmall
    from ridgeline.loop.demo import REPORT, SHORT, run_demo
    from ridgeline.report.loop_html import write_loop_report
    from ridgeline.report.terminal import demo_summary

    with failing(), opened_store(db) as store:
        try:
            result = run_demo(
                out_dir, zoo=zoo, cfg=SHORT if short else None, say=out.print, store=store
            )
        except HostTooSmall as exc:  # the host's, not the plan's
            out.print(f"verdict: INCONCLUSIVE: {exc}")
            raise typer.Exit(loop_code("INCONCLUSIVE")) from None
        report = write_loop_report(result, out_dir / REPORT)
    for line in demo_summary(result, report):
        out.print(line)
    raise typer.Exit(loop_code(result.verdict))
