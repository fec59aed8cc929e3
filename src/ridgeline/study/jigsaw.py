"""``ridgeline study jigsaw``: what each of JigsawServe's three features buys on the three
example applications, and how far that moves over the calibration's error and the SLO.

For every spec (``examples/specs/``: social media, traffic, AR assistant) and GPU set
(``8xA100-80GB``; ``8xH100-80GB`` when asked), profile rows come from the roofline with
its fitted constants (``pipeline.roofline.modelled_rows`` at batches 1–32). Under each
of the eight settings of A (accuracy scaling), S (spatial partitioning) and T
(task-graph budgeting), ``pipeline.planned.max_demand`` finds the largest demand the
GPUs serve (bisection to 1 %) over **plain MILP plans**: no simulator check sizes them
up (``ridgeline plan`` would), for speed. "none" is what ``pipeline.planner.candidates``
keeps with every switch off: each task's most accurate variant only (A off), only rows
on a whole GPU with MIG off, segment ``gpu``, every SM (S off, ``_whole``), and each
task within ``slo_share`` of the SLO over the longest path's task count (T off).

The plan at each maximum is served in the plan simulator (``plansim.simulate_plan``,
Poisson arrivals at that demand, ``requests`` of them, seed 7) as served (early drops
on) and with ``--no-drop``: at its own maximum, the hardest point a plan has. At the
demand "none" serves, every setting is planned again: its cost there, and its
simulated violations.

Ranges: the same for each ``Variant`` of the inputs: every modelled latency × exp(−e)
and × exp(+e), ``e`` the fit's RMS log error over all its rows
(``data/roofline_fit.json``; throughput ÷ the same factor), and the spec's SLO × 0.5
and × 2, one at a time (``grid``: every pair); ``central_gpus`` are GPU sets planned
on the central inputs only. The settings with A also run with the
accuracy floor over the whole graph (``PlannerOptions(accuracy_scope="graph")``; the
default is per path). Each (spec, GPUs, variant, scope) is one task, run in ``jobs``
processes. Pure data: ``report.jigsaw`` renders it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._same_named import same_named
from ridgeline.errors import InfeasiblePlan
from ridgeline.pipeline.gpu import NO_MIG, compute_slices, gpu_type, parse_gpus
from ridgeline.pipeline.planned import max_demand, to_plan
from ridgeline.pipeline.planner import (
    AccuracyScope,
    Features,
    PlannerOptions,
    PlanResult,
    plan_pipeline,
)
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.pipeline.roofline import FIT_FILE, fitted_roofline, modelled_rows, variant_gflops
from ridgeline.pipeline.spec import PipelineSpec, load_spec
from ridgeline.plansim import PlanSimResult, SimConfig, arrival_schedule, simulate_plan
from ridgeline.study._pool import as_finished
from ridgeline.study.jigsaw_result import (
    AppRow,
    GpuRow,
    JigsawResult,
    OccupancyRow,
    SettingRow,
    Simulated,
    TaskChoice,
)

SETTINGS: tuple[str, ...] = ("none", "A", "S", "T", "A+T", "A+S", "S+T", "A+S+T")
"""The eight settings, as ``Features.label`` writes them."""
EXAMPLES: tuple[Path, ...] = tuple(
    Path("examples/specs") / f"{a}.yaml" for a in ("social-media", "traffic", "ar-assistant")
)
BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
SLO_SCALES: tuple[float, ...] = (0.5, 1.0, 2.0)


def features(label: str) -> Features:
    """``A+S+T`` → ``Features``."""
    return Features.parse(label.replace("+", ","))


def fit_error() -> float:
    """The roofline fit's RMS log error over all its rows (``errors.all.rms_log``)."""
    text = resources.files("ridgeline").joinpath("data", FIT_FILE).read_text()
    return float(json.loads(text)["errors"]["all"]["rms_log"])


class Variant(BaseModel):
    """The inputs moved: every modelled latency × ``latency_scale``, the SLO × ``slo_scale``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_scale: float = Field(1.0, gt=0)
    slo_scale: float = Field(1.0, gt=0)

    @property
    def label(self) -> str:
        parts = [f"latency ×{self.latency_scale:.2f}"] if self.latency_scale != 1 else []
        parts += [f"SLO ×{self.slo_scale:g}"] if self.slo_scale != 1 else []
        return ", ".join(parts) or "central"


CENTRAL = Variant()


class JigsawConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    specs: tuple[Path, ...] = Field(EXAMPLES, min_length=1, description="pipeline specs")
    gpus: tuple[str, ...] = Field(("8xA100-80GB",), min_length=1, description="GPU sets")
    central_gpus: tuple[str, ...] = Field(
        (), description="GPU sets run on the central inputs only (a larger system, say)"
    )
    batches: tuple[int, ...] = Field(BATCHES, min_length=1, description="profiled batches")
    rel: float = Field(0.01, gt=0, lt=1, description="max demand's relative precision")
    requests: int = Field(20_000, ge=0, description="simulated requests per plan; 0: none")
    seed: int = Field(7, ge=0, description="arrivals' and batch noise's seed")
    ranges: bool = Field(True, description="also the latency and SLO variants")
    grid: bool = Field(False, description="every latency × SLO pair, not one at a time")
    slo_scales: tuple[float, ...] = Field(SLO_SCALES, description="SLO factors")
    latency_error: float | None = Field(
        None, ge=0, description="e of the latency factors exp(±e); None: the fit's RMS log error"
    )
    graph_scope: bool = Field(True, description="also the whole-graph accuracy floor")
    time_limit_s: float = Field(
        60.0,
        gt=0,
        description="HiGHS's limit a solve (the planner's default is 10 s: on two shared "
        "cores a 64-GPU solve with the whole-graph floor ran past it with no plan)",
    )
    jobs: int = Field(2, ge=1, le=64, description="processes")
    served: bool = Field(
        False,
        description="also size every plan for Poisson, gamma CV 3 and the bundled trace "
        "and serve it in the simulator, dropping on and off (``study.jigsaw_served``)",
    )

    @classmethod
    def quick(cls, **overrides: Any) -> JigsawConfig:
        """A minute's look: the central inputs only, 5,000 simulated requests a plan."""
        return cls.model_validate({"ranges": False, "requests": 5_000, **overrides})

    def all_gpus(self) -> tuple[str, ...]:
        return (*self.gpus, *(g for g in self.central_gpus if g not in self.gpus))

    def error(self) -> float:
        return fit_error() if self.latency_error is None else self.latency_error

    def variants(self) -> list[Variant]:
        """The central inputs first, then each variant of them."""
        if not self.ranges:
            return [CENTRAL]
        e = self.error()
        ks = sorted({math.exp(-e), 1.0, math.exp(e)})
        ss = sorted({*self.slo_scales, 1.0})
        if self.grid:
            pairs = list(itertools.product(ks, ss))
        else:
            pairs = [(k, 1.0) for k in ks] + [(1.0, s) for s in ss if s != 1]
        out = [Variant(latency_scale=k, slo_scale=s) for k, s in pairs]
        return [CENTRAL, *(v for v in out if v != CENTRAL)]


def table_for(
    spec: PipelineSpec, pools: Iterable[str], batches: Iterable[int], k: float
) -> ProfileTable:
    """Roofline rows of every variant of ``spec`` on every segment of ``pools``, every
    latency × ``k`` (so every throughput ÷ ``k``)."""
    variants = [v for t in spec.tasks.values() for v in t.variants]
    return ProfileTable(
        r for pool in pools for r in modelled_rows(variants, pool, tuple(batches), calibration=k)
    )


def available(gpus: str) -> dict[str, float]:
    """``8xA100-80GB`` → {A100-80GB: 56 compute slices}."""
    return compute_slices(gpus)


def app_row(spec: PipelineSpec, path: Path) -> AppRow:
    options = PlannerOptions()
    paths = [list(p) for p in spec.paths()]
    bound = options.bound_ms(spec)
    return AppRow(
        name=spec.name,
        spec=str(path),
        slo_ms=spec.slo_ms,
        bound_ms=bound,
        equal_budget_ms=bound / max(len(p) for p in paths),
        accuracy_floor=spec.accuracy_floor,
        tasks={t: [v.name for v in task.variants] for t, task in spec.tasks.items()},
        paths=paths,
    )


@dataclass(frozen=True)
class _Task:
    spec: Path
    gpus: str
    variant: Variant
    scope: AccuracyScope
    cfg: JigsawConfig
    cost: float
    """For the order: the dearest first."""

    @property
    def simulate(self) -> bool:
        """Simulate each plan at its maximum and plan every setting at none's maximum:
        on the central inputs, the default floor."""
        return self.variant == CENTRAL and self.scope == "path"


def _choices(spec: PipelineSpec, result: PlanResult) -> list[TaskChoice]:
    out = []
    for t, p in result.tasks.items():
        row = p.config.row
        best = spec.tasks[t].variant(p.variant).accuracy == spec.tasks[t].best_accuracy()
        # the row's variant, segment and batch; the plan's instances and wait
        out.append(
            same_named(
                TaskChoice,
                row,
                p,
                task=t,
                best=best,
                fill_ms=p.queue_ms,
                exec_ms=row.latency_ms,
                utilisation=p.utilisation,
            )
        )
    return out


def simulated(result: PlanResult, table: ProfileTable, requests: int, seed: int) -> Simulated:
    """``result``'s plan served at its own demand, as served and with no early drops."""
    demand = result.spec.demand_rps
    plan = to_plan(result)

    def run(drop: bool) -> PlanSimResult:
        schedule = arrival_schedule("poisson", rate=demand, duration_s=requests / demand, seed=seed)
        return simulate_plan(plan, schedule, SimConfig(seed=seed, drop=drop), table)

    served, kept = run(True), run(False)
    return Simulated(
        demand_rps=demand,
        requests=served.requests,
        violation_rate=served.violation_rate,
        dropped=served.dropped,
        late=served.late,
        p99_ms=served.latency_ms.get("p99"),
        violation_rate_no_drop=kept.violation_rate,
        p99_ms_no_drop=kept.latency_ms.get("p99"),
    )


def _run(task: _Task) -> list[SettingRow]:
    """Every setting's max demand for one (spec, GPUs, variant, scope)."""
    base = load_spec(task.spec)
    v, cfg = task.variant, task.cfg
    spec = base.model_copy(update={"slo_ms": base.slo_ms * v.slo_scale})
    pools = available(task.gpus)
    table = table_for(spec, pools, cfg.batches, v.latency_scale)
    options = PlannerOptions(accuracy_scope=task.scope, time_limit_s=cfg.time_limit_s)
    settings = [s for s in SETTINGS if task.scope == "path" or "A" in s]
    rows: list[SettingRow] = []
    plans: dict[str, PlanResult] = {}
    for s in settings:
        started = time.perf_counter()
        plan = partial(
            plan_pipeline, table=table, available=pools, features=features(s), options=options
        )
        top, result = max_demand(spec, plan, cfg.rel)
        row = same_named(  # the task's GPUs and scope, the variant's scales
            SettingRow,
            v,
            task,
            app=spec.name,
            variant=v.label,
            slo_ms=spec.slo_ms,
            setting=s,
            max_demand_rps=top,
        )
        if result is not None and top > 0:
            plans[s] = result
            row = row.model_copy(
                update={
                    "slices": sum(result.slices.values()),
                    "memory_slices": sum(result.memory_slices.values()),
                    "cost": sum(result.cost.values()),
                    "accuracy": result.accuracy,
                    "graph_accuracy": result.graph_accuracy,
                    "path_ms": max(result.path_latency_ms.values()),
                    "gap": result.gap,
                    "tasks": _choices(spec, result),
                }
            )
            if task.simulate and cfg.requests > 0:
                row.at_max = simulated(result, table, cfg.requests, cfg.seed)
        row.wall_s = time.perf_counter() - started
        rows.append(row)
    if task.simulate and "none" in plans:
        fixed = spec.model_copy(update={"demand_rps": plans["none"].spec.demand_rps})
        for row in rows:
            try:
                there = plan_pipeline(fixed, table, pools, features(row.setting), options)
            except InfeasiblePlan:
                continue
            row.cost_at_none_max = sum(there.cost.values())
            if cfg.requests > 0:
                row.at_none_max = simulated(there, table, cfg.requests, cfg.seed)
    return rows


def occupancy(spec: PipelineSpec, pool: str, batches: tuple[int, ...]) -> list[OccupancyRow]:
    """Per variant: seven of the smallest MIG slice's throughput over a whole GPU's."""
    g = gpu_type(pool)
    small = min(g.profiles, key=lambda p: (p.compute, p.memory_slices))
    per_gpu = 7 // small.compute
    table = table_for(spec, [pool], batches, 1.0)
    thr = {(r.variant, r.segment, r.batch): r.throughput_rps for r in table}
    out = []
    for t in spec.tasks.values():
        for var in t.variants:
            ratio = {
                b: per_gpu * thr[var.name, small.name, b] / thr[var.name, NO_MIG, b]
                for b in batches
            }
            out.append(
                OccupancyRow(
                    pool=pool,
                    variant=var.name,
                    gflops=variant_gflops(var),
                    slice=small.name,
                    slices_per_gpu=per_gpu,
                    ratio=ratio,
                )
            )
    return out


@dataclass(frozen=True)
class TaskDone:
    """One finished task: what the progress line shows."""

    index: int
    total: int
    rows: list[SettingRow]
    """Its settings' rows, one (spec, GPU set, variant, scope) between them."""
    elapsed_s: float


DoneFn = Callable[[TaskDone], None]


def run_jigsaw(cfg: JigsawConfig, *, on_task: DoneFn | None = None) -> JigsawResult:
    """Every spec × GPU set × variant × scope (module docstring)."""
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    specs = {p: load_spec(p) for p in cfg.specs}
    variants = cfg.variants()
    tasks: list[_Task] = []
    for path, spec in specs.items():
        size = sum(len(t.variants) for t in spec.tasks.values()) * len(spec.tasks)
        for gpus in cfg.all_gpus():
            available(gpus)  # a bad GPU set fails here, before any process starts
            for v in variants if gpus in cfg.gpus else [CENTRAL]:
                cost = size * (2 if v == CENTRAL else 1)  # the central one simulates
                tasks.append(_Task(path, gpus, v, "path", cfg, cost))
            if cfg.graph_scope:
                tasks.append(_Task(path, gpus, CENTRAL, "graph", cfg, size / 2))
    tasks.sort(key=lambda t: -t.cost)
    rows: list[SettingRow] = []
    for i, done in enumerate(as_finished(_run, tasks, cfg.jobs), start=1):
        rows += done
        if on_task is not None and done:
            on_task(TaskDone(i, len(tasks), done, time.perf_counter() - started))
    order_app = {s.name: i for i, s in enumerate(specs.values())}
    order_var = {v.label: i for i, v in enumerate(variants)}
    rows.sort(
        key=lambda r: (
            order_app[r.app],
            cfg.all_gpus().index(r.gpus),
            r.scope != "path",
            order_var[r.variant],
            SETTINGS.index(r.setting),
        )
    )
    pools = sorted({p for g in cfg.all_gpus() for p in parse_gpus(g)})
    occupied = [
        o for spec in specs.values() for p in pools for o in occupancy(spec, p, cfg.batches)
    ]
    unique: dict[tuple[str, str], OccupancyRow] = {}
    for o in occupied:
        unique.setdefault((o.pool, o.variant), o)
    return JigsawResult(
        started_at=started_at,
        wall_s=time.perf_counter() - started,
        jobs=cfg.jobs,
        cpus=os.cpu_count(),
        latency_error=cfg.error(),
        saturation_gflop_per_sm=fitted_roofline().saturation_gflop_per_sm,
        requests=cfg.requests,
        seed=cfg.seed,
        rel=cfg.rel,
        time_limit_s=cfg.time_limit_s,
        batches=list(cfg.batches),
        gpus=list(cfg.all_gpus()),
        variants=[v.label for v in variants],
        apps=[app_row(s, p) for p, s in specs.items()],
        gpu_types=[
            GpuRow(
                pool=p,
                sms=gpu_type(p).sms,
                whole_mig_sms=gpu_type(p).whole.sms,
                whole_mig=gpu_type(p).whole.name,
            )
            for p in pools
        ],
        occupancy=list(unique.values()),
        rows=rows,
    )
