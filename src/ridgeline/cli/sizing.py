"""``ridgeline allocate`` and ``ridgeline registry``: replicas and GPUs for a demand, and the
registry of models measured on hardware."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from ridgeline.cli._common import DbOption, JsonOption, emit, failing, opened_store, out
from ridgeline.sizing.allocator import AllocationInputs

if TYPE_CHECKING:
    from ridgeline.sizing.registry import Registry

T = TypeVar("T")


def _help(name: str) -> str:
    return AllocationInputs.model_fields[name].description or name


def allocate_command(
    capacity_rps: Annotated[float, typer.Option("--capacity-rps", help=_help("capacity_rps"))],
    demand_rps: Annotated[float, typer.Option("--demand-rps", help=_help("demand_rps"))],
    headroom: Annotated[float, typer.Option(help=_help("headroom"))] = 0.2,
    calibration: Annotated[
        float | None, typer.Option(help=_help("calibration") + " (default 1)")
    ] = None,
    calibration_from: Annotated[
        Path | None,
        typer.Option(
            help="the calibration measured by `ridgeline study vanguard --calibration FILE`"
        ),
    ] = None,
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
    as_json: JsonOption = False,
) -> None:
    """Replicas and GPUs that serve DEMAND within the SLO, and what a naive rule would buy."""
    from ridgeline.report.terminal import allocation_table
    from ridgeline.sizing.allocator import allocate, naive_rule

    with failing():
        factor = _calibration(calibration, calibration_from)
        rule = naive_rule(naive_utilisation, naive_max_rps, naive_slo_fraction)
        a = allocate(
            capacity_rps,
            demand_rps,
            headroom=headroom,
            calibration=factor,
            gpus_per_replica=gpus_per_replica,
            fractional_gpus=fractional_gpus,
            naive=rule,
        )
    if as_json:
        emit(a.model_dump_json(indent=2))
    else:
        out.print(allocation_table(a))


def _calibration(given: float | None, measured: Path | None) -> float:
    """``--calibration``, or the factor in ``--calibration-from``'s file (not both)."""
    from ridgeline.errors import ConfigError
    from ridgeline.sizing.calibration import read_calibration

    if measured is None:
        return 1.0 if given is None else given
    if given is not None:
        raise ConfigError(
            "--calibration and --calibration-from both give the calibration; keep one"
        )
    return read_calibration(measured).factor


registry_app = typer.Typer(
    help="Models measured on hardware: their capacity, versioned.", no_args_is_help=True
)


def _read(db: str | None, read: Callable[[Registry], T]) -> T:
    """``read`` over the registry in the run store ``db``; an error exits as ``fail`` does."""
    from ridgeline.sizing.registry import Registry

    with failing(), opened_store(db) as store, Registry(store) as reg:
        return read(reg)


@registry_app.command("list")
def registry_list(
    model: Annotated[str | None, typer.Option(help="only this model")] = None,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """List registered entries, oldest first."""
    from ridgeline.report.terminal import entries_table

    entries = _read(db, lambda reg: reg.list_entries(model))
    if as_json:
        emit(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
    else:
        out.print(entries_table(entries))


@registry_app.command("show")
def registry_show(
    model: Annotated[str, typer.Argument(help="model name")],
    version: Annotated[str | None, typer.Argument(help="version; default: the latest")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the latest revision of MODEL (of VERSION, when given)."""
    from ridgeline.report.terminal import entries_table

    entry = _read(db, lambda reg: reg.get(model, version))
    if as_json:
        emit(entry.model_dump_json(indent=2))
        return
    out.print(entries_table([entry]))
    out.print(f"digest {entry.digest}", markup=False, highlight=False)
    config = json.dumps(entry.serving_config, sort_keys=True)
    out.print(f"serving config {config}", markup=False, highlight=False)
