"""``ridgeline study jigsaw --served``: every plan of the study sized for the traffic it
will get, then served in the plan simulator with early dropping on and off (issue 32).

For each application, GPU set (``JigsawConfig.gpus``), SLO (the spec's and half of it:
``SLO_FACTORS``), feature setting and arrival process (``ARRIVALS``: Poisson, gamma
inter-arrivals of CV 3, the bundled Azure code trace overlaid):

1. **Plain max demand**: ``pipeline.planned.max_demand`` over plain MILP plans, as the
   study finds it.
2. **Max demand sized for the traffic**: the same bisection (to ``REL``) over
   ``plansim.check.checked_plan`` under that arrival process alone (the plan is sized
   up until the simulator, dropping on, holds it under 0.5 % late or dropped, and a
   fresh run is predicted to; runs of ``requests`` requests, a trace's or gamma's six
   of as many), starting
   at the plain maximum and going down to an eighth of it at most (``FLOOR``).
3. **Served**: the plan there, simulated afresh under the same process (``seed``, apart
   from the check's seeds 1 to 6; ``requests`` requests), once with dropping on (as
   ``ridgeline serve`` runs it) and once off: the share late or dropped in each.

The study's law: with dropping on, no more of the same arrivals miss than with it off.
Pure data; ``report.jigsaw`` renders it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ridgeline.loadgen.schedule import named_arrivals
from ridgeline.pipeline.planned import max_demand, to_plan
from ridgeline.pipeline.planner import PlanResult, plan_pipeline
from ridgeline.pipeline.spec import PipelineSpec, load_spec
from ridgeline.plansim import SimConfig, simulate_plan
from ridgeline.plansim.check import CheckConfig, checked_plan
from ridgeline.plansim.result import PlanSimResult
from ridgeline.study._pool import as_finished
from ridgeline.study.jigsaw import SETTINGS, available, features, table_for
from ridgeline.study.jigsaw_result import ServedCell

ARRIVALS: tuple[str, ...] = ("poisson", "gamma:cv=3", "trace:BUNDLED")
SLO_FACTORS: tuple[float, ...] = (1.0, 0.5)
REL = 0.02
"""The checked bisection's relative precision: each step is a checked plan (up to eight
MILP solves and 20,000–60,000 simulated requests each)."""
FLOOR = 0.125
"""The lowest demand the checked search tries, over the plain maximum. Below it a check
may fail for another reason than the GPUs (a plan at 1 req/s holds few instances, and
bursts of gamma CV 3 found them all busy: 40–50 % late or dropped), so the search
cannot start from the bottom."""


@dataclass(frozen=True)
class _Job:
    spec: Path
    gpus: str
    slo_factor: float
    setting: str
    requests: int
    seed: int
    batches: tuple[int, ...]


def _cells(job: _Job) -> list[ServedCell]:
    spec = load_spec(job.spec)
    spec = spec.model_copy(update={"slo_ms": spec.slo_ms * job.slo_factor})
    gpus = available(job.gpus)
    table = table_for(spec, gpus, job.batches, 1.0)
    feats = features(job.setting)
    plain, _ = max_demand(spec, lambda s: plan_pipeline(s, table, gpus, feats))
    out = []
    for arrivals in ARRIVALS:
        began = time.perf_counter()
        cell = ServedCell(
            app=spec.name,
            gpus=job.gpus,
            slo_ms=spec.slo_ms,
            setting=job.setting,
            arrivals=arrivals,
            plain_max_rps=plain,
            max_rps=0.0,
        )
        check = CheckConfig(
            arrivals=(arrivals,), requests=job.requests, trace_requests=job.requests
        )

        def checked(s: PipelineSpec, check: CheckConfig = check) -> PlanResult:
            """The MILP's plan the check passed (its spec: the demand it is sized for)."""
            return checked_plan(s, table, gpus, feats, check=check).result

        if plain > 0:
            rate, result = max_demand(
                spec.model_copy(update={"demand_rps": plain}), checked, rel=REL, floor=FLOOR
            )
            if result is not None:
                plan = to_plan(result).model_copy(update={"demand_rps": rate})
                schedule = named_arrivals(arrivals, rate, job.requests / rate, job.seed)
                runs: list[PlanSimResult] = [
                    simulate_plan(plan, schedule, SimConfig(seed=job.seed, drop=d), table)
                    for d in (True, False)
                ]
                on, off = runs
                cell = cell.model_copy(
                    update={
                        "max_rps": rate,
                        "sized_for_rps": result.spec.demand_rps,
                        "requests": on.requests,
                        "violation_rate": on.violation_rate,
                        "dropped": on.dropped,
                        "late": on.late,
                        "violation_rate_no_drop": off.violation_rate,
                        "p99_ms": on.latency_ms.get("p99"),
                        "p99_ms_no_drop": off.latency_ms.get("p99"),
                    }
                )
        out.append(cell.model_copy(update={"wall_s": time.perf_counter() - began}))
    return out


def run_served(
    specs: tuple[Path, ...],
    gpus: tuple[str, ...],
    *,
    requests: int,
    seed: int,
    jobs: int,
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    settings: tuple[str, ...] = SETTINGS,
    slo_factors: tuple[float, ...] = SLO_FACTORS,
    on_done: Callable[[list[ServedCell]], None] | None = None,
    kept: Sequence[ServedCell] = (),
) -> list[ServedCell]:
    """Every cell of the module docstring, in ``jobs`` processes. ``kept``: cells an
    earlier run of the same jobs served (``load_kept``); a job whose three cells are all
    there is not run again, so a study of some hours can be run in parts."""
    have: dict[tuple[str, str, float, str], list[ServedCell]] = {}
    for c in kept:
        have.setdefault(_key(c.app, c.gpus, c.slo_ms, c.setting), []).append(c)
    cells: list[ServedCell] = []
    work = []
    for s in specs:
        spec = load_spec(s)
        for g in gpus:
            for f in slo_factors:
                for setting in settings:
                    earlier = have.get(_key(spec.name, g, spec.slo_ms * f, setting))
                    if earlier:
                        cells += earlier
                    else:
                        work.append(_Job(s, g, f, setting, requests, seed, batches))
    for done in as_finished(_cells, work, jobs):
        cells += done
        if on_done is not None:
            on_done(done)
    apps = [load_spec(s).name for s in specs]
    cells.sort(
        key=lambda c: (
            apps.index(c.app),
            gpus.index(c.gpus),
            -c.slo_ms,
            SETTINGS.index(c.setting),
            ARRIVALS.index(c.arrivals),
        )
    )
    return cells


def _key(app: str, gpus: str, slo_ms: float, setting: str) -> tuple[str, str, float, str]:
    return app, gpus, round(slo_ms, 6), setting


def kept_line(cells: Sequence[ServedCell], requests: int, seed: int) -> str:
    """One finished job's cells as a line of a kept-cells file (JSON lines), with the
    simulated requests and seed they were served with."""
    line = {"requests": requests, "seed": seed, "cells": [c.model_dump() for c in cells]}
    return json.dumps(line) + "\n"


def load_kept(text: str, requests: int, seed: int) -> list[ServedCell]:
    """The cells of a kept-cells file (``kept_line``'s lines) served with ``requests``
    and ``seed``; lines with others are left out, and a job whose line is incomplete (a
    run stopped while writing it) is served again."""
    out: list[ServedCell] = []
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if line.get("requests") == requests and line.get("seed") == seed:
            out += [ServedCell.model_validate(c) for c in line["cells"]]
    return out
