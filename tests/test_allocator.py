"""The capacity allocator: worked examples, its laws, the naive rule and bad inputs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ridgeline.errors import ConfigError
from ridgeline.sizing import NaiveRule, allocate, naive_rule

capacities = st.floats(0.01, 1e5)
demands = st.floats(0.0, 1e6)
headrooms = st.floats(0.0, 3.0)
calibrations = st.floats(0.05, 5.0)


def test_a_worked_example_against_the_default_naive_rule() -> None:
    # 1000 req/s × 1.2 = 1200 at 120 a replica: 10. Naive: max assumed 120 / 0.75 = 160,
    # at 50 % = 80 a replica: ⌈1000 / 80⌉ = 13. Three GPUs of thirteen avoided.
    a = allocate(120.0, 1000.0)
    assert (a.planned_rps, a.per_replica_rps, a.replicas, a.gpus) == (1200.0, 120.0, 10, 10.0)
    assert a.utilisation_at_peak == pytest.approx(1000 / 1200)
    assert (a.naive.max_throughput_rps, a.naive.per_replica_rps) == (160.0, 80.0)
    assert (a.naive.replicas, a.naive.gpus) == (13, 13.0)
    s = a.overprovisioning_avoided
    assert (s.replicas, s.gpus) == (3, 3.0)
    assert s.fraction == pytest.approx(3 / 13)


def test_a_ratio_that_is_whole_up_to_rounding_is_not_rounded_up() -> None:
    # 100 × 1.1 is 110.00000000000001 in floating point; 11 replicas of 10 serve it.
    assert allocate(10.0, 100.0, headroom=0.1).replicas == 11


def test_no_demand_needs_nothing_and_a_trickle_needs_one_replica() -> None:
    zero = allocate(50.0, 0.0)
    assert (zero.replicas, zero.gpus, zero.utilisation_at_peak) == (0, 0.0, 0.0)
    assert (zero.naive.replicas, zero.overprovisioning_avoided.fraction) == (0, 0.0)
    assert allocate(1e5, 1e-9).replicas == 1


def test_shared_gpus_round_up_to_whole_ones_unless_shares_are_allowed() -> None:
    # 3 replicas at half a GPU each: 1.5 GPUs, so 2 whole ones.
    assert allocate(100.0, 300.0, headroom=0.0, gpus_per_replica=0.5).gpus == 2.0
    shared = allocate(100.0, 300.0, headroom=0.0, gpus_per_replica=0.5, fractional_gpus=True)
    assert shared.gpus == 1.5
    # A MIG 3g slice is 3/7 of a GPU: 7 replicas fill 3 GPUs exactly.
    assert allocate(10.0, 70.0, headroom=0.0, gpus_per_replica=3 / 7).gpus == 3.0


def test_calibration_scales_the_capacity_of_a_replica() -> None:
    assert allocate(100.0, 900.0, headroom=0.0, calibration=0.9).replicas == 10
    assert allocate(100.0, 900.0, headroom=0.0, calibration=1.0).replicas == 9


def test_a_measured_max_throughput_replaces_the_assumed_one() -> None:
    a = allocate(100.0, 1000.0, naive=NaiveRule(max_throughput_rps=250.0, target_utilisation=0.4))
    assert (a.naive.per_replica_rps, a.naive.replicas) == (100.0, 10)
    assert (a.replicas, a.overprovisioning_avoided.replicas) == (12, -2)


def test_when_the_slo_needs_more_than_the_naive_rule_the_saving_is_negative() -> None:
    # A bench twice as fast as production: 1200 / 50 = 24 replicas; naive 1000 / 66.7 = 15.
    a = allocate(100.0, 1000.0, calibration=0.5)
    assert (a.replicas, a.naive.replicas) == (24, 15)
    assert a.overprovisioning_avoided.gpus == -9.0
    assert a.overprovisioning_avoided.fraction == pytest.approx(-9 / 15)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("capacity_rps", {"capacity_rps": 0.0, "demand_rps": 10.0}),
        ("capacity_rps", {"capacity_rps": float("nan"), "demand_rps": 10.0}),
        ("demand_rps", {"capacity_rps": 10.0, "demand_rps": -1.0}),
        ("headroom", {"capacity_rps": 10.0, "demand_rps": 10.0, "headroom": -0.1}),
        ("calibration", {"capacity_rps": 10.0, "demand_rps": 10.0, "calibration": 0.0}),
        ("gpus_per_replica", {"capacity_rps": 10.0, "demand_rps": 10.0, "gpus_per_replica": -1}),
    ],
)
def test_a_bad_input_names_its_field_and_a_valid_example(
    field: str, kwargs: dict[str, float]
) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}=.* is invalid .*for example {field}=\d"):
        allocate(**kwargs)


def test_a_bad_naive_rule_names_its_field() -> None:
    with pytest.raises(ConfigError, match=r"target_utilisation=1\.5 is invalid"):
        naive_rule(target_utilisation=1.5)
    with pytest.raises(ConfigError, match="max_throughput_rps"):
        naive_rule(max_throughput_rps=0.0)


@given(capacities, demands, headrooms, calibrations)
def test_the_replicas_serve_the_planned_demand_and_one_fewer_would_not(
    capacity: float, demand: float, headroom: float, calibration: float
) -> None:
    a = allocate(capacity, demand, headroom=headroom, calibration=calibration)
    need = demand * (1 + headroom)
    per = capacity * calibration
    assert a.replicas * per >= need * (1 - 1e-9)
    assert a.replicas == 0 or (a.replicas - 1) * per < need
    assert (a.replicas == 0) == (demand == 0)
    assert a.utilisation_at_peak <= 1 / (1 + headroom) + 1e-9
    assert a.gpus >= a.replicas  # a whole GPU a replica


_INPUTS = {
    "capacity": capacities,
    "demand": demands,
    "headroom": headrooms,
    "calibration": calibrations,
}


@pytest.mark.parametrize(
    ("varied", "sign"),
    [("demand", 1), ("headroom", 1), ("capacity", -1), ("calibration", -1)],
    ids=[
        "never-fall-as-demand-rises",
        "never-fall-as-headroom-rises",
        "never-rise-as-capacity-rises",
        "never-rise-as-calibration-rises",
    ],
)
@given(capacities, demands, headrooms, calibrations, st.data())
def test_replicas_move_one_way_as_each_input_rises(
    varied: str,
    sign: int,
    capacity: float,
    demand: float,
    headroom: float,
    calibration: float,
    data: st.DataObject,
) -> None:
    base = {
        "capacity": capacity,
        "demand": demand,
        "headroom": headroom,
        "calibration": calibration,
    }
    lo, hi = sorted((base[varied], data.draw(_INPUTS[varied])))

    def replicas(value: float) -> int:
        given = {**base, varied: value}
        return allocate(
            given["capacity"],
            given["demand"],
            headroom=given["headroom"],
            calibration=given["calibration"],
        ).replicas

    assert sign * (replicas(hi) - replicas(lo)) >= 0
