"""``ridgeline simulate``: a plan served in virtual time, as the serving runtime would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ridgeline.cli._common import (
    ArrivalOption,
    DbOption,
    DropOption,
    JsonOption,
    PlanArgument,
    RateOption,
    TargetRateOption,
    TraceOption,
    TraceScaleOption,
    emit,
    err,
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
        float | None,
        typer.Option(
            help="time a request spends in the server's front end (parsing, answering, "
            "hops), ms, one request at a time: a burst queues for it; measure it as served "
            "minus simulated p50 when nothing queues, or let --calibrate-from fit it; "
            "default 0"
        ),
    ] = None,
    cpu_cores: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="the host's CPU cores: CPU instances pinned to them as `ridgeline serve` "
            "pins them (in turn, wrapping round), and instances on one core share its time; "
            "default: every instance has its own processor",
        ),
    ] = None,
    calibrate_from: Annotated[
        int | None,
        typer.Option(
            "--calibrate-from",
            metavar="RUN",
            help="a calibration run (`ridgeline calibrate`): the tasks' served batch "
            "times, the front-end time, the spread and the cores it fitted on this host "
            "(--noise-cv, --frontend-ms or --cpu-cores, when given, wins)",
        ),
    ] = None,
    db: DbOption = None,
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

    flags = {
        "noise_cv": "--noise-cv",
        "frontend_ms": "--frontend-ms",
        "cpu_cores": "--cpu-cores",
        "duration_s": "--duration",
    }
    with failing(values=True, flags=flags):
        p = load_plan(plan)
        table = load_profiles(profiles) if profiles is not None else None
        given = {
            k: v
            for k, v in (
                ("noise_cv", noise_cv),
                ("frontend_ms", frontend_ms),
                ("cpu_cores", cpu_cores),
            )
            if v is not None
        }
        config = SimConfig.model_validate({"seed": seed, "drop": drop, **given})
        if calibrate_from is not None:
            from ridgeline.cli._common import opened_store
            from ridgeline.loop.calibrate import stored_calibration

            with opened_store(db) as store:
                calibration = stored_calibration(store, calibrate_from)
            config = calibration.config(p, seed=seed, drop=drop, **given)
        schedule = arrival_schedule(
            arrival,
            rate=rate,
            trace=trace,
            target_rate=target_rate,
            trace_scale=trace_scale,  # type: ignore[arg-type]  # checked there
            duration_s=duration,
            seed=seed,
        )
        result = simulate_plan(p, schedule, config, table)
    if as_json:
        emit(json.dumps(result.to_json(), indent=2))
        return
    out.print(simulation_report(result), highlight=False)
    for w in result.warnings:
        warn(w)


def calibrate(
    plan: PlanArgument,
    target: Annotated[
        str, typer.Argument(help="its pipeline's v2 URL, e.g. http://127.0.0.1:8000/v2/models/NAME")
    ],
    metrics_url: Annotated[
        str | None,
        typer.Option(help="the server's Prometheus /metrics; default: TARGET's host /metrics"),
    ] = None,
    profiles: Annotated[
        Path | None,
        typer.Option(help="profile table CSV: the line a task seen at one batch size scales"),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(help="the demand the steps are set from (default: the plan's demand_rps)"),
    ] = None,
    scale: Annotated[
        float,
        typer.Option(
            help="every step's length × this (1: 90 s, 45 s and 60 s); under 1 the fit's "
            "simulated run shortens too"
        ),
    ] = 1.0,
    cpu_cores: Annotated[
        int | None,
        typer.Option(min=1, help="the server host's CPU cores (default: this host's)"),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Measure a served plan so that `ridgeline simulate --calibrate-from RUN` serves it as
    this host does: a quiet Poisson step at a tenth of the demand, a step of bursts, and a
    Poisson step at half the demand, the server's /metrics scraped beside each. From them,
    each task's served batch time (the line through two batch sizes), then the front-end
    time and batch-time spread whose simulation has the last step's p50 and p90. Stored as
    one run; Ctrl-C keeps the steps measured. About 3.5 minutes at --scale 1. Every task
    needs a batch time to scale (--profiles, or a synthetic model): checked before any load."""
    import os
    from urllib.parse import urlsplit

    from ridgeline.aio import run_coroutine, stopping_on_signal
    from ridgeline.cli._common import opened_store
    from ridgeline.errors import ConfigError
    from ridgeline.loop.calibrate import CalibrationRun, Steps
    from ridgeline.loop.calibrate import calibrate as run_calibration
    from ridgeline.pipeline.plan import load_plan
    from ridgeline.pipeline.profiles import load_profiles
    from ridgeline.plansim.calibration import FIT_REQUESTS
    from ridgeline.report.simulation import calibration_report

    with failing(values=True):
        p = load_plan(plan)
        table = load_profiles(profiles) if profiles is not None else None
        demand = rate if rate is not None else p.demand_rps
        if demand is None:
            raise ConfigError(f"plan {p.name!r} names no demand_rps: give --rate R")
        steps = Steps.for_demand(demand, scale)
        if metrics_url is None:
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https"):
                raise ConfigError(
                    f"cannot find the metrics of {target}: give --metrics-url "
                    "(`ridgeline serve` prints it)"
                )
            metrics_url = f"{parts.scheme}://{parts.netloc}/metrics"
        cores = cpu_cores or len(os.sched_getaffinity(0))

        async def main() -> CalibrationRun:
            import asyncio

            stop = asyncio.Event()
            with stopping_on_signal(stop):
                return await run_calibration(
                    p,
                    target,
                    metrics_url=metrics_url,
                    store=store,
                    steps=steps,
                    cpu_cores=cores,
                    profiles=table,
                    say=lambda line: err.print(line, highlight=False),
                    stop=stop,
                    fit_requests=max(1000, round(FIT_REQUESTS * min(1.0, scale))),
                )

        with opened_store(db) as store:
            done = run_coroutine(main())
    if as_json:
        emit(json.dumps({"run_id": done.run_id, **done.calibration.model_dump()}, indent=2))
        return
    out.print(calibration_report(done), highlight=False)
    out.print(
        f"stored as run {done.run_id}: `ridgeline simulate {plan} --rate R "
        f"--calibrate-from {done.run_id}`",
        highlight=False,
    )
