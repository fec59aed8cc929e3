"""``ridgeline calibrate``: measure a served plan so that the simulator serves it as this
host does (the model: ``plansim.calibration``).

Three steps against the served pipeline, the server's ``/metrics`` scraped beside each,
every step stored as it ends in one run of kind ``calibrate``:

1. **quiet**: Poisson at a tenth of the plan's demand (``quiet_s``, 90 s): batches of
   about one request's rows;
2. **bursts**: ``burst`` requests at once every ``burst_gap_s`` (45 s): each task runs
   batches of several requests' rows, and nothing is left queued from one burst to the
   next. With (1), each task's served batch time at two sizes: its served line;
3. **fit**: Poisson at half the demand (``fit_s``, 60 s), where requests overlap: the
   front-end time and the spread are fitted to its answered p50 and p90.

The fitted calibration is the run's summary; ``ridgeline simulate PLAN --calibrate-from
RUN`` applies it. A run stopped by Ctrl-C keeps its finished steps, marked interrupted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ridgeline.errors import ConfigError, RidgelineError, RunInterrupted, StoreError
from ridgeline.loadgen.schedule import Schedule, from_arrival
from ridgeline.loadgen.step import StepConfig, StepResult, measure_step
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.plansim.calibration import (
    FIT_REQUESTS,
    Calibration,
    Executed,
    executed,
    fit_host,
    served_lines,
)
from ridgeline.plansim.service import service_times
from ridgeline.targets.options import TargetOptions
from ridgeline.telemetry.store import RunStore
from ridgeline.workload.arrivals import parse_arrival

KIND = "calibrate"
"""The run store's kind of a calibration run."""


@dataclass(frozen=True, slots=True)
class Steps:
    """The three steps' rates and lengths."""

    quiet_rps: float
    quiet_s: float
    burst: int
    burst_gap_s: float
    burst_s: float
    fit_rps: float
    fit_s: float

    @classmethod
    def for_demand(cls, demand_rps: float, scale: float = 1.0) -> Steps:
        """The default steps for a plan of ``demand_rps``: quiet at a tenth of it, the fit
        at half, bursts of 40 % of the fit rate's requests in a second, every half
        second (at least 2); ``scale`` shortens or lengthens every step."""
        if demand_rps <= 0:
            raise ConfigError(
                f"calibration steps are set from the demand, and {demand_rps:g} req/s is "
                "none: give the plan a demand_rps > 0 or --rate R"
            )
        if scale <= 0:
            raise ConfigError(f"--scale must be > 0 (got {scale:g}): 1 is 90 s, 45 s and 60 s")
        fit = demand_rps / 2
        return cls(
            quiet_rps=demand_rps / 10,
            quiet_s=90.0 * scale,
            burst=max(2, round(fit * 0.4)),
            burst_gap_s=0.5,
            burst_s=45.0 * scale,
            fit_rps=fit,
            fit_s=60.0 * scale,
        )

    def schedules(self) -> list[tuple[str, Schedule]]:
        gaps = np.arange(0.0, self.burst_s, self.burst_gap_s)
        bursts = Schedule(
            np.repeat(gaps, self.burst),
            None,
            self.burst_s,
            f"{self.burst} at once every {self.burst_gap_s:g} s",
        )
        return [
            ("quiet", from_arrival(parse_arrival("poisson", self.quiet_rps), self.quiet_s, seed=4)),
            ("bursts", bursts),
            ("fit", from_arrival(parse_arrival("poisson", self.fit_rps), self.fit_s, seed=6)),
        ]


@dataclass(frozen=True, slots=True)
class CalibrationRun:
    run_id: int
    calibration: Calibration
    steps: list[tuple[str, StepResult]]


async def calibrate(
    plan: Plan,
    url: str,
    *,
    metrics_url: str,
    store: RunStore,
    steps: Steps,
    cpu_cores: int | None,
    profiles: ProfileTable | None = None,
    target_options: TargetOptions | None = None,
    say: Callable[[str], None] = lambda _: None,
    stop: asyncio.Event | None = None,
    fit_requests: int = FIT_REQUESTS,
) -> CalibrationRun:
    """Run the three steps against ``url`` (the plan's pipeline, served), fit, store. A
    task with no batch time to scale (no profile row, no synthetic model) is refused
    before any load is sent: the fit needs one for every task (a ``PlanError`` naming
    them), and found out only after the three steps (about 3.5 minutes)."""
    service_times(plan, profiles)
    stop = stop or asyncio.Event()
    validity = ValidityConfig(lateness_p99_bound_s=plan.slo_ms / 10 / 1000)
    cfg = StepConfig(validity=validity, metrics_url=metrics_url)
    config = {"plan": plan.name, "metrics_url": metrics_url, "steps": _fields(steps)}
    run_id = store.create_run(KIND, url, config)
    done: list[tuple[str, StepResult]] = []
    for i, (name, schedule) in enumerate(steps.schedules()):
        say(f"step {i + 1}/3  {name}: {schedule.description}, {schedule.duration_s:g} s")
        try:
            result = await measure_step(
                url, schedule, cfg, target_options=target_options, stop=stop
            )
        except RidgelineError as e:  # unreachable, or the server died: what was measured stays
            store.finish_run(run_id, "failed", f"{name} step: {e}")
            raise
        store.add_step(run_id, i, result.summary, result.windows)
        done.append((name, result))
        if result.interrupted:
            store.finish_run(run_id, "interrupted", f"stopped during the {name} step")
            raise RunInterrupted(
                run_id,
                f"calibration interrupted during its {name} step: the {i + 1} step(s) measured "
                f"are stored as run {run_id}, marked interrupted; `ridgeline runs show {run_id}`",
            )
    try:
        cal = fitted(plan, done, cpu_cores=cpu_cores, profiles=profiles, fit_requests=fit_requests)
    except ConfigError as e:
        store.finish_run(run_id, "failed", str(e))
        raise
    store.finish_run(run_id, "complete", None, {"calibration": cal.model_dump()})
    return CalibrationRun(run_id, cal, done)


def fitted(
    plan: Plan,
    steps: list[tuple[str, StepResult]],
    *,
    cpu_cores: int | None,
    profiles: ProfileTable | None = None,
    fit_requests: int = FIT_REQUESTS,
) -> Calibration:
    """The calibration of three measured steps (quiet, bursts, fit, in that order)."""
    counts: list[dict[str, Executed]] = []
    for name, result in steps:
        server = result.summary.server
        if server is None or not server.scrapes:
            raise ConfigError(
                f"the {name} step scraped no server metrics: give --metrics-url the served "
                "plan's /metrics (`ridgeline serve` prints it)"
            )
        counts.append(executed(server.increase))
    if not any(counts):
        raise ConfigError(
            "the server's metrics counted no batches (no ridgeline_task_compute_seconds): "
            "calibrate a plan served by `ridgeline serve`, at its /metrics"
        )
    lines = served_lines(plan, counts[:2], profiles)
    fit = steps[-1][1].summary
    p50, p90 = fit.latency_ms.p50, fit.latency_ms.p90
    if p50 is None or p90 is None:
        raise ConfigError(
            f"the fit step got no answers ({fit.errors} errors, {fit.timeouts} timeouts, "
            f"{fit.dropped} dropped of {fit.sent}): is the plan served at the URL given?"
        )
    host = fit_host(
        plan,
        lines,
        profiles=profiles,
        requests=fit_requests,
        rate_rps=fit.offered_rps,
        p50_ms=p50,
        p90_ms=p90,
        cpu_cores=cpu_cores,
    )
    return Calibration(plan=plan.name, lines=lines, fit=host, cpu_cores=cpu_cores)


def stored_calibration(store: RunStore, run_id: int) -> Calibration:
    """The calibration run ``run_id`` stored; StoreError when it is not one."""
    run = store.get_run(run_id)
    summary: dict[str, Any] = run.get("summary") or {}
    if run["kind"] != KIND:
        raise StoreError(
            f"run {run_id} is a {run['kind']} run, not a calibration: "
            "`ridgeline calibrate PLAN URL` makes one"
        )
    if run["status"] != "complete" or "calibration" not in summary:
        raise StoreError(
            f"calibration run {run_id} is {run['status']} and holds no fit "
            f"({run.get('status_reason') or 'it did not finish'}): calibrate again"
        )
    return Calibration.model_validate(summary["calibration"])


def _fields(steps: Steps) -> dict[str, float]:
    return {k: float(getattr(steps, k)) for k in Steps.__slots__}
