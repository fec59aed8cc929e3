"""``simulate_plan``: a Plan served in virtual time, under an arrival schedule.

schedule = arrival_schedule("poisson", rate=50.0, duration_s=60.0, seed=1)
result = simulate_plan(load_plan("plan.yaml"), schedule, SimConfig(seed=1), profiles)
print(result.latency_ms["p99"], result.violation_rate)
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from ridgeline.errors import ConfigError
from ridgeline.loadgen.schedule import Schedule, build_schedule
from ridgeline.loadgen.schedule import TraceScale as TraceScale  # how simulate scales a trace
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.plansim.engine import Engine
from ridgeline.plansim.result import PlanSimResult, summarise
from ridgeline.plansim.service import service_times
from ridgeline.policies.dropping import DROP_MARGIN, SLACK_QUANTILE
from ridgeline.synthetic.model import NoiseCv


class SimConfig(BaseModel):
    """How the plan is served in the simulation (the runtime's own defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = Field(0, ge=0, description="seed of the batch-time noise")
    noise_cv: NoiseCv | None = Field(
        None,
        description="spread of batch times (lognormal, mean 1) for every task; default: a "
        "synthetic task's own noise_cv, 0.1 for a task timed by profiles",
    )
    drop: bool = Field(True, description="drop requests that cannot meet the SLO, as served")
    frontend_ms: float = Field(
        0.0,
        ge=0.0,
        le=60_000,
        description="time a request spends in the server's front end outside the task "
        "queues (parsing, answering, the hops to worker processes), one request at a time: "
        "requests queue for it first (through_frontend), and it is kept back from drop "
        "deadlines, as served; measure it as served minus simulated latency at a rate with "
        "no queueing",
    )
    drop_margin: float = Field(
        DROP_MARGIN,
        ge=0.0,
        lt=1.0,
        description="share of the SLO the runtime keeps back from drops",
    )
    cpu_cores: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="the host's CPU cores: CPU instances are pinned to them as the runtime "
        "pins them (in turn, wrapping round), and instances pinned to one core share its "
        "time (processor sharing); None: every instance has its own processor",
    )
    served_ms: dict[str, tuple[float, float]] | None = Field(
        None,
        description="per task, its batch time as served on the host, (base_ms, per_row_ms): "
        "replaces its profile rows and synthetic model (``ridgeline calibrate`` measures it)",
    )
    slack_quantile: float = Field(
        SLACK_QUANTILE,
        gt=0.0,
        lt=1.0,
        description="the drop decision's confidence, as the runtime's (what-if): a request "
        "is dropped when it is more than 1 - this likely to come late",
    )


def arrival_schedule(
    arrival: str = "poisson",
    *,
    rate: float | None = None,
    trace: Path | str | None = None,
    target_rate: float | None = None,
    trace_scale: TraceScale = "overlay",
    duration_s: float,
    seed: int = 0,
) -> Schedule:
    """The arrivals: an arrival spec at ``rate`` (``workload.arrivals``), or a recorded
    trace brought to ``target_rate`` (``rate`` when no target rate is given, as
    ``ridgeline run`` reads it) for ``duration_s``: by default as that many users'
    traffic, copies of it overlaid at their own pace from ``seed``'s random starting
    points (``trace_overlaid``); with ``trace_scale="speed"`` its first ``target_rate ×
    duration_s`` arrivals time-scaled to hold the rate, as a probe's steps replay a trace
    (``trace_at_rate``). ``loadgen.schedule.build_schedule`` makes it; here a rate or a
    trace must be given."""
    if trace is None and rate is None:
        raise ConfigError(
            "give the arrivals: --rate R (with --arrival, default poisson), or --trace FILE "
            "with --target-rate R"
        )
    return build_schedule(
        arrival,
        rate=rate,
        duration_s=duration_s,
        seed=seed,
        trace=trace,
        target_rate=target_rate,
        trace_scale=trace_scale,
    )


def through_frontend(times: NDArray[np.float64], each_s: float) -> NDArray[np.float64]:
    """When requests arriving at ``times`` reach the pipeline after the server's front
    end, one request at a time for ``each_s`` each (its event loop parses, answers and
    hands on requests in turn): ``d_i = max(a_i, d_{i-1}) + each_s``, Lindley's
    recursion for one first-come-first-served server, in closed form. A constant time
    added to every answer instead missed that a burst queues there (the example plan at
    20 req/s: simulated p99 58 ms against 70 served)."""
    if each_s <= 0.0 or len(times) == 0:
        return times
    steps = each_s * np.arange(len(times))
    left: NDArray[np.float64] = np.maximum.accumulate(times - steps) + steps + each_s
    return left


def simulate_plan(
    plan: Plan,
    schedule: Schedule,
    config: SimConfig | None = None,
    profiles: ProfileTable | None = None,
) -> PlanSimResult:
    """Serve ``plan`` to ``schedule``'s arrivals, one row each, in virtual time, until
    every request is answered or dropped."""
    cfg = config or SimConfig()
    services = service_times(plan, profiles, cfg.noise_cv, served_ms=cfg.served_ms)
    began = time.perf_counter()
    engine = Engine(
        plan,
        services,
        drop=cfg.drop,
        margin=cfg.drop_margin,
        seed=cfg.seed,
        horizon_s=schedule.duration_s,
        frontend_s=cfg.frontend_ms / 1000.0,
        slack_quantile=cfg.slack_quantile,
        cores=None if cfg.cpu_cores is None else plan.core_assignment(range(cfg.cpu_cores)),
    )
    run = engine.run(through_frontend(schedule.times, cfg.frontend_ms / 1000.0))
    wall = time.perf_counter() - began
    return summarise(
        plan,
        run,
        schedule.times,
        services,
        arrivals=schedule.description,
        duration_s=schedule.duration_s,
        wall_s=wall,
        seed=cfg.seed,
    )
