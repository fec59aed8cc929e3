"""``ridgeline plan``: a thin command over ``planner`` (mounted by the main app as
``app.command("plan")(plan_command)``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ridgeline._cli_common import fail as _fail
from ridgeline._cli_common import out
from ridgeline.errors import InfeasiblePlan, RidgelineError
from ridgeline.pipeline.gpu import parse_gpus
from ridgeline.pipeline.placement import Placement, place
from ridgeline.pipeline.plan import dump_plan
from ridgeline.pipeline.planned import max_demand, to_plan
from ridgeline.pipeline.planner import Features, PlannerOptions, PlanResult, plan_pipeline
from ridgeline.pipeline.profiles import load_profiles
from ridgeline.pipeline.segments import CPU
from ridgeline.pipeline.spec import load_spec


def plan_table(r: PlanResult) -> Table:
    t = Table(title=f"plan: {r.spec.name} at {r.spec.demand_rps:g} req/s", title_justify="left")
    for col in ("task", "variant", "segment", "batch", "instances", "latency ms", "busy"):
        t.add_column(col, justify="right" if col not in ("task", "variant", "segment") else "left")
    for name, p in r.tasks.items():
        row = p.config.row
        t.add_row(
            name,
            p.variant,
            f"{row.pool} {row.segment}",
            str(row.batch),
            str(p.instances),
            f"{p.latency_ms:.1f}",
            f"{p.utilisation:.0%}",
        )
    used = ", ".join(f"{v:g} of {r.available[k]:g} on {k}" for k, v in r.slices.items())
    worst = max(r.path_latency_ms.values())
    t.caption = (
        f"slices {used}; accuracy {r.accuracy:.3f} of the best (floor "
        f"{r.spec.accuracy_floor:g}); slowest path {worst:.1f} ms of {r.spec.slo_ms:g}; "
        f"features {r.features.label}; solved in {r.solve_s * 1000:.0f} ms"
    )
    t.caption_justify = "left"
    return t


def result_json(r: PlanResult) -> dict[str, Any]:
    return {
        "pipeline": r.spec.name,
        "demand_rps": r.spec.demand_rps,
        "features": r.features.label,
        "slices": r.slices,
        "slices_used": r.slices_used,
        "available": r.available,
        "accuracy": r.accuracy,
        "solve_s": r.solve_s,
        "gap": r.gap,
        "tasks": {
            name: {
                "variant": p.variant,
                "pool": p.config.row.pool,
                "segment": p.config.row.segment,
                "batch": p.config.row.batch,
                "instances": p.instances,
                "latency_ms": p.latency_ms,
                "demand_rps": p.demand_rps,
            }
            for name, p in r.tasks.items()
        },
        "paths": {" -> ".join(k): v for k, v in r.path_latency_ms.items()},
    }


def plan_command(
    spec: Annotated[Path, typer.Argument(help="pipeline spec YAML (examples/specs/)")],
    profiles: Annotated[Path, typer.Option(help="profile table CSV (`ridgeline profile`)")],
    gpus: Annotated[
        str, typer.Option(help="GPUs: COUNTxTYPE[,...], e.g. 8xA100-80GB; or Ncpu for cores")
    ] = "8xA100-80GB",
    demand: Annotated[
        float | None, typer.Option(help="demand, req/s (default: the spec's)")
    ] = None,
    features: Annotated[str, typer.Option(help="A,S,T subset or none (ablation)")] = "A,S,T",
    objective: Annotated[str, typer.Option(help="slices (then accuracy) or accuracy")] = "slices",
    find_max_demand: Annotated[
        bool, typer.Option("--max-demand", help="find the largest demand the GPUs serve")
    ] = False,
    out_plan: Annotated[
        Path | None, typer.Option("--out", help="write the Plan YAML that `serve` runs")
    ] = None,
    mig_parted: Annotated[
        Path | None, typer.Option(help="write the GPUs' MIG layout as a mig-parted config")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Plan a pipeline by MILP (HiGHS): per task the variant, segment (MIG slice or MPS
    share), batch size and instances, so every path meets the SLO and accuracy stays
    above its floor on the fewest slices; then lay the MIG instances out on the GPUs."""
    try:
        if objective not in ("slices", "accuracy"):
            raise typer.BadParameter("--objective must be slices or accuracy")
        s = load_spec(spec)
        if demand is not None:
            s = s.model_copy(update={"demand_rps": demand})
        table = load_profiles(profiles)
        available = _available(gpus)
        options = PlannerOptions(objective="slices" if objective == "slices" else "accuracy")
        f = Features.parse(features)
        if find_max_demand:
            top, result = max_demand(s, table, available, f, options)
            if result is None:
                raise InfeasiblePlan(f"no demand fits {gpus} under {f.label}", "resources")
            if not as_json:
                out.print(f"max demand on {gpus} ({f.label}): {top:,.1f} req/s")
        else:
            result = plan_pipeline(s, table, available, f, options)
        placement = _place(result, gpus)
        if as_json:
            doc = result_json(result)
            if placement is not None:
                doc["placement"] = {"gpus": placement.gpus, "devices": placement.device_map()}
            if find_max_demand:
                doc = {"max_demand_rps": top, **doc}
            out.print_json(json.dumps(doc))
        else:
            out.print(plan_table(result))
            if placement is not None:
                used = ", ".join(f"{n} × {g}" for g, n in placement.gpus.items())
                out.print(f"placed on {used} ({len(placement.slots)} MIG instances)")
        if mig_parted is not None and placement is not None:
            mig_parted.write_text(placement.mig_parted())
        if out_plan is not None:
            out_plan.write_text(dump_plan(to_plan(result)))
            if not as_json:
                out.print(f"plan written to {out_plan}; serve it with `ridgeline serve {out_plan}`")
    except RidgelineError as exc:
        _fail(exc)


def _place(result: PlanResult, gpus: str) -> Placement | None:
    """The plan's MIG instances on physical GPUs (None on CPU)."""
    if all(pool == CPU for pool in result.slices):
        return None
    return place(to_plan(result), parse_gpus(gpus))


def _available(gpus: str) -> dict[str, float]:
    """``8xA100-80GB`` → 56 compute slices; ``2cpu`` → 2 cores."""
    if gpus.endswith(CPU) and gpus[: -len(CPU)].isdigit():
        return {CPU: float(gpus[: -len(CPU)])}
    return {name: 7.0 * n for name, n in parse_gpus(gpus).items()}
