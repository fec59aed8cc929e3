"""What a plan result becomes: the Plan ``ridgeline serve`` runs (``to_plan``), and the
largest demand a set of GPUs serves (``max_demand``, by bisection over plans)."""

from __future__ import annotations

import math
from collections.abc import Callable

from ridgeline.errors import InfeasiblePlan, PlanCheckFailed
from ridgeline.pipeline.plan import Plan, TaskPlan
from ridgeline.pipeline.planner import PlanResult
from ridgeline.pipeline.segments import plan_segment
from ridgeline.pipeline.spec import PipelineSpec

PlanFn = Callable[[PipelineSpec], PlanResult]
"""Makes the plan for a spec, or raises ``InfeasiblePlan``."""


def max_demand(
    spec: PipelineSpec, plan_fn: PlanFn, rel: float = 0.01, floor: float = 1 / 1024
) -> tuple[float, PlanResult | None]:
    """The largest demand ``plan_fn`` can plan for (to relative precision ``rel``), by
    bisection over plans, and the plan there (None when not even the smallest fits).
    The search starts at the spec's demand and doubles while plans are found; when the
    first is not found it tries ``floor`` times it (a simulator check can fail a
    plan at a demand far below its maximum, where a few instances smooth bursts less:
    start a checked search near the plain maximum), and bisects between the two.
    ``plan_fn`` makes each plan: ``lambda s: plan_pipeline(s, table, available)`` for the
    largest demand ``available`` slices serve; one that raises ``InfeasiblePlan`` or
    ``PlanCheckFailed`` (the plan did not hold in simulation) counts as a demand that
    cannot be served."""

    def feasible(rate: float) -> PlanResult | None:
        try:
            return plan_fn(spec.model_copy(update={"demand_rps": rate}))
        except (InfeasiblePlan, PlanCheckFailed):
            return None

    lo, hi = 0.0, spec.demand_rps
    best: PlanResult | None = None
    while (found := feasible(hi)) is not None:
        lo, hi, best = hi, hi * 2, found
    if best is None:
        lo = hi * floor
        if (found := feasible(lo)) is None:
            return 0.0, None
        best = found
    while hi - lo > rel * lo:
        mid = (lo + hi) / 2
        found = feasible(mid)
        lo, hi, best = (mid, hi, found) if found is not None else (lo, mid, best)
    return lo, best


def to_plan(result: PlanResult) -> Plan:
    """The Plan ``ridgeline serve`` runs: per task its variant, segment, batch, queue
    delay, instances, and a latency budget (its latency, scaled up so the tightest path
    uses the whole SLO)."""
    spec = result.spec
    slack = min(spec.slo_ms / ms for ms in result.path_latency_ms.values())
    tasks = {}
    for t, p in result.tasks.items():
        row, v = p.config.row, spec.tasks[t].variant(p.variant)
        tasks[t] = TaskPlan(
            variant=v.name,
            artifact=v.artifact,
            synthetic=v.synthetic,
            segment=plan_segment(row.pool, row.segment),
            batch_size=row.batch,
            max_queue_delay_ms=math.floor(p.queue_ms * 1000) / 1000,
            instances=p.instances,
            latency_budget_ms=p.latency_ms * slack * (1 - 1e-9),
        )
    edges = []
    variants = {t: p.variant for t, p in result.tasks.items()}
    for e in spec.edges:
        edges.append(
            {"source": e.source, "target": e.target, "factor": e.factor_for(variants[e.source])}
        )
    return Plan.model_validate(
        {
            "name": spec.name,
            "slo_ms": spec.slo_ms,
            "tasks": {t: tp.model_dump() for t, tp in tasks.items()},
            "edges": edges,
            "demand_rps": spec.demand_rps,
        }
    )
