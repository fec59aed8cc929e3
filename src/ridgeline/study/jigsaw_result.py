"""The JigsawServe study's results as data (``study.jigsaw`` makes them,
``report.jigsaw`` renders them): per plan its tasks and its simulated service, per
setting its row, per application and GPU type what the tables print, and the whole
result, stored as JSON."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, Field

from ridgeline.pipeline.planner import AccuracyScope


class TaskChoice(BaseModel):
    """One task of a plan."""

    task: str
    variant: str
    best: bool
    """Whether it is the task's most accurate variant."""
    segment: str
    batch: int
    instances: int
    fill_ms: float
    wait_ms: float
    exec_ms: float
    utilisation: float


class Simulated(BaseModel):
    """A plan served in the plan simulator under Poisson arrivals at ``demand_rps``."""

    demand_rps: float
    requests: int
    violation_rate: float
    """Late or dropped over all requests, as served (early drops on)."""
    dropped: int
    late: int
    p99_ms: float | None
    violation_rate_no_drop: float
    """The same arrivals and seed with early dropping off (``--no-drop``)."""
    p99_ms_no_drop: float | None


class ServedCell(BaseModel):
    """One plan, sized for one arrival process, served under it (``study.jigsaw_served``)."""

    app: str
    gpus: str
    slo_ms: float
    setting: str
    arrivals: str
    plain_max_rps: float
    """The plain MILP plan's max demand (no simulator check)."""
    max_rps: float
    """The most the GPUs serve with a plan sized until it holds under ``arrivals``; 0
    when not even ``FLOOR`` of the plain maximum does."""
    sized_for_rps: float | None = None
    requests: int = 0
    violation_rate: float = 0.0
    """Late or dropped, as served (dropping on)."""
    dropped: int = 0
    late: int = 0
    violation_rate_no_drop: float = 0.0
    """Late, the same arrivals and batch times with dropping off."""
    p99_ms: float | None = None
    p99_ms_no_drop: float | None = None
    wall_s: float = 0.0

    @property
    def drop_helps(self) -> bool:
        """Dropping missed no more than not dropping (exactly: same arrivals)."""
        return self.violation_rate <= self.violation_rate_no_drop


class SettingRow(BaseModel):
    app: str
    gpus: str
    variant: str
    latency_scale: float
    slo_scale: float
    slo_ms: float
    scope: AccuracyScope
    setting: str
    max_demand_rps: float
    """0 when not even the smallest demand tried can be served."""
    slices: float | None = None
    memory_slices: float | None = None
    cost: float | None = None
    accuracy: float | None = None
    """The lowest over paths of the product of the tasks' accuracies (of the best)."""
    graph_accuracy: float | None = None
    path_ms: float | None = None
    """The plan's longest path bound (fill + wait + execution)."""
    gap: float | None = None
    """HiGHS's relative gap on the plan's cost (above 1 %: the time limit stopped it)."""
    tasks: list[TaskChoice] = Field(default_factory=list)
    at_max: Simulated | None = None
    cost_at_none_max: float | None = None
    """Its plan's cost at the demand "none" serves (None: infeasible there)."""
    at_none_max: Simulated | None = None
    wall_s: float = 0.0


class AppRow(BaseModel):
    name: str
    spec: str
    slo_ms: float
    bound_ms: float
    """What a path may use (``slo_share`` of the SLO)."""
    equal_budget_ms: float
    """Each task's budget with T off: ``bound_ms`` over the longest path's task count."""
    accuracy_floor: float
    tasks: dict[str, list[str]]
    paths: list[list[str]]


class OccupancyRow(BaseModel):
    """What spatial partitioning can win for one variant: the throughput of the
    smallest MIG slices that fill a GPU over one whole GPU's, at a batch size."""

    pool: str
    variant: str
    gflops: float
    slice: str
    slices_per_gpu: int
    ratio: dict[int, float]
    """Batch → (slices per GPU × a slice's throughput) ÷ the whole GPU's."""


class GpuRow(BaseModel):
    pool: str
    sms: int
    """SMs of the whole GPU with MIG off (segment ``gpu``)."""
    whole_mig_sms: int
    """SMs of its largest MIG profile."""
    whole_mig: str


class JigsawResult(BaseModel):
    started_at: datetime
    wall_s: float
    jobs: int
    cpus: int | None
    latency_error: float
    """e: latencies were scaled by exp(±e)."""
    saturation_gflop_per_sm: float | None
    requests: int
    seed: int
    rel: float
    time_limit_s: float
    batches: list[int]
    gpus: list[str]
    variants: list[str]
    apps: list[AppRow]
    gpu_types: list[GpuRow]
    occupancy: list[OccupancyRow]
    rows: list[SettingRow]
    served: list[ServedCell] = Field(default_factory=list)
    """``--served``: every plan sized for its traffic and served (``study.jigsaw_served``)."""

    def row(
        self,
        app: str,
        gpus: str,
        setting: str,
        variant: str = "central",
        scope: AccuracyScope = "path",
    ) -> SettingRow:
        for r in self.rows:
            if (r.app, r.gpus, r.setting, r.variant, r.scope) == (
                app,
                gpus,
                setting,
                variant,
                scope,
            ):
                return r
        raise KeyError(f"no row for {app} on {gpus}, {setting}, {variant}, {scope}")

    def ratio(
        self, app: str, gpus: str, num: str, den: str, scope: AccuracyScope = "path"
    ) -> Ratio:
        """``num``'s max demand over ``den``'s: on the central inputs, and its least and
        greatest over every variant (the central included) where ``den`` serves some."""
        values: dict[str, float] = {}
        undefined: list[str] = []
        for v in self.variants:
            try:
                a, b = self.row(app, gpus, num, v, scope), self.row(app, gpus, den, v, scope)
            except KeyError:  # not run on these GPUs or under this floor
                continue
            if b.max_demand_rps > 0:
                values[v] = a.max_demand_rps / b.max_demand_rps
            else:
                undefined.append(v)
        return Ratio(
            values.get("central"),
            min(values.values(), default=None),
            max(values.values(), default=None),
            values,
            undefined,
        )


@dataclass(frozen=True)
class Ratio:
    central: float | None
    low: float | None
    high: float | None
    values: dict[str, float]
    undefined: list[str]
    """Variants run where the denominator serves nothing."""
