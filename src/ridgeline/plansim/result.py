"""A simulated run's result: end-to-end latency of the answered, the SLO violations
(drops and late answers both count: no request leaves the denominator), and per task its
load, batches and waits. The run's requests are judged as a probe's are
(``health.judge``): the same percentile estimator and key set (``p999``, shown p99.9),
and a request late when it misses the plan's SLO on its own latency."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ridgeline.health.judge import Judgment, judge
from ridgeline.health.metrics import DEFAULT
from ridgeline.health.slo import LatencyBound, SLOPolicy
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.segments import CpuSegment, MpsSegment, parse_segment
from ridgeline.plansim.engine import ANSWERED, DROPPED, EngineRun
from ridgeline.plansim.service import ServiceTime
from ridgeline.telemetry.records import Outcome, Records

SHOWN = ("mean", "p50", "p90", "p99", "p999")
"""The statistics of the answered requests' latency a result keeps."""

OVERLOADED_DROP_SHARE = 0.01
"""A run that drops more than this share of its requests says the plan is over capacity."""


@dataclass(frozen=True, slots=True)
class TaskStats:
    """One task over the run."""

    name: str
    segment: str
    instances: int
    service: str
    """Where its service time came from (profile rows or its synthetic model)."""
    base_ms: float
    per_row_ms: float
    noise_cv: float
    requests: int
    """Requests (chunks of at most a batch) that reached its queue."""
    drops: int
    rows: int
    """Rows executed, over every batch."""
    batches: int
    mean_batch: float
    utilisation: float
    """Busy instance-time over ``instances × simulated_s``."""
    mean_queue_wait_ms: float


@dataclass(frozen=True, eq=False)
class PlanSimResult:
    """What a plan did under the simulated arrivals."""

    plan: str
    arrivals: str
    slo_ms: float
    duration_s: float
    """The arrival window; the run goes on until every request is answered."""
    simulated_s: float
    wall_s: float
    seed: int
    requests: int
    answered: int
    dropped: int
    dropped_at_arrival: int
    """Of ``dropped``, those the pipeline refused on arrival (the rest were dropped at a
    task's queue or batch)."""
    late: int
    """Answered after the SLO."""
    latency_ms: dict[str, float | None]
    """End-to-end latency of the answered requests: the ``SHOWN`` statistics (None when
    none was answered)."""
    mean_in_system: float
    """Time-average of requests in the system (the front end's queue included, as in
    ``mean_time_in_system_s``) over the arrival window. Little's law on the run's own
    path: times the window T, it is Σ (min(finish, T) − arrival) over the requests, so
    it falls short of rate × ``mean_time_in_system_s`` by the time the requests still
    inside at T spend after it, over T."""
    mean_time_in_system_s: float
    """Mean from arrival to answer or failure, over every request (0 for one dropped on
    arrival)."""
    tasks: tuple[TaskStats, ...]
    segments: dict[str, int]
    """Instances per segment label (``cpu1``, ``1g.10gb``, ``1g.10gb@0.5``)."""
    gpu_slices: float
    """MIG compute slices the plan's instances use (an MPS share counts its fraction)."""
    cpu_cores: int
    warnings: tuple[str, ...]
    arrival_s: NDArray[np.float64] = field(repr=False)
    finish_s: NDArray[np.float64] = field(repr=False)
    status: NDArray[np.uint8] = field(repr=False)
    """Per request: ``engine.ANSWERED`` or ``engine.DROPPED``."""

    @cached_property
    def judgment(self) -> Judgment:
        """The answered requests against the plan's SLO (``health.judge``): their p99,
        and each one on its own latency (``good``: answered within the SLO)."""
        return judge_run(self.arrival_s, self.finish_s, self.status, self.slo_ms)

    @property
    def violations(self) -> int:
        return self.dropped + self.late

    @property
    def violation_rate(self) -> float:
        """Dropped or late, over every request."""
        return self.violations / self.requests if self.requests else 0.0

    @property
    def requests_per_wall_minute(self) -> float:
        return self.requests / self.wall_s * 60.0 if self.wall_s > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        """Everything but the per-request columns, as JSON-ready values."""
        doc = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("arrival_s", "finish_s", "status", "tasks")
        }
        doc["tasks"] = {
            t.name: {k: v for k, v in asdict(t).items() if k != "name"} for t in self.tasks
        }
        doc["violations"] = self.violations
        doc["violation_rate"] = self.violation_rate
        doc["drop_rate"] = self.dropped / self.requests if self.requests else 0.0
        doc["requests_per_wall_minute"] = self.requests_per_wall_minute
        return doc


def summarise(
    plan: Plan,
    run: EngineRun,
    times: NDArray[np.float64],
    services: dict[str, ServiceTime],
    *,
    arrivals: str,
    duration_s: float,
    wall_s: float,
    seed: int,
) -> PlanSimResult:
    """The result of ``run``, the engine's outcome for requests arriving at ``times``."""
    n = len(times)
    ok = run.status == ANSWERED
    dropped = int(np.count_nonzero(run.status == DROPPED))
    simulated = max(run.end_s, duration_s)
    judged = judge_run(times, run.finish_s, run.status, plan.slo_ms)
    lat = {k: judged.statistics[DEFAULT][k] for k in SHOWN}
    tasks = []
    for name, c in run.tasks.items():
        t, s = plan.tasks[name], services[name]
        tasks.append(
            TaskStats(
                name=name,
                segment=t.segment.label,
                instances=t.instances,
                service=s.source,
                base_ms=s.base_s * 1000.0,
                per_row_ms=s.per_row_s * 1000.0,
                noise_cv=s.noise_cv,
                requests=c.submitted,
                drops=c.drops,
                rows=c.rows,
                batches=c.batches,
                mean_batch=c.rows / c.batches if c.batches else 0.0,
                utilisation=c.busy_s / (t.instances * simulated) if simulated > 0 else 0.0,
                mean_queue_wait_ms=c.wait_s / c.batched * 1000.0 if c.batched else 0.0,
            )
        )
    segments, slices, cores = resources(plan)
    return PlanSimResult(
        plan=plan.name,
        arrivals=arrivals,
        slo_ms=plan.slo_ms,
        duration_s=duration_s,
        simulated_s=simulated,
        wall_s=wall_s,
        seed=seed,
        requests=n,
        answered=int(np.count_nonzero(ok)),
        dropped=dropped,
        dropped_at_arrival=run.dropped_at_arrival,
        late=int(np.count_nonzero(ok & ~judged.good)),
        latency_ms=lat,
        mean_in_system=(run.in_system_s + _in_front_end_s(times, run.entered_s, duration_s))
        / duration_s,
        mean_time_in_system_s=float((run.finish_s - times).mean()) if n else 0.0,
        tasks=tuple(tasks),
        segments=segments,
        gpu_slices=slices,
        cpu_cores=cores,
        warnings=_warnings(n, dropped, int(np.count_nonzero(ok)), tasks),
        arrival_s=times,
        finish_s=run.finish_s,
        status=run.status,
    )


def _in_front_end_s(
    arrival_s: NDArray[np.float64], entered_s: NDArray[np.float64], horizon_s: float
) -> float:
    """The integral over ``[0, horizon_s]`` of the number of requests in the front end:
    each from its arrival until it reaches the pipeline (``engine.EngineRun.entered_s``),
    which the engine's count starts at."""
    if entered_s is arrival_s:
        return 0.0
    return float((np.minimum(entered_s, horizon_s) - np.minimum(arrival_s, horizon_s)).sum())


def slo_policy(slo_ms: float) -> SLOPolicy:
    """A plan's SLO as a policy: its end-to-end p99 within ``slo_ms``."""
    return SLOPolicy(latency=(LatencyBound(percentile="p99", bound_ms=slo_ms),))


def judge_run(
    arrival_s: NDArray[np.float64],
    finish_s: NDArray[np.float64],
    status: NDArray[np.uint8],
    slo_ms: float,
) -> Judgment:
    """A run's answered requests against its plan's SLO: the requests as records, each
    sent on arrival, answered or dropped."""
    rec = Records.empty(arrival_s)
    rec.sent = rec.scheduled.copy()
    rec.done = np.asarray(finish_s, dtype=np.float64)
    answered = status == ANSWERED
    rec.outcome = np.where(answered, int(Outcome.OK), int(Outcome.DROPPED)).astype(np.int8)
    return judge(rec, slo_policy(slo_ms), answered)


def _warnings(
    requests: int, dropped: int, answered: int, tasks: list[TaskStats]
) -> tuple[str, ...]:
    out = []
    if requests and dropped > OVERLOADED_DROP_SHARE * requests:
        busiest = max(tasks, key=lambda t: t.utilisation)
        out.append(
            f"over capacity: {dropped:,} of {requests:,} requests dropped "
            f"({dropped / requests:.1%}); the busiest task is {busiest.name!r} at "
            f"{busiest.utilisation:.0%} utilisation: add instances or lower the rate"
        )
    if requests and not answered:
        out.append("no request was answered")
    return tuple(out)


def resources(plan: Plan) -> tuple[dict[str, int], float, int]:
    """Instances per segment label, MIG compute slices and CPU cores the plan uses."""
    segments: Counter[str] = Counter()
    slices, cores = 0.0, 0
    for t in plan.tasks.values():
        seg = t.segment
        segments[seg.label] += t.instances
        if isinstance(seg, CpuSegment):
            cores += seg.cores * t.instances
        else:
            share = seg.share if isinstance(seg, MpsSegment) else 1.0
            slices += float(parse_segment(seg.gpu, seg.profile).slices()) * share * t.instances
    return dict(segments), slices, cores
