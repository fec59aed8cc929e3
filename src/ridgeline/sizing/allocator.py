"""From a measured capacity to a number of replicas and GPUs, and what it saves.

The plan serves ``demand × (1 + headroom)`` with replicas that each carry at most
``capacity × calibration`` (the SLO capacity a probe measured, corrected by how the
production fleet compared with the test bench)::

    replicas = ⌈ demand · (1 + headroom) / (capacity · calibration) ⌉   (≥ 1 when demand > 0)
    gpus     = replicas · gpus_per_replica                (⌈ ⌉ to whole GPUs unless shares)

It is compared with the rule a spreadsheet really applies (``NaiveRule``): take the
maximum throughput of a closed-loop benchmark — a saturating operating point that is
blind to latency — and provision for peak at a fixed fraction of it, 50 % by default::

    naive replicas = ⌈ demand / (max_throughput · target_utilisation) ⌉

When the maximum throughput was not measured it is assumed from the SLO capacity:
``max_throughput = capacity / slo_fraction``, with capacity typically 75 % of the
closed-loop maximum at a latency SLO. The naive rule uses neither the headroom (its
utilisation target is its headroom) nor the calibration (it trusts the benchmark).
``overprovisioning_avoided`` is naive minus plan: negative when the naive rule would
have provisioned *less* than the SLO needs (then it is the under-provisioning it risks).
"""

from __future__ import annotations

import math
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ridgeline._fields import NonNegative, Positive, Share
from ridgeline.errors import ConfigError

_M = TypeVar("_M", bound=BaseModel)


_SLACK = 1e-9
"""A ratio within this of a whole number counts as that number: 100 req/s with 10 %
headroom at 10 req/s a replica is 11 replicas, not 12 from ``110.00000000000001 / 10``."""


class NaiveRule(BaseModel):
    """Sizing from a closed-loop maximum throughput at a fixed target utilisation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_utilisation: Share = Field(
        0.5,
        description="fraction of one replica's maximum throughput provisioned for at peak",
        examples=[0.5],
    )
    max_throughput_rps: Positive | None = Field(
        None,
        description="one replica's closed-loop maximum throughput, req/s; None: assumed "
        "as capacity / slo_fraction",
        examples=[160.0],
    )
    slo_fraction: Share = Field(
        0.75,
        description="SLO capacity / closed-loop maximum throughput, used when the maximum "
        "throughput is not given",
        examples=[0.75],
    )


class AllocationInputs(BaseModel):
    """What ``allocate`` plans from; each constraint is checked here, once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    capacity_rps: Positive = Field(
        description="SLO capacity of one replica, req/s (from `ridgeline probe`)",
        examples=[120.0],
    )
    demand_rps: NonNegative = Field(description="peak demand to serve, req/s", examples=[1000.0])
    headroom: NonNegative = Field(
        0.2, description="extra demand planned for, as a fraction", examples=[0.2]
    )
    calibration: Positive = Field(
        1.0,
        description="production capacity / bench capacity of one replica",
        examples=[0.9],
    )
    gpus_per_replica: Positive = Field(
        1.0,
        description="GPUs one replica takes (0.5, or 3/7 for a MIG 3g slice, when shared)",
        examples=[1.0],
    )
    fractional_gpus: bool = Field(
        False, description="count GPU shares (MIG, time-slicing) instead of whole GPUs"
    )


class NaiveAllocation(BaseModel):
    rule: NaiveRule
    max_throughput_rps: float = Field(description="given, or assumed from the capacity")
    per_replica_rps: float = Field(description="max_throughput × target_utilisation")
    replicas: int = Field(ge=0)
    gpus: float = Field(ge=0)


class Savings(BaseModel):
    replicas: int = Field(description="naive replicas − planned replicas (< 0: naive is short)")
    gpus: float = Field(description="naive GPUs − planned GPUs (< 0: naive is short)")
    fraction: float = Field(description="GPUs avoided / naive GPUs; 0 when naive needs none")


class Allocation(BaseModel):
    inputs: AllocationInputs
    planned_rps: float = Field(description="demand × (1 + headroom)")
    per_replica_rps: float = Field(description="capacity × calibration")
    replicas: int = Field(ge=0)
    gpus: float = Field(ge=0, description="whole GPUs unless fractional_gpus")
    utilisation_at_peak: float = Field(
        ge=0, description="demand / (replicas × per-replica capacity): each replica's load"
    )
    naive: NaiveAllocation
    overprovisioning_avoided: Savings


def _units(need: float, per_unit: float) -> int:
    """The fewest units of ``per_unit`` that cover ``need`` (at least 1 when need > 0)."""
    if need <= 0:
        return 0
    return max(1, math.ceil(need / per_unit - _SLACK))


def _gpus(replicas: int, per_replica: float, fractional: bool) -> float:
    total = replicas * per_replica
    return round(total, 9) if fractional else float(_units(total, 1.0))


def _validated(model: type[_M], values: dict[str, object]) -> _M:
    """``model`` from ``values``, or a ConfigError naming the field and a valid example."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0])
        info = model.model_fields[name]
        example = info.examples[0] if info.examples else None
        raise ConfigError(
            f"{name}={first.get('input')!r} is invalid ({first['msg'].lower()}); "
            f"{name} means: {info.description}; for example {name}={example}"
        ) from None


def naive_rule(
    target_utilisation: float = 0.5,
    max_throughput_rps: float | None = None,
    slo_fraction: float = 0.75,
) -> NaiveRule:
    """A ``NaiveRule``, or a ConfigError naming the field that is out of range."""
    return _validated(
        NaiveRule,
        {
            "target_utilisation": target_utilisation,
            "max_throughput_rps": max_throughput_rps,
            "slo_fraction": slo_fraction,
        },
    )


def allocate(
    capacity_rps: float,
    demand_rps: float,
    *,
    headroom: float = 0.2,
    calibration: float = 1.0,
    gpus_per_replica: float = 1.0,
    fractional_gpus: bool = False,
    naive: NaiveRule | None = None,
) -> Allocation:
    """Replicas and GPUs that serve ``demand_rps`` within the SLO behind ``capacity_rps``."""
    inputs = _validated(
        AllocationInputs,
        {
            "capacity_rps": capacity_rps,
            "demand_rps": demand_rps,
            "headroom": headroom,
            "calibration": calibration,
            "gpus_per_replica": gpus_per_replica,
            "fractional_gpus": fractional_gpus,
        },
    )
    rule = naive or NaiveRule()
    planned = inputs.demand_rps * (1.0 + inputs.headroom)
    per_replica = inputs.capacity_rps * inputs.calibration
    replicas = _units(planned, per_replica)
    gpus = _gpus(replicas, inputs.gpus_per_replica, inputs.fractional_gpus)

    naive_max = rule.max_throughput_rps or inputs.capacity_rps / rule.slo_fraction
    naive_per_replica = naive_max * rule.target_utilisation
    naive_replicas = _units(inputs.demand_rps, naive_per_replica)
    naive_gpus = _gpus(naive_replicas, inputs.gpus_per_replica, inputs.fractional_gpus)

    return Allocation(
        inputs=inputs,
        planned_rps=planned,
        per_replica_rps=per_replica,
        replicas=replicas,
        gpus=gpus,
        utilisation_at_peak=inputs.demand_rps / (replicas * per_replica) if replicas else 0.0,
        naive=NaiveAllocation(
            rule=rule,
            max_throughput_rps=naive_max,
            per_replica_rps=naive_per_replica,
            replicas=naive_replicas,
            gpus=naive_gpus,
        ),
        overprovisioning_avoided=Savings(
            replicas=naive_replicas - replicas,
            gpus=naive_gpus - gpus,
            fraction=(naive_gpus - gpus) / naive_gpus if naive_gpus else 0.0,
        ),
    )
