"""``ridgeline profile`` and ``ridgeline plan``: a pipeline's profile table (measured on this
host's CPU, modelled for GPUs) and its plan (the MILP, then the MIG layout)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ridgeline.cli._common import JsonOption, ZooOption, err, failing, from_option, out
from ridgeline.errors import ConfigError, RunInterrupted
from ridgeline.pipeline.gpu import compute_slices, gpu_type, parse_gpus

if TYPE_CHECKING:
    from ridgeline.pipeline.placement import Placement
    from ridgeline.pipeline.plan import Plan
    from ridgeline.pipeline.planner import PlanResult
    from ridgeline.pipeline.profiles import ProfileRow
    from ridgeline.plansim.check import CheckedPlan

SpecArgument = Annotated[Path, typer.Argument(help="pipeline spec YAML (examples/specs/)")]
"""The pipeline spec ``profile`` measures and ``plan`` plans."""


def profile_command(
    spec: SpecArgument,
    out_path: Annotated[
        Path, typer.Option("--out", help="profile table CSV to write (what `plan` reads)")
    ] = Path("profiles.csv"),
    zoo: ZooOption = None,
    cores: Annotated[str, typer.Option(help="core counts to measure on, e.g. 1,2")] = "1",
    batches: Annotated[str, typer.Option(help="batch sizes, e.g. 1,2,4,8")] = "1,2,4,8",
    seconds: Annotated[float, typer.Option(help="measured seconds per point")] = 3.0,
    gpus: Annotated[
        str, typer.Option(help="GPU types to add roofline rows for, e.g. A100-80GB,H100-80GB")
    ] = "",
    as_json: JsonOption = False,
) -> None:
    """Measure every variant of a pipeline spec on this host's CPU (the serving runtime,
    one instance per core count and batch size), add roofline rows for GPU types (fitted
    to public GPU measurements: calibrated on A100-80GB, modelled on the others), and
    write the profile table `ridgeline plan` reads."""
    from ridgeline.aio import run_coroutine
    from ridgeline.loop.profiling import ensure_zoo, measure_cpu, model_gpus
    from ridgeline.pipeline.profiles import ProfileTable
    from ridgeline.pipeline.spec import load_spec
    from ridgeline.report.terminal import measured_table, profile_summary
    from ridgeline.serve.loading import zoo_dir

    with failing():
        writable(out_path, "--out")
        s = load_spec(spec)
        core_counts, sizes = _ints(cores, "--cores"), _ints(batches, "--batches")
        types = [gpu_type(g.strip()).name for g in gpus.split(",") if g.strip()]
        where = zoo or zoo_dir()
        manifest = ensure_zoo(s, where)
        measured: list[ProfileRow] = []

        def kept(row: ProfileRow) -> None:
            measured.append(row)
            _progress(row)

        try:
            measuring = measure_cpu(
                s, where, core_counts, sizes, seconds, spec_dir=spec.parent, on_row=kept
            )
            table = run_coroutine(measuring)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the rows measured are not thrown away
            if measured:
                out_path.write_text(ProfileTable(measured).to_csv())
            raise RunInterrupted(
                None,
                f"interrupted: {len(measured)} measured row(s) written to {out_path} (a partial "
                "table; run profile again for the rest)"
                if measured
                else f"interrupted before the first row was measured; {out_path} not written",
            ) from None
        modelled = model_gpus(s, table, types, sizes, manifest) if types else None
        if modelled is not None:
            table = ProfileTable([*table, *modelled.rows])
        out_path.write_text(table.to_csv())
    if as_json:
        doc = {
            "rows": [dataclasses.asdict(r) for r in table],
            "cpu_factor": None if modelled is None else modelled.cpu_factor,
        }
        out.print_json(json.dumps(doc))
    else:
        out.print(measured_table(table))
        out.print(
            profile_summary(modelled, out_path), markup=False, highlight=False, soft_wrap=True
        )


def _progress(row: ProfileRow) -> None:
    err.print(
        f"{row.variant} {row.segment} batch {row.batch}: {row.latency_ms:.2f} ms, "
        f"{row.throughput_rps:,.1f} rows/s",
        highlight=False,
    )


def writable(path: Path | None, option: str) -> None:
    """Refuse, before any work, an output path that cannot be written: a directory, or a
    file in a folder that does not exist."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file path, e.g. {path}/out")
    if not path.parent.is_dir():
        raise ConfigError(
            f"{option} {path}: folder {path.parent} does not exist; create it or write elsewhere"
        )


def _ints(text: str, option: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]{1,6}", p) and int(p) >= 1 for p in parts):
        raise ConfigError(f"{option} {text!r}: write positive integers with commas, e.g. 1,2,4")
    return sorted({int(p) for p in parts})


def result_json(r: PlanResult) -> dict[str, Any]:
    return {
        "pipeline": r.spec.name,
        "demand_rps": r.spec.demand_rps,
        "features": r.features.label,
        "slices": r.slices,
        "slices_used": r.slices_used,
        "memory_slices": r.memory_slices,
        "cost": r.cost,
        "available": r.available,
        "accuracy": r.accuracy,
        "graph_accuracy": r.graph_accuracy,
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
    spec: SpecArgument,
    profiles: Annotated[Path, typer.Option(help="profile table CSV (`ridgeline profile`)")],
    gpus: Annotated[
        str, typer.Option(help="GPUs: COUNTxTYPE[,...], e.g. 8xA100-80GB; or Ncpu for cores")
    ] = "8xA100-80GB",
    demand: Annotated[
        float | None, typer.Option(help="demand, req/s (default: the spec's)")
    ] = None,
    features: Annotated[str, typer.Option(help="A,S,T subset or none (ablation)")] = "A,S,T",
    objective: Annotated[str, typer.Option(help="slices (then accuracy) or accuracy")] = "slices",
    accuracy_scope: Annotated[
        str,
        typer.Option(
            help="where the accuracy floor holds: path (every source-to-sink path) or "
            "graph (the product over every task)"
        ),
    ] = "path",
    find_max_demand: Annotated[
        bool, typer.Option("--max-demand", help="find the largest demand the GPUs serve")
    ] = False,
    out_plan: Annotated[
        Path | None, typer.Option("--out", help="write the Plan YAML that `serve` runs")
    ] = None,
    mig_parted: Annotated[
        Path | None, typer.Option(help="write the GPUs' MIG layout as a mig-parted config")
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="serve each plan in the simulator before returning it, and size it up "
            "until the simulation meets the SLO (violations < 0.5 %)",
        ),
    ] = True,
    check_arrivals: Annotated[
        str,
        typer.Option(
            help="arrivals the check simulates, comma-separated: poisson, gamma:cv=2, "
            "trace:BUNDLED (the shipped production trace, copies overlaid to the demand: "
            "that many times its users), trace-speed:BUNDLED (the one trace sped up to the "
            "demand: the stress case), trace:FILE.csv",
        ),
    ] = "poisson,trace:BUNDLED",
    as_json: JsonOption = False,
) -> None:
    """Plan a pipeline by MILP (HiGHS): per task the variant, segment (MIG slice, MPS
    share or a whole GPU), batch size and instances, so every path meets the SLO and
    accuracy stays above its floor at the least cost; check it in the served-plan
    simulator (sized up until it meets the SLO there); then lay the MIG instances out
    on the GPUs."""
    from ridgeline.errors import InfeasiblePlan
    from ridgeline.pipeline.plan import dump_plan
    from ridgeline.pipeline.planned import max_demand, to_plan
    from ridgeline.pipeline.planner import Features, PlannerOptions, plan_pipeline
    from ridgeline.pipeline.profiles import load_profiles
    from ridgeline.pipeline.spec import PipelineSpec, load_spec
    from ridgeline.plansim.check import CheckConfig, checked_plan
    from ridgeline.report.terminal import plan_table

    with failing():
        if objective not in ("slices", "accuracy"):
            raise typer.BadParameter("--objective must be slices or accuracy")
        writable(out_plan, "--out")
        writable(mig_parted, "--mig-parted")
        s = load_spec(spec)
        if demand is not None:
            with from_option("--demand"):
                s = s.at_demand(demand)
        table = load_profiles(profiles)
        with from_option("--gpus"):
            available = available_for(gpus)
        if accuracy_scope not in ("path", "graph"):
            raise typer.BadParameter("--accuracy-scope must be path or graph")
        options = PlannerOptions(
            objective="slices" if objective == "slices" else "accuracy",
            accuracy_scope="graph" if accuracy_scope == "graph" else "path",
        )
        with from_option("--features"):
            f = Features.parse(features)
        checking = CheckConfig(arrivals=_arrivals(check_arrivals))
        checked: dict[float, CheckedPlan] = {}

        def make(moved: PipelineSpec) -> PlanResult:
            if not check:
                return plan_pipeline(moved, table, available, f, options)
            got = checked_plan(moved, table, available, f, options, checking)
            checked[moved.demand_rps] = got
            return got.result

        if find_max_demand:
            top, result = max_demand(s, make)
            if result is None:
                raise InfeasiblePlan(f"no demand fits {gpus} under {f.label}", "resources")
            if not as_json:
                out.print(f"max demand on {gpus} ({f.label}): {top:,.1f} req/s")
        else:
            top = s.demand_rps
            result = make(s)
        verdict = checked.get(top)
        placement = _place(result, gpus)
        if as_json:
            doc = result_json(result)
            if placement is not None:
                doc["placement"] = {"gpus": placement.gpus, "devices": placement.device_map()}
            if find_max_demand:
                doc = {"max_demand_rps": top, **doc}
            if verdict is not None:
                doc["check"] = _check_json(verdict)
            out.print_json(json.dumps(doc))
        else:
            out.print(plan_table(result))
            if verdict is not None:
                out.print(_check_line(verdict), markup=False, highlight=False, soft_wrap=True)
            if placement is not None:
                used = ", ".join(f"{n} × {g}" for g, n in placement.gpus.items())
                out.print(f"placed on {used} ({len(placement.slots)} MIG instances)")
        if mig_parted is not None and placement is not None:
            mig_parted.write_text(placement.mig_parted())
        if out_plan is not None:
            served = verdict.plan if verdict is not None else to_plan(result)
            out_plan.write_text(dump_plan(_on_gpus(served, placement)))
            if not as_json:
                out.print(f"plan written to {out_plan}; serve it with `ridgeline serve {out_plan}`")


def _on_gpus(plan: Plan, placement: Placement | None) -> Plan:
    """The plan with each GPU task's instances on the GPUs the layout chose (``gpus``),
    so the server takes its MIG devices there."""
    if placement is None:
        return plan
    where = placement.device_map()
    tasks = {
        name: t.model_copy(update={"gpus": tuple(g for g, _, _ in where[name])})
        if name in where
        else t
        for name, t in plan.tasks.items()
    }
    return plan.model_copy(update={"tasks": tasks})


def _arrivals(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    if not parts:
        raise ConfigError("--check-arrivals is empty: give e.g. poisson, or poisson,trace:BUNDLED")
    return parts


def _check_json(c: CheckedPlan) -> dict[str, Any]:
    return {
        "sized_for_rps": c.sized_for_rps,
        "headroom": c.headroom,
        "rounds": [{"sized_for_rps": d, "verdict": v} for d, v in c.rounds],
        "runs": [
            {
                "arrivals": r.arrivals,
                "requests": r.requests,
                "violation_rate": r.violation_rate,
                "dropped": r.dropped,
                "late": r.late,
                "latency_ms": r.latency_ms,
            }
            for r in c.runs
        ],
    }


def _check_line(c: CheckedPlan) -> str:
    runs = "; ".join(
        f"{r.arrivals.split(',')[0]}: {r.violation_rate:.2%} late or dropped, p99 "
        f"{(r.latency_ms.get('p99') or 0):.1f} ms of {r.requests:,} requests"
        for r in c.runs
    )
    sized = (
        ""
        if c.headroom == 1
        else f" (sized for {c.sized_for_rps:,.1f} req/s, {c.headroom:.2f}× the demand, after "
        f"{len(c.rounds) - 1} failed round(s))"
    )
    return f"checked in the served-plan simulator{sized}: {runs}"


def _place(result: PlanResult, gpus: str) -> Placement | None:
    """The plan's MIG instances on physical GPUs (None on CPU)."""
    from ridgeline.pipeline.placement import place
    from ridgeline.pipeline.planned import to_plan
    from ridgeline.pipeline.segments import CPU

    if all(pool == CPU for pool in result.slices):
        return None
    return place(to_plan(result), parse_gpus(gpus))


def available_for(gpus: str) -> dict[str, float]:
    """``8xA100-80GB`` → 56 compute slices; ``2cpu`` → 2 cores."""
    from ridgeline.pipeline.segments import CPU

    if gpus.endswith(CPU) and re.fullmatch(r"[0-9]{1,6}", gpus[: -len(CPU)]):
        return {CPU: float(gpus[: -len(CPU)])}
    return compute_slices(gpus)
