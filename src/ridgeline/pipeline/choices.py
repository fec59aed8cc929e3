"""What the planner chooses among and what it answers: the feature switches
(``Features``), one task's candidate configuration (``Config``), a configuration at a
demand and an instance count with its latency bound (``PlannedTask``: fill, the wait for
a free instance, execution), the solver's options (``PlannerOptions``) and a plan
(``PlanResult``). The MILP over them is ``pipeline.planner``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

from ridgeline.errors import PlanError
from ridgeline.pipeline.profiles import ProfileRow
from ridgeline.pipeline.queueing import wait_quantile_s
from ridgeline.pipeline.spec import PipelineSpec

Objective = Literal["slices", "accuracy"]
AccuracyScope = Literal["path", "graph"]


@dataclass(frozen=True, slots=True)
class Features:
    """Which of JigsawServe's three features are on (all by default)."""

    accuracy_scaling: bool = True
    spatial: bool = True
    graph_budgets: bool = True

    @classmethod
    def parse(cls, text: str) -> Features:
        """``A,S,T`` (any subset, ``none`` for none)."""
        parts = {p.strip().upper() for p in text.split(",") if p.strip()}
        if parts == {"NONE"}:
            parts = set()
        bad = parts - {"A", "S", "T"}
        if bad:
            raise PlanError(
                f"features {', '.join(sorted(bad))}: write a subset of A,S,T (accuracy "
                "scaling, spatial partitioning, task-graph budgeting) or none"
            )
        return cls("A" in parts, "S" in parts, "T" in parts)

    @property
    def label(self) -> str:
        on = [k for k, v in zip("AST", self.as_tuple(), strict=True) if v]
        return "+".join(on) or "none"

    def as_tuple(self) -> tuple[bool, bool, bool]:
        return (self.accuracy_scaling, self.spatial, self.graph_budgets)


@dataclass(frozen=True, slots=True)
class Config:
    """One candidate configuration of one task."""

    task: str
    row: ProfileRow
    accuracy: float
    """The variant's accuracy as a fraction of its task's best."""
    cost: Fraction
    """Slices (or cores) one instance uses."""


@dataclass(frozen=True, slots=True)
class PlannedTask:
    """A configuration at a demand and an instance count: what it costs and how long a
    request takes."""

    task: str
    config: Config
    instances: int
    demand_rps: float
    queue_ms: float
    """The longest a batch waits to fill: ``(batch − 1)`` over the demand, at most one
    execution time (the queue delay the plan sets)."""
    wait_ms: float = 0.0
    """A full batch's wait for a free instance at the planner's quantile
    (``queueing.wait_quantile_s``)."""

    @classmethod
    def at(
        cls, config: Config, demand_rps: float, instances: int, options: PlannerOptions
    ) -> PlannedTask:
        row = config.row
        fill_ms = (row.batch - 1) / demand_rps * 1000.0
        wait_s = wait_quantile_s(
            instances,
            demand_rps,
            row.batch,
            row.latency_ms / 1000.0,
            quantile=options.quantile,
            service_cv=options.service_cv,
        )
        return cls(
            config.task,
            config,
            instances,
            demand_rps,
            min(fill_ms, row.latency_ms),
            wait_s * 1000.0,
        )

    @classmethod
    def candidates(
        cls, config: Config, demand_rps: float, options: PlannerOptions
    ) -> list[PlannedTask]:
        """The instance counts worth choosing among: from the fewest that keep each
        instance at most ``max_utilisation`` busy, one more at a time while the wait
        for a free instance is more than ``NEGLIGIBLE_WAIT`` of the execution (at most
        ``MAX_SPARE`` more): more instances buy latency, the MILP decides where that is
        worth it."""
        fewest = math.ceil(
            demand_rps / (options.max_utilisation * config.row.throughput_rps) - 1e-9
        )
        out = [cls.at(config, demand_rps, max(fewest, 1), options)]
        while out[-1].wait_ms > NEGLIGIBLE_WAIT * config.row.latency_ms and len(out) <= MAX_SPARE:
            out.append(cls.at(config, demand_rps, out[-1].instances + 1, options))
        return out

    @property
    def variant(self) -> str:
        return self.config.row.variant

    @property
    def latency_ms(self) -> float:
        """Fill, wait for an instance, execution: the task's share of a path's bound."""
        return self.queue_ms + self.wait_ms + self.config.row.latency_ms

    @property
    def slices(self) -> Fraction:
        return self.config.cost * self.instances

    @property
    def utilisation(self) -> float:
        return self.demand_rps / (self.instances * self.config.row.throughput_rps)


@dataclass(frozen=True, slots=True)
class PlanResult:
    spec: PipelineSpec
    features: Features
    tasks: dict[str, PlannedTask]
    slices: dict[str, float]
    """Compute slices (or cores) used, per pool; an MPS host slice counts whole."""
    available: dict[str, float]
    accuracy: float
    """System accuracy: the lowest over paths of the product of task accuracies, as a
    fraction of the best reachable."""
    solve_s: float
    gap: float
    """The MILP's relative optimality gap at the end of the (first) solve."""
    path_latency_ms: dict[tuple[str, ...], float] = field(default_factory=dict)
    memory_slices: dict[str, float] = field(default_factory=dict)
    """Memory slices (of 8 per GPU) used, per GPU pool."""
    cost: dict[str, float] = field(default_factory=dict)
    """What the plan takes, per pool (the objective): ``instance_cost`` summed on a GPU
    type, cores on the CPU."""
    graph_accuracy: float = 1.0
    """The product of every task's accuracy (a fraction of its best): the floor's other
    scope (``PlannerOptions.accuracy_scope``)."""

    @property
    def slices_used(self) -> float:
        return sum(self.slices.values())


@dataclass(frozen=True, slots=True)
class PlannerOptions:
    objective: Objective = "slices"
    max_utilisation: float = 0.9
    """No instance is planned busier than this. The queueing bound sets how many
    instances a latency budget needs; this ceiling keeps a margin for what it cannot
    see (service times that drift, a host that stalls)."""
    quantile: float = 0.99
    """The quantile of the wait for a free instance that a task's latency includes."""
    service_cv: float = 0.1
    """The coefficient of variation of batch execution times the queueing bound assumes."""
    accuracy_scope: AccuracyScope = "path"
    """Where the accuracy floor holds: ``path``, on every source-to-sink path (what one
    request's answer goes through: the default), or ``graph``, on the product over every
    task (stricter where paths branch: traffic's two paths at 0.907 and 0.940 multiply
    to 0.882 over the graph)."""
    slo_share: float = 0.9
    """The share of the SLO a path's bound may use. The rest is a margin for what the
    bound does not see and the runtime does: it keeps 10 % of the SLO back from its drop
    deadlines (``policies.dropping.DROP_MARGIN``) and adds the errors of its own model
    of the queues (``Slack``), so a plan that used the whole SLO would see requests
    dropped that would have made it."""
    time_limit_s: float = 10.0
    mip_gap: float = 0.01

    def bound_ms(self, spec: PipelineSpec) -> float:
        """What a path's latency may add up to: ``slo_share`` of the spec's SLO."""
        return spec.slo_ms * self.slo_share


MAX_SPARE = 8
"""Instances beyond the fewest an option may add to shorten the wait (``candidates``)."""
NEGLIGIBLE_WAIT = 0.05
"""A wait for a free instance this small a fraction of the execution is not worth
another instance's column (``candidates``): it is within the execution's own noise."""


ALL_FEATURES = Features()
"""Every feature on: JigsawServe's A+S+T, the planner's default."""
DEFAULT_OPTIONS = PlannerOptions()
