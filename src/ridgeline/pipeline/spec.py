"""Registration: a compound inference system as the planner sees it.

A pipeline spec names its tasks; each task lists model variants that could do it, each
with its accuracy (as published: mAP, top-1, CIDEr; the planner compares variants of one
task only, as a fraction of the task's best) and where its model comes from (a zoo
variant, an ONNX artifact, or a synthetic latency model). Edges carry multiplicative
factors, which may depend on the upstream variant (a larger detector finds more objects
per frame). The end-to-end latency SLO bounds every source-to-sink path; the accuracy
floor is a fraction of the best system accuracy reachable (default 0.9); demand is in
requests per second::

    name: traffic
    slo_ms: 250
    demand_rps: 300
    tasks:
      detect:
        variants:
          - {name: yolov5n, accuracy: 28.0}
          - {name: yolov5s, accuracy: 37.4}
      car:
        variants:
          - {name: efficientnet-b0, accuracy: 77.1}
    edges:
      - {source: detect, target: car, factor: {yolov5n: 1.8, yolov5s: 2.2}}

``examples/specs/`` holds the three application shapes of the JigsawServe paper, with
published accuracy figures and their source.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ridgeline._fields import Positive
from ridgeline._repeats import repeated
from ridgeline._yaml_config import load_model
from ridgeline.errors import PlanError
from ridgeline.pipeline.plan import Name, SyntheticModel, check_graph, paths


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VariantSpec(_Frozen):
    """One model that can do a task."""

    name: Name = Field(description="variant name (a zoo variant, or any label)")
    accuracy: Positive = Field(description="published accuracy, any positive scale")
    source: str | None = Field(None, description="where the accuracy figure was published")
    artifact: str | None = Field(None, description="ONNX file, relative to the spec")
    synthetic: SyntheticModel | None = Field(None, description="a latency model instead")
    gflops: Positive | None = Field(None, description="GFLOPs per item (for the roofline)")
    mbytes: Positive | None = Field(
        None, description="MB moved per item (weights + activations, for the roofline)"
    )

    @model_validator(mode="after")
    def _one_model(self) -> Self:
        if self.artifact is not None and self.synthetic is not None:
            raise ValueError(f"variant {self.name}: give artifact or synthetic, not both")
        return self


class TaskSpec(_Frozen):
    variants: tuple[VariantSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        if dup := repeated(v.name for v in self.variants):
            raise ValueError(f"variant names repeat: {', '.join(dup)}")
        return self

    def best_accuracy(self) -> float:
        return max(v.accuracy for v in self.variants)

    def variant(self, name: str) -> VariantSpec:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)


class EdgeSpec(_Frozen):
    """One request to ``source`` becomes ``factor`` requests to ``target``; a mapping
    gives the factor per variant of ``source``."""

    source: Name
    target: Name
    factor: float | dict[str, float] = 1.0

    def factor_for(self, variant: str) -> float:
        if isinstance(self.factor, dict):
            return self.factor[variant]
        return self.factor

    def factors(self) -> list[float]:
        return list(self.factor.values()) if isinstance(self.factor, dict) else [self.factor]


class PipelineSpec(_Frozen):
    """A whole pipeline to plan; see the module docstring."""

    name: Name
    slo_ms: Positive = Field(description="end-to-end latency SLO, ms")
    accuracy_floor: float = Field(
        0.9, gt=0, le=1, description="system accuracy floor, a fraction of the best reachable"
    )
    demand_rps: Positive = Field(description="requests per second to the pipeline")
    tasks: dict[Name, TaskSpec] = Field(min_length=1)
    edges: tuple[EdgeSpec, ...] = ()

    @model_validator(mode="after")
    def _a_dag(self) -> Self:
        check_graph(self)
        for e in self.edges:
            if isinstance(e.factor, dict):
                have = {v.name for v in self.tasks[e.source].variants}
                if set(e.factor) != have:
                    raise ValueError(
                        f"edge {e.source} -> {e.target}: factor names variants "
                        f"{sorted(e.factor)}, but {e.source} has {sorted(have)}; give one "
                        "factor per variant"
                    )
                bad = {k: f for k, f in e.factor.items() if not 0 < f <= 1000}
                if bad:
                    raise ValueError(
                        f"edge {e.source} -> {e.target}: factors {bad} not in (0, 1000]"
                    )
            elif not 0 < e.factor <= 1000:
                raise ValueError(
                    f"edge {e.source} -> {e.target}: factor {e.factor} not in (0, 1000]"
                )
        return self

    def at_demand(self, demand_rps: float) -> PipelineSpec:
        """This spec with another demand, validated as the file's is (finite, > 0)."""
        try:
            return PipelineSpec.model_validate({**self.model_dump(), "demand_rps": demand_rps})
        except ValidationError:
            raise PlanError(
                f"demand {demand_rps} req/s: a demand must be a finite number above 0"
            ) from None

    def children(self, task: str) -> list[EdgeSpec]:
        return [e for e in self.edges if e.source == task]

    def parents(self, task: str) -> list[EdgeSpec]:
        return [e for e in self.edges if e.target == task]

    def sources(self) -> list[str]:
        targets = {e.target for e in self.edges}
        return [t for t in self.tasks if t not in targets]

    def order(self) -> list[str]:
        """Tasks in topological order (parents first)."""
        done: list[str] = []
        while len(done) < len(self.tasks):
            for t in self.tasks:
                if t not in done and all(e.source in done for e in self.parents(t)):
                    done.append(t)
        return done

    def paths(self) -> Iterator[list[str]]:
        """Every source-to-sink path."""
        return paths(self)

    def demand(self, task: str, choice: dict[str, str]) -> float:
        """Requests/s reaching ``task`` when each task runs the variant in ``choice``."""
        if not self.parents(task):
            return self.demand_rps
        return sum(
            self.demand(e.source, choice) * e.factor_for(choice[e.source])
            for e in self.parents(task)
        )


def load_spec(path: str | Path) -> PipelineSpec:
    """A pipeline spec from a YAML file; every problem names its field and the fix."""
    return load_model(
        PipelineSpec, path, "pipeline spec", "name, slo_ms, demand_rps, tasks and edges"
    )
