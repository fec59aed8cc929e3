"""``ridgeline profile``: a thin command over ``profiling`` and ``roofline`` (mounted by
the main app as ``app.command("profile")(profile_command)``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ridgeline._cli_common import err, out
from ridgeline._cli_common import fail as _fail
from ridgeline.aio import run_coroutine
from ridgeline.errors import ConfigError, RidgelineError
from ridgeline.pipeline.gpu import gpu_type
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
from ridgeline.pipeline.profiling import Modelled, ensure_zoo, measure_cpu, model_gpus
from ridgeline.pipeline.spec import load_spec
from ridgeline.serve.loading import zoo_dir


def measured_table(table: ProfileTable) -> Table:
    measured = [r for r in table if r.source == "measured"]
    t = Table(title=f"measured on this host's CPU ({len(measured)} rows)", title_justify="left")
    for col in ("variant", "segment", "batch", "latency ms", "rows/s"):
        t.add_column(col, justify="left" if col in ("variant", "segment") else "right")
    for r in measured:
        rate = f"{r.throughput_rps:,.1f}"
        t.add_row(r.variant, r.segment, str(r.batch), f"{r.latency_ms:.2f}", rate)
    return t


def summary_line(modelled: Modelled | None, out_path: Path) -> str:
    note = f"written to {out_path}"
    if modelled is None:
        return note
    how = (
        f"calibrated ×{modelled.calibration:.3g} by {modelled.basis} measured rows"
        if modelled.basis
        else "uncalibrated: no measured row's model has known FLOPs"
    )
    return f"{len(modelled.rows)} modelled GPU rows ({how}); {note}"


def profile_command(
    spec: Annotated[Path, typer.Argument(help="pipeline spec YAML (examples/specs/)")],
    out_path: Annotated[
        Path, typer.Option("--out", help="profile table CSV to write (what `plan` reads)")
    ] = Path("profiles.csv"),
    zoo: Annotated[
        Path | None, typer.Option(help="model zoo directory (default $RIDGELINE_ZOO or cache)")
    ] = None,
    cores: Annotated[str, typer.Option(help="core counts to measure on, e.g. 1,2")] = "1",
    batches: Annotated[str, typer.Option(help="batch sizes, e.g. 1,2,4,8")] = "1,2,4,8",
    seconds: Annotated[float, typer.Option(help="measured seconds per point")] = 3.0,
    gpus: Annotated[
        str, typer.Option(help="GPU types to add roofline rows for, e.g. A100-80GB,H100-80GB")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
) -> None:
    """Measure every variant of a pipeline spec on this host's CPU (the serving runtime,
    one instance per core count and batch size), add roofline rows for GPU types
    calibrated by them, and write the profile table `ridgeline plan` reads."""
    try:
        s = load_spec(spec)
        core_counts, sizes = _ints(cores, "--cores"), _ints(batches, "--batches")
        types = [gpu_type(g.strip()).name for g in gpus.split(",") if g.strip()]
        where = zoo or zoo_dir()
        manifest = ensure_zoo(s, where)
        table = run_coroutine(
            measure_cpu(
                s, where, core_counts, sizes, seconds, spec_dir=spec.parent, on_row=_progress
            )
        )
        modelled = model_gpus(s, table, types, sizes, manifest) if types else None
        if modelled is not None:
            table = ProfileTable([*table, *modelled.rows])
        out_path.write_text(table.to_csv())
    except RidgelineError as exc:
        _fail(exc)
    if as_json:
        doc = {
            "rows": [dataclasses.asdict(r) for r in table],
            "calibration": None if modelled is None else modelled.calibration,
        }
        out.print_json(json.dumps(doc))
    else:
        out.print(measured_table(table))
        out.print(summary_line(modelled, out_path), markup=False, highlight=False, soft_wrap=True)


def _progress(row: ProfileRow) -> None:
    err.print(
        f"{row.variant} {row.segment} batch {row.batch}: {row.latency_ms:.2f} ms, "
        f"{row.throughput_rps:,.1f} rows/s",
        highlight=False,
    )


def _ints(text: str, option: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ConfigError(f"{option} {text!r}: write positive integers with commas, e.g. 1,2,4")
    return sorted({int(p) for p in parts})
