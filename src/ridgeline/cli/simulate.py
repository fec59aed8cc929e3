"""``ridgeline simulate``: a plan served in virtual time, as the serving runtime would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import (
    ArrivalOption,
    DropOption,
    JsonOption,
    PlanArgument,
    RateOption,
    TargetRateOption,
    TraceOption,
    TraceScaleOption,
    emit,
    failing,
    out,
    warn,
)


def simulate(
    plan: PlanArgument,
    rate: RateOption = None,
    arrival: ArrivalOption = "poisson",
    trace: TraceOption = None,
    target_rate: TargetRateOption = None,
    trace_scale: TraceScaleOption = "overlay",
    duration: Annotated[float, typer.Option(help="arrival window, simulated seconds")] = 60.0,
    profiles: Annotated[
        Path | None,
        typer.Option(help="profile table CSV (`ridgeline profile`): the tasks' batch times"),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the arrivals and the batch-time noise")] = 0,
    noise_cv: Annotated[
        float | None,
        typer.Option(
            help="spread of batch times (lognormal, mean 1); default: a synthetic task's "
            "own noise_cv, 0.1 for a task timed by --profiles"
        ),
    ] = None,
    frontend_ms: Annotated[
        float,
        typer.Option(
            help="time a request spends in the server's front end (parsing, answering, "
            "hops), ms, one request at a time: a burst queues for it; measure it as served "
            "minus simulated p50 when nothing queues"
        ),
    ] = 0.0,
    cpu_cores: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="the host's CPU cores: CPU instances pinned to them as `ridgeline serve` "
            "pins them (in turn, wrapping round), and instances on one core share its time; "
            "default: every instance has its own processor",
        ),
    ] = None,
    drop: DropOption = True,
    as_json: JsonOption = False,
) -> None:
    """Simulate PLAN in virtual time as `ridgeline serve` would run it: the same batching
    and early dropping per task, fan-out along the edges, batch times from --profiles or
    the plan's synthetic models. Prints end-to-end latency percentiles of the answered,
    the SLO violation rate (drops and late answers), and each task's load."""
    from ridgeline.pipeline.plan import load_plan
    from ridgeline.pipeline.profiles import load_profiles
    from ridgeline.plansim import SimConfig, arrival_schedule, simulate_plan
    from ridgeline.report.simulation import simulation_report

    with failing(values=True):
        p = load_plan(plan)
        table = load_profiles(profiles) if profiles is not None else None
        schedule = arrival_schedule(
            arrival,
            rate=rate,
            trace=trace,
            target_rate=target_rate,
            trace_scale=trace_scale,  # type: ignore[arg-type]  # checked there
            duration_s=duration,
            seed=seed,
        )
        result = simulate_plan(
            p,
            schedule,
            SimConfig(
                seed=seed,
                noise_cv=noise_cv,
                drop=drop,
                frontend_ms=frontend_ms,
                cpu_cores=cpu_cores,
            ),
            table,
        )
    if as_json:
        emit(json.dumps(result.to_json(), indent=2))
        return
    out.print(simulation_report(result), highlight=False)
    for w in result.warnings:
        warn(w)
