"""Plans checked in the served-plan simulator before they are returned: a plan the
simulation passes is returned as made; one it fails is sized up until it passes, and
what it returns then passes a fresh simulation (another seed, more requests); when no
plan passes within the GPUs, the error says so and keeps the best one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.errors import InfeasiblePlan, PlanCheckFailed
from ridgeline.pipeline.plan import Plan, dump_plan
from ridgeline.pipeline.planned import to_plan
from ridgeline.pipeline.planner import plan_pipeline
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
from ridgeline.pipeline.spec import PipelineSpec
from ridgeline.plansim import SimConfig, arrival_schedule, simulate_plan
from ridgeline.plansim.check import (
    CheckConfig,
    checked_plan,
    prediction_bound,
    violation_bound,
    window_bound,
)
from ridgeline.plansim.engine import ANSWERED, DROPPED

pytestmark = pytest.mark.timeout(120)

GPU = "A100-80GB"


def spec(**over: Any) -> PipelineSpec:
    doc: dict[str, Any] = {
        "name": "p",
        "slo_ms": 120,
        "demand_rps": 200,
        "tasks": {
            "detect": {"variants": [{"name": "det", "accuracy": 50}]},
            "classify": {"variants": [{"name": "cls", "accuracy": 80}]},
        },
        "edges": [{"source": "detect", "target": "classify", "factor": 1}],
    }
    doc.update(over)
    return PipelineSpec.model_validate(doc)


def rows() -> ProfileTable:
    """det: 10 ms a batch of one on 1g, 4 ms + 4 ms/row at larger batches; cls faster."""
    out = []
    for variant, base, per in (("det", 4.0, 4.0), ("cls", 2.0, 2.0)):
        for b in (1, 2, 4, 8):
            ms = base + per * b
            out.append(ProfileRow(variant, GPU, "1g.10gb", b, ms, b / ms * 1000.0))
    return ProfileTable(out)


def plan_of() -> Plan:
    return to_plan(plan_pipeline(spec(), rows(), {GPU: 56}))


def test_a_plan_the_simulation_passes_comes_back_as_made() -> None:
    got = checked_plan(spec(), rows(), {GPU: 56}, check=CheckConfig(arrivals=("poisson",)))
    assert got.headroom == 1.0
    assert [v for _, v in got.rounds] == ["held"]
    (run,) = got.runs
    assert run.violation_rate < 0.005
    assert got.plan.demand_rps == 200


def test_by_default_a_plan_is_checked_under_poisson_and_the_trace_from_six_starts() -> None:
    got = checked_plan(spec(), rows(), {GPU: 56})
    poisson, *trace = got.runs
    assert "poisson" in poisson.arrivals.lower()
    assert [t.arrivals.rsplit("seed ", 1)[1] for t in trace] == ["1", "2", "3", "4", "5", "6"]
    assert all("overlaid" in t.arrivals and t.requests == 20_000 for t in trace)
    assert all(t.violation_rate < 0.005 for t in trace)
    assert violation_bound(tuple(trace)) < 0.005
    assert window_bound(tuple(trace)) < 0.005  # and a fresh window is predicted to hold


def test_a_fresh_windows_bound_grows_with_how_much_the_windows_differ() -> None:
    """Six windows, five clean and one at 0.6 %: a fresh one is predicted up to
    mean + t(0.95, 5)·sd·√(7/6) = 0.1 % + 2.015 × 0.245 % × 1.080 = 0.633 % (Student's t
    from the table): such a plan fails a 0.5 % check though five windows of six held
    with nothing late. Six windows that agree bound a fresh one at their share."""
    assert prediction_bound([0, 0, 0, 0, 0, 0.006]) == pytest.approx(0.00633, rel=0.01)
    assert prediction_bound([0.002] * 6) == pytest.approx(0.002)
    assert prediction_bound([0.003]) == 0.003
    assert prediction_bound([]) == 0.0


@settings(max_examples=10, deadline=None)
@given(
    k=st.integers(5, 12),
    mean=st.floats(0.0, 0.01),
    sd=st.floats(1e-4, 0.01),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_fresh_draw_passes_the_prediction_bound_as_often_as_its_confidence(
    k: int, mean: float, sd: float, seed: int
) -> None:
    """The law of a prediction bound: with k draws from a normal distribution, one more
    draw exceeds their 95 % bound 5 % of the time (20,000 trials: ±0.75 points is nearly
    five standard errors, and the t quantile's expansion is within 0.02 at k ≥ 5)."""
    draws = np.random.default_rng(seed).normal(mean, sd, size=(20_000, k + 1))
    bounds = np.array([prediction_bound(row[:k]) for row in draws])
    missed = float(np.mean(draws[:, k] > bounds))
    assert missed == pytest.approx(0.05, abs=0.0075)


def test_the_violation_bound_widens_when_violations_come_together() -> None:
    """1,000 requests, 10 of them dropped: one in every stretch of 100, the bound is the
    share itself (every stretch agrees); the first ten, and it is far above it. A bound
    that counted requests as independent draws could not tell the two apart."""
    run = simulate_plan(
        plan_of(), arrival_schedule("constant", rate=100, duration_s=10), SimConfig(), rows()
    )
    assert run.requests == 1000
    on_time = replace(run, finish_s=run.arrival_s.copy(), status=np.full(1000, ANSWERED, np.uint8))
    spread = on_time.status.copy()
    spread[::100] = DROPPED
    together = on_time.status.copy()
    together[:10] = DROPPED
    assert violation_bound((on_time,)) == 0.0
    assert violation_bound((replace(on_time, status=spread),)) == pytest.approx(0.01)
    assert violation_bound((replace(on_time, status=together),)) > 0.025


def test_a_burstier_arrival_than_the_bound_assumes_is_sized_up_until_it_holds() -> None:
    """Gamma arrivals with CV 4 queue far longer than the Poisson bound expects: the first
    plan fails in simulation, a larger one holds, and holds again under a fresh seed."""
    check = CheckConfig(arrivals=("gamma:cv=4",), requests=20_000)
    got = checked_plan(spec(), rows(), {GPU: 56}, check=check)
    assert got.headroom > 1.0
    assert got.rounds[0][1] != "held" and got.rounds[-1][1] == "held"
    assert got.plan.checked_arrivals == ("gamma:cv=4",)  # what verify replays
    again = Plan.model_validate(yaml.safe_load(dump_plan(got.plan)))
    assert again.checked_arrivals == ("gamma:cv=4",)
    fresh = simulate_plan(
        got.plan,
        arrival_schedule("gamma:cv=4", rate=200, duration_s=200, seed=7),
        SimConfig(seed=7),
        rows(),
    )
    assert fresh.violation_rate < 0.01  # another seed, 40,000 requests


def test_when_no_plan_holds_within_the_gpus_the_error_keeps_the_best() -> None:
    check = CheckConfig(arrivals=("gamma:cv=4",), requests=10_000, max_rounds=3)
    with pytest.raises(PlanCheckFailed, match="no plan held the SLO 120 ms") as e:
        checked_plan(spec(), rows(), {GPU: 3}, check=check)
    assert e.value.best is not None
    # each round ended at the first window that failed: fewer than the six were served
    runs = e.value.best.runs
    assert 1 <= len(runs) < check.trace_windows
    assert runs[-1].violation_rate >= 0.005 or not runs[-1].judgment.latency_held
    assert all(r.violation_rate < 0.005 and r.judgment.latency_held for r in runs[:-1])


def test_a_plan_that_cannot_be_made_at_all_is_infeasible_as_before() -> None:
    with pytest.raises(InfeasiblePlan):
        checked_plan(spec(slo_ms=5), rows(), {GPU: 56})
