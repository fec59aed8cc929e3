"""The Plan: a validated, serialisable description of what runs.

Per task: the model variant and where its model comes from (an ONNX artifact, a zoo
variant, or a synthetic latency model), the segment each instance is bound to (CPU
cores, a MIG slice, or an MPS share of one), the batch size, the dynamic-batching
queue delay, the instance count and the task's latency budget. The task graph's edges
carry multiplicative factors: one request to ``source`` becomes ``factor`` requests to
``target`` (a detector that finds 3 objects per frame sends 3 crops to a classifier).
The end-to-end SLO bounds every source-to-sink path.

The planner writes plans and ``ridgeline serve`` runs them; a hand-written YAML plan
serves the same way::

    name: traffic
    slo_ms: 250
    tasks:
      detect:   {variant: yolov5n, segment: {kind: cpu, cores: 1}, batch_size: 4,
                 max_queue_delay_ms: 5, instances: 1, latency_budget_ms: 120}
      classify: {variant: efficientnet-b0, segment: {kind: cpu, cores: 1},
                 batch_size: 8, max_queue_delay_ms: 5, instances: 1,
                 latency_budget_ms: 100}
    edges:
      - {source: detect, target: classify, factor: 3}

This module checks what a plan says about itself (names, ranges, a graph without
cycles, budgets within the SLO on every path). What it says about the world — that an
artifact exists, that a variant is known, that a batch fits the model — is checked when
it is loaded to serve (``serve.loading``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ridgeline._fields import Count, Positive
from ridgeline._yaml_config import load_model
from ridgeline.pipeline.segments import CpuSegment, Segment
from ridgeline.synthetic.model import BaseMs, BatchCost, PerItemMs

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]
"""A task or plan name: usable in a URL path and as a Prometheus label."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SyntheticModel(BatchCost):
    """The shared latency model as a backend: base + per-item time per batch (the same
    fields and bounds as the fake server's and the runtime's synthetic backend)."""

    base_ms: BaseMs
    per_item_ms: PerItemMs
    max_batch_size: Count = Field(64, le=4096)


class PythonModel(_Frozen):
    """Any importable backend class (``package.module:Class``), called with ``options``."""

    target: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    options: dict[str, Any] = Field(default_factory=dict)


class TaskPlan(_Frozen):
    """What one task runs, on what, with what batching, in what budget."""

    variant: str = Field(description="model variant (a zoo name, or any label)")
    artifact: str | None = Field(
        None, description="ONNX file (relative to the plan file); default: the zoo's"
    )
    synthetic: SyntheticModel | None = Field(None, description="a latency model instead")
    python: PythonModel | None = Field(None, description="a Python backend class instead")
    segment: Segment = Field(default_factory=CpuSegment)
    batch_size: Count = Field(1, le=4096, description="largest batch")
    max_queue_delay_ms: float = Field(0.0, ge=0, le=60_000, description="batching delay")
    preferred_batch_sizes: tuple[Count, ...] = ()
    instances: Count = Field(1, le=1024)
    latency_budget_ms: Positive = Field(description="this task's share of the SLO")
    gpus: tuple[Annotated[int, Field(ge=0)], ...] | None = Field(
        None,
        description="the GPU index each instance runs on, from `ridgeline plan`'s MIG layout "
        "(None: any GPU with a device of the segment's profile)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        given = [k for k in ("artifact", "synthetic", "python") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(
                f"give one of artifact, synthetic or python, not {' and '.join(given)}"
            )
        if self.synthetic is not None and self.batch_size > self.synthetic.max_batch_size:
            raise ValueError(
                f"batch_size {self.batch_size} is over the synthetic model's "
                f"max_batch_size {self.synthetic.max_batch_size}; lower it"
            )
        bad = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.batch_size]
        if bad:
            raise ValueError(f"preferred_batch_sizes {bad} must lie in 1..batch_size")
        return self


class Edge(_Frozen):
    """One request to ``source`` becomes ``factor`` requests to ``target``."""

    source: str
    target: str
    factor: float = Field(1.0, gt=0, le=1000, description="requests to target per source")


class Plan(_Frozen):
    """A whole plan; see the module docstring."""

    name: Name
    slo_ms: Positive = Field(description="end-to-end latency SLO, ms")
    tasks: dict[Name, TaskPlan] = Field(min_length=1)
    edges: tuple[Edge, ...] = ()
    demand_rps: Positive | None = Field(None, description="the demand it was planned for")
    checked_arrivals: tuple[str, ...] = Field(
        (),
        description="the arrival processes the simulator checked the plan under (`ridgeline "
        "plan --check-arrivals`: poisson, gamma:cv=3, trace:BUNDLED); `ridgeline verify` "
        "replays each at the demand",
    )

    @model_validator(mode="after")
    def _a_dag_within_the_slo(self) -> Self:
        check_graph(self)
        for path in paths(self):
            total = sum(self.tasks[t].latency_budget_ms for t in path)
            if total > self.slo_ms * (1 + 1e-9):
                raise ValueError(
                    f"path {' -> '.join(path)} has latency budgets summing to {total:g} ms, "
                    f"over slo_ms {self.slo_ms:g}; lower the budgets or raise the SLO"
                )
        return self

    def children(self, task: str) -> list[Edge]:
        return [e for e in self.edges if e.source == task]

    def core_assignment(self, host_cores: Sequence[int]) -> dict[str, list[tuple[int, ...]]]:
        """The cores each instance of each CPU task is pinned to on a host with
        ``host_cores``, as the runtime pins them (``serve.loading``): handed out in
        turn over the tasks in the plan's order and their instances, wrapping round when
        the plan asks for more than the host has, so instances then share cores; an
        instance asking more cores than the host has gets each once. GPU tasks are left
        out."""
        if not host_cores:
            raise ValueError("a host has at least one core")
        ring, at = list(host_cores), 0
        out: dict[str, list[tuple[int, ...]]] = {}
        for name, task in self.tasks.items():
            seg = task.segment
            if not isinstance(seg, CpuSegment):
                continue
            pinned = []
            for _ in range(task.instances):
                n = min(seg.cores, len(ring))
                got = (ring[at:] + ring[:at])[:n]
                # more cores asked than the host has: the repeat that said so is passed
                at = (at + n + (seg.cores > n)) % len(ring)
                pinned.append(tuple(got))
            out[name] = pinned
        return out

    def sources(self) -> list[str]:
        targets = {e.target for e in self.edges}
        return [t for t in self.tasks if t not in targets]

    def arrival_factor(self, task: str) -> float:
        """Requests to ``task`` per request to the pipeline: the product of the edge
        factors along each path into it, summed over paths."""
        if task in self.sources():
            return 1.0
        return sum(self.arrival_factor(e.source) * e.factor for e in self.edges if e.target == task)


class _Arc(Protocol):
    @property
    def source(self) -> str: ...
    @property
    def target(self) -> str: ...


class Graph(Protocol):
    """A task graph: a plan, or a pipeline spec."""

    @property
    def tasks(self) -> Mapping[str, Any]: ...
    @property
    def edges(self) -> Sequence[_Arc]: ...


def check_graph(g: Graph) -> None:
    """Raise ValueError (for a pydantic validator) naming an edge to an unknown task or a
    cycle, with the fix."""
    for e in g.edges:
        for end in (e.source, e.target):
            if end not in g.tasks:
                raise ValueError(
                    f"edge {e.source} -> {e.target} names task {end!r}, which is not in "
                    f"tasks ({', '.join(sorted(g.tasks))})"
                )
    cycle = find_cycle(g)
    if cycle:
        raise ValueError(f"the task graph has a cycle: {' -> '.join(cycle)}; remove an edge")


def find_cycle(plan: Graph) -> list[str]:
    """One cycle of the task graph as ``[a, b, ..., a]``, or [] for a DAG."""
    colour: dict[str, int] = dict.fromkeys(plan.tasks, 0)  # 0 new, 1 on stack, 2 done
    stack: list[str] = []

    def visit(t: str) -> list[str]:
        colour[t] = 1
        stack.append(t)
        for e in plan.edges:
            if e.source != t:
                continue
            if colour[e.target] == 1:
                return [*stack[stack.index(e.target) :], e.target]
            if colour[e.target] == 0 and (found := visit(e.target)):
                return found
        stack.pop()
        colour[t] = 2
        return []

    for t in plan.tasks:
        if colour[t] == 0 and (found := visit(t)):
            return found
    return []


def paths(plan: Graph) -> Iterator[list[str]]:
    """Every source-to-sink path of a DAG."""

    def walk(t: str, prefix: list[str]) -> Iterator[list[str]]:
        out = [e for e in plan.edges if e.source == t]
        if not out:
            yield [*prefix, t]
        for e in out:
            yield from walk(e.target, [*prefix, t])

    targets = {e.target for e in plan.edges}
    for s in plan.tasks:
        if s not in targets:
            yield from walk(s, [])


def load_plan(path: str | Path) -> Plan:
    """A plan from a YAML file; every problem names its field and the fix."""
    return load_model(Plan, path, "plan", "name, slo_ms, tasks and edges")


def dump_plan(plan: Plan) -> str:
    """The plan as YAML (what ``load_plan`` reads back)."""
    doc = plan.model_dump(mode="json", exclude_none=True, exclude_defaults=False)
    return yaml.safe_dump(doc, sort_keys=False)
