"""Service times: how long one instance of a task takes for a batch of ``rows`` rows.

The simulator needs, per task, ``base + per_row·rows`` (the form the runtime's own
execution model takes, ``policies.dropping.ExecModel``) and the spread of batch times
about it (lognormal noise of mean 1). It takes them, in order, from:

0. the task's batch time as served on this host (``SimConfig.served_ms``, measured by
   ``ridgeline calibrate``: ``plansim.calibration``);
1. the profile table (``--profiles``, ``pipeline.profiles``): the rows of the task's
   variant on its pool and segment (measured rows when there are any, else modelled;
   those of batches up to the task's batch size when there are any, for the batches
   it can run), fitted by least squares, both terms kept ≥ 0. One batch size alone cannot separate
   base from per-row time: then every batch costs what that row says (conservative for
   smaller batches, exact for full ones, which is where capacity is decided);
2. the task's synthetic model (``TaskPlan.synthetic``): what the runtime's synthetic
   backend really sleeps, ``base_ms + per_item_ms·rows`` with its ``noise_cv``.

A task with neither is a ``PlanError`` that names it and how to give it one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ridgeline.errors import ConfigError, PlanError
from ridgeline.pipeline.plan import Plan, TaskPlan
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
from ridgeline.pipeline.segments import CPU, CpuSegment, MpsSegment, Segment, plan_segment

DEFAULT_NOISE_CV = 0.1
"""Spread of batch times about a profile's fit when nothing says otherwise."""


@dataclass(frozen=True, slots=True)
class ServiceTime:
    """One task's batch time, ``(base_s + per_row_s·rows)`` × lognormal noise of mean 1
    and coefficient of variation ``noise_cv``; ``source`` says where it came from."""

    base_s: float
    per_row_s: float
    noise_cv: float
    source: str

    def mean_s(self, rows: float) -> float:
        return self.base_s + self.per_row_s * rows


def service_times(
    plan: Plan,
    profiles: ProfileTable | None = None,
    noise_cv: float | None = None,
    *,
    served_ms: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, ServiceTime]:
    """Every task's service time (see the module docstring); ``noise_cv``, when given,
    replaces every task's own spread; ``served_ms`` (per task, ``(base_ms, per_row_ms)``
    as served on the host: ``plansim.calibration``) comes before both sources. Raises
    ``PlanError`` naming each task without one, or a served time for a task the plan lacks."""
    out: dict[str, ServiceTime] = {}
    missing: list[str] = []
    served = dict(served_ms or {})
    unknown = sorted(set(served) - set(plan.tasks))
    if unknown:
        raise PlanError(
            f"served batch times were given for tasks plan {plan.name!r} lacks "
            f"({', '.join(unknown)}): calibrate this plan (`ridgeline calibrate`)"
        )
    for name, task in plan.tasks.items():
        found = None
        if name in served:
            base_ms, per_row_ms = served[name]
            found = ServiceTime(
                base_ms / 1000.0, per_row_ms / 1000.0, DEFAULT_NOISE_CV, "served (calibrated)"
            )
        if found is None and profiles is not None:
            found = _from_profiles(task, profiles)
        if found is None and task.synthetic is not None:
            s = task.synthetic
            found = ServiceTime(
                s.base_ms / 1000.0, s.per_item_ms / 1000.0, s.noise_cv, "synthetic model"
            )
        if found is None:
            missing.append(_no_source(name, task, profiles))
            continue
        out[name] = found if noise_cv is None else _with_cv(found, noise_cv)
    if missing:
        raise PlanError("; ".join(missing))
    return out


def _with_cv(s: ServiceTime, cv: float) -> ServiceTime:
    return ServiceTime(s.base_s, s.per_row_s, cv, s.source)


def pool_of(segment: Segment) -> str:
    """The profile table's pool of a plan segment: ``cpu``, or its GPU type."""
    return CPU if isinstance(segment, CpuSegment) else segment.gpu


def _from_profiles(task: TaskPlan, table: ProfileTable) -> ServiceTime | None:
    rows = matching_rows(task, table)
    if not rows:
        return None
    measured = [r for r in rows if r.source == "measured"]
    used = measured or rows
    used = [r for r in used if r.batch <= task.batch_size] or used
    base_ms, per_row_ms = fit_linear([r.batch for r in used], [r.latency_ms for r in used])
    what = "measured" if measured else "modelled"
    return ServiceTime(
        base_ms / 1000.0,
        per_row_ms / 1000.0,
        DEFAULT_NOISE_CV,
        f"profiles: {len(used)} {what} row{'s' if len(used) > 1 else ''}",
    )


def matching_rows(task: TaskPlan, table: ProfileTable) -> list[ProfileRow]:
    """The rows of ``task``'s variant on its pool and segment (an MPS share matched to
    three places: a plan may hold 1/3 as 0.333)."""
    out = []
    for row in table.for_variant(task.variant, pool_of(task.segment)):
        try:
            seg = plan_segment(row.pool, row.segment)
        except ConfigError:
            continue
        if _same_segment(seg, task.segment):
            out.append(row)
    return out


def _same_segment(a: Segment, b: Segment) -> bool:
    if isinstance(a, CpuSegment) or isinstance(b, CpuSegment):
        return isinstance(a, CpuSegment) and isinstance(b, CpuSegment) and a.cores == b.cores
    if isinstance(a, MpsSegment) or isinstance(b, MpsSegment):
        return (
            isinstance(a, MpsSegment)
            and isinstance(b, MpsSegment)
            and a.profile == b.profile
            and math.isclose(a.share, b.share, abs_tol=5e-4)
        )
    return a.profile == b.profile


def fit_linear(batches: Sequence[int], latencies_ms: Sequence[float]) -> tuple[float, float]:
    """``(base, per_row)`` of the least-squares line ``latency = base + per_row·batch``,
    both ≥ 0 (a negative one is set to 0 and the other refitted); a single batch size
    gives ``(its mean latency, 0)``."""
    n = len(batches)
    mean_b = sum(batches) / n
    mean_l = sum(latencies_ms) / n
    sxx = sum((b - mean_b) ** 2 for b in batches)
    if sxx == 0.0:
        return mean_l, 0.0
    sxy = sum((b - mean_b) * (lat - mean_l) for b, lat in zip(batches, latencies_ms, strict=True))
    per_row = sxy / sxx
    base = mean_l - per_row * mean_b
    if per_row < 0.0:
        return mean_l, 0.0
    if base < 0.0:  # through the origin
        bb = sum(b * b for b in batches)
        return 0.0, sum(b * lat for b, lat in zip(batches, latencies_ms, strict=True)) / bb
    return base, per_row


def _no_source(name: str, task: TaskPlan, profiles: ProfileTable | None) -> str:
    seg, pool = task.segment.label, pool_of(task.segment)
    where = f"variant {task.variant!r} on {pool} segment {seg}"
    if profiles is None:
        why = "it has no synthetic model and no --profiles were given"
    else:
        have = sorted({r.segment for r in profiles.for_variant(task.variant, pool)})
        listed = f" (the table has {task.variant!r} on {', '.join(have)})" if have else ""
        why = f"it has no synthetic model and the profiles hold no row for it{listed}"
    return (
        f"task {name!r} has no service time: {why}; pass --profiles with rows for {where} "
        "(`ridgeline profile` measures them), or give the task a synthetic model"
    )
