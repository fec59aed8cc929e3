"""``ridgeline allocate`` and ``ridgeline registry``: thin commands over the library.

Mounted by the main app::

    app.command("allocate")(allocate_command)
    app.add_typer(registry_app, name="registry")
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ridgeline._cli_common import DbOption, out
from ridgeline._cli_common import fail as _fail
from ridgeline.errors import RidgelineError
from ridgeline.sizing.allocator import Allocation, AllocationInputs, allocate, naive_rule
from ridgeline.sizing.registry import Registry, RegistryEntry
from ridgeline.telemetry.store import RunStore


def _help(name: str) -> str:
    return AllocationInputs.model_fields[name].description or name


def allocation_table(a: Allocation) -> Table:
    t = Table(title="allocation", title_justify="left", show_header=False)
    t.add_column("what", style="dim")
    t.add_column("value", justify="right")
    i, n, s = a.inputs, a.naive, a.overprovisioning_avoided
    t.add_row("demand × (1 + headroom)", f"{a.planned_rps:,.1f} req/s")
    t.add_row("per replica (capacity × calibration)", f"{a.per_replica_rps:,.1f} req/s")
    t.add_row("replicas", str(a.replicas))
    t.add_row("GPUs", f"{a.gpus:g}")
    t.add_row("utilisation at peak", f"{a.utilisation_at_peak:.0%}")
    t.add_row(
        f"naive: peak at {n.rule.target_utilisation:.0%} of max {n.max_throughput_rps:,.1f} req/s",
        f"{n.replicas} replicas, {n.gpus:g} GPUs",
    )
    t.add_row("GPUs avoided vs naive", f"{s.gpus:g} ({s.fraction:.0%}), {s.replicas} replicas")
    t.caption = f"{i.demand_rps:,.1f} req/s at {i.capacity_rps:,.1f} req/s per replica"
    t.caption_justify = "left"
    return t


def allocate_command(
    capacity_rps: Annotated[float, typer.Option("--capacity-rps", help=_help("capacity_rps"))],
    demand_rps: Annotated[float, typer.Option("--demand-rps", help=_help("demand_rps"))],
    headroom: Annotated[float, typer.Option(help=_help("headroom"))] = 0.2,
    calibration: Annotated[float, typer.Option(help=_help("calibration"))] = 1.0,
    gpus_per_replica: Annotated[float, typer.Option(help=_help("gpus_per_replica"))] = 1.0,
    fractional_gpus: Annotated[bool, typer.Option(help=_help("fractional_gpus"))] = False,
    naive_utilisation: Annotated[
        float, typer.Option(help="naive rule: provision for peak at this fraction of max")
    ] = 0.5,
    naive_max_rps: Annotated[
        float | None,
        typer.Option(help="naive rule: one replica's closed-loop max throughput, req/s"),
    ] = None,
    naive_slo_fraction: Annotated[
        float,
        typer.Option(help="naive rule: capacity / max throughput, when the max is not given"),
    ] = 0.75,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Replicas and GPUs that serve DEMAND within the SLO, and what a naive rule would buy."""
    try:
        rule = naive_rule(naive_utilisation, naive_max_rps, naive_slo_fraction)
        a = allocate(
            capacity_rps,
            demand_rps,
            headroom=headroom,
            calibration=calibration,
            gpus_per_replica=gpus_per_replica,
            fractional_gpus=fractional_gpus,
            naive=rule,
        )
    except RidgelineError as exc:
        _fail(exc)
    if as_json:
        print(a.model_dump_json(indent=2))
    else:
        out.print(allocation_table(a))


registry_app = typer.Typer(
    help="Models measured on hardware: their capacity, versioned.", no_args_is_help=True
)


def entries_table(entries: list[RegistryEntry]) -> Table:
    t = Table(title="registry", title_justify="left")
    for col in ("model", "version", "rev", "hardware", "capacity", "CI", "SLO", "run", "created"):
        t.add_column(col)
    for e in entries:
        c = e.capacity
        ci = "-" if c.ci_low is None or c.ci_high is None else f"{c.ci_low:.1f}–{c.ci_high:.1f}"
        t.add_row(
            Text(e.model),
            Text(e.version),
            str(e.revision),
            Text(e.hardware),
            f"{c.capacity_rps:,.1f} req/s",
            ci,
            Text(c.slo),
            "-" if c.run_id is None else str(c.run_id),
            e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    return t


@registry_app.command("list")
def registry_list(
    model: Annotated[str | None, typer.Option(help="only this model")] = None,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """List registered entries, oldest first."""
    try:
        with RunStore(db) as store, Registry(store) as reg:
            entries = reg.list_entries(model)
    except RidgelineError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
    else:
        out.print(entries_table(entries))


@registry_app.command("show")
def registry_show(
    model: Annotated[str, typer.Argument(help="model name")],
    version: Annotated[str | None, typer.Argument(help="version; default: the latest")] = None,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Show the latest revision of MODEL (of VERSION, when given)."""
    try:
        with RunStore(db) as store, Registry(store) as reg:
            entry = reg.get(model, version)
    except RidgelineError as exc:
        _fail(exc)
    if as_json:
        print(entry.model_dump_json(indent=2))
        return
    out.print(entries_table([entry]))
    out.print(f"digest {entry.digest}", markup=False, highlight=False)
    config = json.dumps(entry.serving_config, sort_keys=True)
    out.print(f"serving config {config}", markup=False, highlight=False)
