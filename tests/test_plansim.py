"""The served-plan simulator: the queueing laws (Little's law, Pollaczek–Khinchine for
M/D/1, latency monotone in instances), fan-out, drops counted as violations, service
times from profiles, a differential test against the serving runtime's own queues run on
a virtual-time event loop, and the command line."""

from __future__ import annotations

import asyncio
import json
import math
import selectors
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from _cli import ridgeline
from ridgeline.errors import ConfigError, PlanError
from ridgeline.loadgen.schedule import Schedule, from_arrival
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
from ridgeline.plansim import (
    PlanSimResult,
    SimConfig,
    arrival_schedule,
    service_times,
    simulate_plan,
)
from ridgeline.plansim.api import through_frontend
from ridgeline.plansim.engine import ANSWERED, DROPPED, Noise
from ridgeline.plansim.service import fit_linear
from ridgeline.policies.batching import BatchingConfig
from ridgeline.policies.dropping import ExecModel
from ridgeline.serve.batcher import TaskQueue
from ridgeline.serve.graph import GraphRunner
from ridgeline.serve.metrics import ServeMetrics
from ridgeline.v2.spec import TensorSpec
from ridgeline.workload.arrivals import parse_arrival

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "plans" / "traffic-cpu.yaml"
EXAMPLE_PROFILES = ROOT / "examples" / "profiles" / "traffic-cpu.csv"
NO_DROP = SimConfig(drop=False)


def synthetic(base_ms: float, per_item_ms: float = 0.0, cv: float = 0.0) -> dict[str, Any]:
    return {"base_ms": base_ms, "per_item_ms": per_item_ms, "noise_cv": cv, "max_batch_size": 64}


def task(
    base_ms: float,
    per_item_ms: float = 0.0,
    *,
    cv: float = 0.0,
    batch: int = 1,
    delay_ms: float = 0.0,
    instances: int = 1,
    budget_ms: float = 1000.0,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "variant": "v",
        "synthetic": synthetic(base_ms, per_item_ms, cv),
        "batch_size": batch,
        "max_queue_delay_ms": delay_ms,
        "instances": instances,
        "latency_budget_ms": budget_ms,
        **extra,
    }


def plan_of(tasks: dict[str, Any], edges: Sequence[Any] = (), slo_ms: float = 1e6) -> Plan:
    return Plan.model_validate(
        {"name": "p", "slo_ms": slo_ms, "tasks": tasks, "edges": list(edges)}
    )


def poisson(rate: float, duration_s: float, seed: int = 0) -> Schedule:
    return from_arrival(parse_arrival("poisson", rate), duration_s, seed)


def three_tasks(instances: int = 1) -> Plan:
    """detect → car (×2) and face (×1): the traffic example's shape, synthetic."""
    return plan_of(
        {
            "detect": task(4.0, 1.0, cv=0.2, batch=4, delay_ms=2, instances=instances,
                           budget_ms=100),
            "car": task(1.0, 0.5, cv=0.2, batch=8, delay_ms=2, budget_ms=100),
            "face": task(1.0, 0.5, cv=0.2, batch=8, delay_ms=2, budget_ms=100),
        },
        [
            {"source": "detect", "target": "car", "factor": 2},
            {"source": "detect", "target": "face", "factor": 1},
        ],
        slo_ms=200,
    )  # fmt: skip


# --- queueing laws ----------------------------------------------------------------------


def _still_inside_s(r: PlanSimResult) -> float:
    """R_T: the time the requests still in the system at the window's end T spend in
    it after T (every arrival is before T)."""
    return float(np.clip(r.finish_s - r.duration_s, 0.0, None).sum())


@settings(max_examples=20)
@example(base_ms=18.0, per_item_ms=3.5, batch=8, delay_ms=1.0, instances=1, cv=1.0,
         load=0.796875, drop=False, seed=1536)  # fmt: skip
@given(
    base_ms=st.floats(0.5, 20.0),
    per_item_ms=st.floats(0.0, 5.0),
    batch=st.integers(1, 8),
    delay_ms=st.floats(0.0, 5.0),
    instances=st.integers(1, 3),
    cv=st.floats(0.0, 1.0),
    load=st.floats(0.1, 0.85),
    drop=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_littles_law_holds_for_single_task_plans_below_saturation(
    base_ms: float,
    per_item_ms: float,
    batch: int,
    delay_ms: float,
    instances: int,
    cv: float,
    load: float,
    drop: bool,
    seed: int,
) -> None:
    """Little's law on the run's own path: the mean number in system over the arrival
    window [0, T] (the engine's own count) is λ·W (from the requests' columns) less
    R_T/T, R_T the time the requests still inside at T spend after it — exactly, as both
    sides are Σ (min(finish, T) − arrival), so to rounding here. R_T is not "about L
    requests holding about W each", a W/T error: it is the number inside at T times what
    they have left, and a queue's excursions make both large. The @example (load 0.8,
    batch-time CV 1) has 107 inside at T against L = 21.4, with 0.43 s left each against
    W = 0.157 s: R_T/T is 1.5 % of λW while W/T is 0.1 % (over 60 seeds of it, the gap's
    median was 0.01 %, its largest 0.97 %)."""
    capacity = instances * batch / ((base_ms + per_item_ms * batch) / 1000.0)
    rate = load * capacity
    duration = 20_000 / rate
    p = plan_of({"t": task(base_ms, per_item_ms, cv=cv, batch=batch, delay_ms=delay_ms,
                           instances=instances, budget_ms=1000)}, slo_ms=1000)  # fmt: skip
    r = simulate_plan(p, poisson(rate, duration, seed), SimConfig(seed=seed, drop=drop))
    assert r.mean_time_in_system_s / duration < 0.002
    lam = r.requests / duration
    little = lam * r.mean_time_in_system_s - _still_inside_s(r) / duration
    assert r.mean_in_system == pytest.approx(little, rel=1e-9)


def test_the_number_in_system_is_integrated_over_the_window_by_hand() -> None:
    """One instance of a 10 ms task, batches of up to 2, no delay; arrivals at 0, 2, 4
    and 22 ms, a window of 25 ms. Request 0 runs alone 0–10 ms, 1 and 2 together 10–20
    (answered at one instant), 3 runs 22–32. In the window they are inside 10, 18, 16
    and 3 ms: L = 47 / 25 = 1.88. λ·W = 4/25 ms × 54/4 ms = 2.16; the 7 ms request 3
    spends past the window, over 25, is the difference."""
    p = plan_of({"t": task(10.0, batch=2)})
    at = Schedule(np.array([0.0, 0.002, 0.004, 0.022]), None, 0.025, "4 by hand")
    r = simulate_plan(p, at, NO_DROP)
    np.testing.assert_allclose(r.finish_s, [0.010, 0.020, 0.020, 0.032], rtol=0, atol=1e-12)
    assert r.mean_in_system == pytest.approx(1.88, rel=1e-12)
    assert r.requests / r.duration_s * r.mean_time_in_system_s == pytest.approx(2.16, rel=1e-12)
    assert _still_inside_s(r) == pytest.approx(0.007, rel=1e-12)


def test_the_number_in_system_counts_the_front_ends_queue() -> None:
    """The front end test's case (three at once and one at 50 ms, a front end of 10 ms
    each, a 5 ms task with four instances): they are inside 15, 25, 35 and 15 ms, all
    within the 100 ms window, so L = 0.9 = λ·W. The pipeline alone holds them 5 ms each
    (0.2): the front end's 70 ms count too, as they do in the time in system."""
    p = plan_of({"a": task(5.0, instances=4)}, [], slo_ms=1000)
    at = Schedule(np.array([0.0, 0.0, 0.0, 0.05]), None, 0.1, "3 at once, 1 later")
    r = simulate_plan(p, at, SimConfig(frontend_ms=10.0, noise_cv=0.0))
    assert r.mean_in_system == pytest.approx(0.9, rel=1e-12)
    assert r.requests / r.duration_s * r.mean_time_in_system_s == pytest.approx(0.9, rel=1e-12)


@pytest.mark.parametrize(("cores", "frontend_ms"), [(None, 0.0), (1, 0.0), (2, 0.3)])
@pytest.mark.parametrize("rate", [300, 1500])
def test_littles_law_holds_on_the_path_of_a_fanning_out_dropping_plan(
    cores: int | None, frontend_ms: float, rate: float
) -> None:
    """The same identity through every path that changes the count: fan-out (a request
    answered when its last branch is), drops at arrival and at the queues (over capacity
    at 1,500 req/s), batches ending at one instant, shared cores, the front end."""
    cfg = SimConfig(seed=5, cpu_cores=cores, frontend_ms=frontend_ms)
    r = simulate_plan(three_tasks(), poisson(rate, 3.0, seed=5), cfg)
    if rate > 1000:
        assert r.dropped > r.dropped_at_arrival > 0
    lam = r.requests / r.duration_s
    little = lam * r.mean_time_in_system_s - _still_inside_s(r) / r.duration_s
    assert r.mean_in_system == pytest.approx(little, rel=1e-9)


@pytest.mark.parametrize(("rho", "tolerance"), [(0.5, 0.02), (0.8, 0.04)])
def test_an_md1_queue_waits_as_pollaczek_khinchine_says(rho: float, tolerance: float) -> None:
    """One instance, batches of one, a deterministic 10 ms service, Poisson arrivals, no
    drops: mean wait ρS / (2(1 − ρ)), over 400,000 requests (seed fixed). Waits are
    correlated over about 1/(1 − ρ)² services, so the estimate's spread grows with ρ:
    over seeds 1–4 it was within ±0.6 % at ρ = 0.5 and −0.8 … +2.6 % at ρ = 0.8; the
    tolerances are about two and a half standard errors."""
    s = 0.010
    p = plan_of({"t": task(s * 1000)})
    n = 400_000
    r = simulate_plan(p, poisson(rho / s, n * s / rho, seed=3), NO_DROP)
    (t,) = r.tasks
    wq = rho * s / (2 * (1 - rho))
    assert t.mean_queue_wait_ms / 1000 == pytest.approx(wq, rel=tolerance)
    assert r.latency_ms["mean"] == pytest.approx(t.mean_queue_wait_ms + s * 1000, rel=1e-9)
    assert t.utilisation == pytest.approx(rho, rel=0.01)


@settings(max_examples=25)
@given(
    base_ms=st.floats(1.0, 20.0),
    cv=st.floats(0.0, 1.5),
    instances=st.integers(1, 4),
    load=st.floats(0.3, 1.5),
    seed=st.integers(0, 2**16),
)
def test_another_instance_never_raises_any_requests_latency(
    base_ms: float, cv: float, instances: int, load: float, seed: int
) -> None:
    """The law, precisely: one task, batches of one, no queue delay, no drops, FIFO;
    the same arrivals and the k-th batch's noise draw the same in both runs (common
    random numbers, so request k gets the same service time). Then, by Kiefer and
    Wolfowitz's workload recursion, each request's latency with c + 1 instances is at
    most its latency with c (to rounding), so the mean and every percentile are too —
    overloaded or not."""
    rate = load * instances * 1000.0 / base_ms
    schedule = poisson(rate, 3_000 / rate, seed)
    runs = []
    for c in (instances, instances + 1):
        p = plan_of({"t": task(base_ms, cv=cv, instances=c)})
        runs.append(simulate_plan(p, schedule, SimConfig(seed=seed, drop=False)))
    fewer, more = (r.finish_s - r.arrival_s for r in runs)
    assert np.all(more <= fewer + 1e-9)
    for k in ("mean", "p50", "p99", "p999"):
        a, b = runs[1].latency_ms[k], runs[0].latency_ms[k]
        assert a is not None and b is not None and a <= b + 1e-6


# --- the drop law ---------------------------------------------------------------------------


@st.composite
def chains(draw: st.DrawFn) -> tuple[Plan, float]:
    """A chain of one to three tasks, each with its own batching, instances and noisy
    batch times (CV up to 1), an SLO between 1.2 and 5 times the worst pass (each task's
    queue delay and two full batches), and the rate its slowest task serves."""
    tasks, worst_ms, capacity = {}, 0.0, math.inf
    for i in range(draw(st.integers(1, 3))):
        base, per = draw(st.floats(1.0, 20.0)), draw(st.floats(0.0, 5.0))
        batch, delay = draw(st.integers(1, 8)), draw(st.floats(0.0, 5.0))
        instances = draw(st.integers(1, 3))
        tasks[f"t{i}"] = task(base, per, cv=draw(st.floats(0.0, 1.0)), batch=batch,
                              delay_ms=delay, instances=instances)  # fmt: skip
        full = base + per * batch
        worst_ms += delay + 2 * full
        capacity = min(capacity, instances * batch / full * 1000.0)
    slo = worst_ms * draw(st.floats(1.2, 5.0))
    for t in tasks.values():
        t["latency_budget_ms"] = slo / len(tasks)
    edges = [{"source": f"t{i}", "target": f"t{i + 1}"} for i in range(len(tasks) - 1)]
    return plan_of(tasks, edges, slo_ms=slo), capacity


@settings(max_examples=25, deadline=None)
@given(
    chains(),
    st.sampled_from(["poisson", "gamma:cv=2", "gamma:cv=4"]),
    st.floats(0.5, 1.2),
    st.integers(0, 2**16),
)
def test_dropping_never_misses_more_than_not_dropping_on_the_same_arrivals(
    chain: tuple[Plan, float], arrivals: str, load: float, seed: int
) -> None:
    """Issue 32's law: on the same arrivals (and the same batch-time draws), the share
    of requests dropped or late with early dropping on is not above the share late with
    it off, within sampling error (three binomial standard errors of the latter, at least
    one request's worth), and so its goodput (answers within the SLO) is not lower.
    Over 300 such plans (seeds 0–299 of the same generator) no run broke it; with the
    drop rule before (an upper-envelope execution model, an additive slack at its 0.9
    quantile) 22 of the first 150 did."""
    plan, capacity = chain
    rate = load * capacity
    schedule = from_arrival(parse_arrival(arrivals, rate), 3_000 / rate, seed)
    on = simulate_plan(plan, schedule, SimConfig(seed=seed, drop=True))
    off = simulate_plan(plan, schedule, NO_DROP.model_copy(update={"seed": seed}))
    n, p = on.requests, off.violation_rate
    tolerance = 3 * math.sqrt(max(p * (1 - p), 1 / n) / n)
    assert on.violation_rate <= p + tolerance
    good_on, good_off = n - on.violations, n - off.violations
    assert good_on >= good_off - tolerance * n


def test_a_slower_task_downstream_of_a_deep_queue_is_expected_late_enough() -> None:
    """The law above, broken on a case a random draw found (2026-12-06): two tasks, the
    second the slower (24.5 ms per batch of 3 against 29 ms per 5), gamma CV 4 arrivals
    at half the capacity. With the second task's queue read as it was when a request
    joined the first, dropping on dropped 19, none late, where off 9 came late; 10 of
    the 19 would have made it (465–536 ms of a 540 ms SLO): the rows ahead of a request
    at the first task reach the slower second task before it, and were not counted.
    With ``dropping.reached`` (the second task's backlog when the request gets there: its
    queue and the rows ahead upstream, less what it serves meanwhile) 16 dropped, within
    the law's sampling error of the 9."""
    plan = plan_of(
        {
            "t0": task(19.0, 2.0, batch=5, delay_ms=1.0, budget_ms=270.0),
            "t1": task(18.5, 2.0, batch=3, delay_ms=0.0, budget_ms=270.0),
        },
        [{"source": "t0", "target": "t1"}],
        slo_ms=540.0,
    )
    rate = 0.5 * 3 / 24.5 * 1000.0
    schedule = from_arrival(parse_arrival("gamma:cv=4", rate), 3_000 / rate, 2)
    on = simulate_plan(plan, schedule, SimConfig(seed=2, drop=True))
    off = simulate_plan(plan, schedule, NO_DROP.model_copy(update={"seed": 2}))
    n, p = on.requests, off.violation_rate
    assert on.violation_rate <= p + 3 * math.sqrt(max(p * (1 - p), 1 / n) / n)


def test_a_noisy_slow_task_after_a_fast_one_under_deep_bursts() -> None:
    """The law above, broken by the rule with ``dropping.reached`` and interpolated slack
    factors on one of 300 random plans (the generator above, Hypothesis seed 12345; the
    rule before held all 300): a fast first task (3 instances, batches of 2) before a slow,
    noisy one (15.8 + 2.6 ms a row, batches of 3, 2 instances, batch-time CV 0.68), a
    137 ms SLO, gamma CV 4 arrivals at half the capacity. Dropping on: 53 dropped and
    227 late of 3,005 (9.3 %); off: 229 late (7.6 %), past three standard errors (1.45
    points). It held once each task scaled its own fresh expectation by the request's
    ``Slack`` factor instead of carrying the arrival's offset (``Slack.judge``): 97
    dropped, 5.6 % missed against 7.6 % (found 2026-12-06, an xfail until 2026-12-07);
    with a slack per place a request is judged (``dropping.Trail``), 86 dropped, 7.0 %
    missed."""
    budget = 68.6067365559706
    first = task(4.828575274043827, 0.0406443623305608, cv=0.30710668673460756,
                 batch=2, delay_ms=4.828575274043827, instances=3, budget_ms=budget)  # fmt: skip
    second = task(15.756396548237324, 2.6383815664907933, cv=0.6823578164119023,
                  batch=3, delay_ms=2.695583798076315, instances=2, budget_ms=budget)  # fmt: skip
    plan = plan_of(
        {"t0": first, "t1": second},
        [{"source": "t0", "target": "t1"}],
        slo_ms=137.2134731119412,
    )
    capacity = 2 * 3 / (15.756396548237324 + 3 * 2.6383815664907933) * 1000.0
    rate = 0.5043097967139166 * capacity
    schedule = from_arrival(parse_arrival("gamma:cv=4", rate), 3_000 / rate, 21239)
    on = simulate_plan(plan, schedule, SimConfig(seed=21239, drop=True))
    off = simulate_plan(plan, schedule, NO_DROP.model_copy(update={"seed": 21239}))
    n, p = on.requests, off.violation_rate
    assert on.violation_rate <= p + 3 * math.sqrt(max(p * (1 - p), 1 / n) / n)


@pytest.mark.xfail(strict=True, reason="the pipeline's arrival check borrows a factor")
def test_one_task_under_deep_bursts_that_nothing_makes_late() -> None:
    """The law above, broken by a request's worth on a draw ``make test-busy`` found
    (2026-12-07): one task (9 + 3 ms a row, batches of 5, 2 instances, batch-time CV
    0.5), a 182 ms SLO, gamma CV 4 arrivals at 0.56 of the capacity. Without dropping
    none of 2,877 comes late; with it, 4 are dropped, all at the pipeline's arrival check,
    where three standard errors of none allow 3. The rule before this session's (one
    factor carried from arrival) dropped the same 4. That check borrows the lowest factor
    known where its bin has no answers yet (``Slack``): in a burst the deep bins are
    empty, and the shallow ones' factor is not low enough for them. Strict: when it holds,
    this fails, and the xfail comes off."""
    plan = plan_of(
        {"t0": task(9.0, 3.0, cv=0.5, batch=5, delay_ms=4.0, instances=2, budget_ms=182.0)},
        slo_ms=182.0,
    )
    rate = 0.5625 * 2 * 5 / (9.0 + 5 * 3.0) * 1000.0
    schedule = from_arrival(parse_arrival("gamma:cv=4", rate), 3_000 / rate, 172)
    on = simulate_plan(plan, schedule, SimConfig(seed=172, drop=True))
    off = simulate_plan(plan, schedule, NO_DROP.model_copy(update={"seed": 172}))
    assert (on.requests, off.violations) == (2_877, 0)
    n, p = on.requests, off.violation_rate
    assert on.violation_rate <= p + 3 * math.sqrt(max(p * (1 - p), 1 / n) / n)


# --- fan-out, drops -----------------------------------------------------------------------


def test_an_edge_factor_of_two_sends_the_child_twice_the_rows() -> None:
    p = plan_of(
        {"a": task(1.0, batch=4, delay_ms=1), "b": task(0.5, 0.1, batch=8, delay_ms=1)},
        [{"source": "a", "target": "b", "factor": 2}],
    )
    r = simulate_plan(p, poisson(200, 10, seed=1), NO_DROP)
    a, b = r.tasks
    assert r.answered == r.requests and a.rows == r.requests
    assert b.rows == 2 * a.rows
    assert b.requests == a.rows  # one chunk of two rows per request


def test_a_fractional_factor_is_carried_from_request_to_request() -> None:
    """2.5 rows per request, with a child batch of 2: the rows are carried exactly, and
    each request's rows go in chunks of at most the child's batch."""
    p = plan_of(
        {"a": task(1.0), "b": task(0.5, 0.1, batch=2)},
        [{"source": "a", "target": "b", "factor": 2.5}],
    )
    r = simulate_plan(p, poisson(100, 10, seed=2), NO_DROP)
    n = r.requests
    _, b = r.tasks
    assert b.rows == math.floor(2.5 * n + 1e-9)
    # requests alternately send 2 and 3 rows: one chunk, then two
    assert b.requests == n // 2 + 2 * (n - n // 2)


def test_a_plan_far_over_capacity_drops_says_so_and_counts_every_drop_as_a_violation() -> None:
    p = plan_of({"t": task(10.0, instances=1, budget_ms=100)}, slo_ms=100)  # 100/s at most
    r = simulate_plan(p, poisson(1000, 10, seed=4))
    assert r.dropped > 0.8 * r.requests
    assert r.answered + r.dropped == r.requests
    assert r.violations == r.dropped + r.late
    assert r.violation_rate == pytest.approx((r.dropped + r.late) / r.requests)
    assert r.violation_rate > 0.8
    (t,) = r.tasks
    assert t.utilisation > 0.95
    (warning,) = r.warnings
    assert warning.startswith("over capacity") and "'t'" in warning
    doc = r.to_json()
    assert doc["dropped"] == r.dropped and doc["violation_rate"] == r.violation_rate
    # without dropping, the same overload shows as late answers: still violations
    late = simulate_plan(p, poisson(1000, 10, seed=4), NO_DROP)
    assert late.dropped == 0 and late.late > 0.8 * late.requests
    assert late.violation_rate == late.late / late.requests


def test_a_run_is_exact_for_a_seed() -> None:
    a = simulate_plan(three_tasks(), poisson(300, 5, seed=7), SimConfig(seed=7))
    b = simulate_plan(three_tasks(), poisson(300, 5, seed=7), SimConfig(seed=7))
    assert np.array_equal(a.finish_s, b.finish_s) and np.array_equal(a.status, b.status)
    assert {k: v for k, v in a.to_json().items() if "wall" not in k} == {
        k: v for k, v in b.to_json().items() if "wall" not in k
    }


def test_a_constant_stream_at_an_idle_plan_has_the_exact_timeline() -> None:
    """Every 100 ms a request; a (5 ms) → b (2 + 1·rows ms, factor 2): each waits for
    nothing, so its latency is 5 + (2 + 2) = 9 ms exactly, and nothing is dropped."""
    p = plan_of(
        {"a": task(5.0, budget_ms=25), "b": task(2.0, 1.0, batch=4, budget_ms=25)},
        [{"source": "a", "target": "b", "factor": 2}],
        slo_ms=50,
    )
    r = simulate_plan(p, from_arrival(parse_arrival("constant", 10), 1.0))
    assert r.requests == 10 and r.answered == 10
    assert np.allclose(r.finish_s - r.arrival_s, 0.009, rtol=0, atol=1e-12)
    assert r.segments == {"cpu1": 2} and r.cpu_cores == 2 and r.gpu_slices == 0


def test_front_end_time_is_added_to_every_answer_and_kept_back_from_the_deadline() -> None:
    """The same timeline with 30 ms outside the queues: 39 ms each; with an SLO of 50 ms
    the drop deadline (90 % of it, less 30 ms) is then before the 9 ms of work of a busy
    pipeline, but an idle one is never dropped, so every request is still answered."""
    p = plan_of(
        {"a": task(5.0, budget_ms=25), "b": task(2.0, 1.0, batch=4, budget_ms=25)},
        [{"source": "a", "target": "b", "factor": 2}],
        slo_ms=50,
    )
    r = simulate_plan(
        p, from_arrival(parse_arrival("constant", 10), 1.0), SimConfig(frontend_ms=30.0)
    )
    assert r.answered == 10
    assert np.allclose(r.finish_s - r.arrival_s, 0.039, rtol=0, atol=1e-12)
    assert r.late == 0


def test_requests_queue_for_the_front_end_one_at_a_time() -> None:
    """Three at once, then one 50 ms on, through a front end of 10 ms each: they leave it
    at 10, 20 and 30 ms and at 60 ms (Lindley's recursion), and a plan of one 5 ms task
    with an instance each answers them at 15, 25, 35 and 65 ms."""
    left = through_frontend(np.array([0.0, 0.0, 0.0, 0.05]), 0.010)
    np.testing.assert_allclose(left, [0.010, 0.020, 0.030, 0.060], rtol=0, atol=1e-12)
    p = plan_of({"a": task(5.0, instances=4)}, [], slo_ms=1000)
    at = Schedule(np.array([0.0, 0.0, 0.0, 0.05]), None, 0.1, "3 at once, 1 later")
    r = simulate_plan(p, at, SimConfig(frontend_ms=10.0, noise_cv=0.0))
    np.testing.assert_allclose(r.finish_s, [0.015, 0.025, 0.035, 0.065], rtol=0, atol=1e-9)


# --- shared cores -------------------------------------------------------------------------


def _one_request() -> Schedule:
    return Schedule(np.array([0.0]), None, 1.0, "one request at 0")


def _busy_ms(r: PlanSimResult) -> dict[str, float]:
    return {t.name: round(t.utilisation * t.instances * r.simulated_s * 1000.0, 9) for t in r.tasks}


@pytest.mark.parametrize(("cores", "ends_ms"), [(1, 20.0), (2, 10.0)])
def test_two_batches_on_one_core_share_it_and_on_two_cores_do_not(
    cores: int, ends_ms: float
) -> None:
    """Two sources of 10 ms each, one request at 0: pinned to one core, both batches run
    at half speed and end at 20 ms; on two cores each has its own and ends at 10 ms."""
    p = plan_of({"a": task(10.0), "b": task(10.0)})
    r = simulate_plan(p, _one_request(), SimConfig(cpu_cores=cores))
    assert r.answered == 1
    assert r.finish_s[0] == pytest.approx(ends_ms / 1000.0, abs=1e-12)
    assert _busy_ms(r) == {"a": ends_ms, "b": ends_ms}


@pytest.mark.parametrize(
    ("cores", "ends_ms", "busy_ms"),
    [(2, 20.0, {"z": 15.0, "x": 5.0, "y": 15.0}), (3, 15.0, {"z": 10.0, "x": 5.0, "y": 10.0})],
)
def test_a_batch_joining_a_core_midway_slows_both_from_then_on(
    cores: int, ends_ms: float, busy_ms: dict[str, float]
) -> None:
    """z (10 ms) and x (5 ms) → y (10 ms); on two cores z and y share core 0 (in turn:
    z 0, x 1, y 0). z runs alone for 5 ms, then y joins: each at half speed, z's last 5
    ms take 10 and it ends at 15 ms; y has done 5 ms by then and ends alone at 20 ms. On
    three cores nothing is shared: z ends at 10, y at 15."""
    p = plan_of(
        {"z": task(10.0), "x": task(5.0), "y": task(10.0)}, [{"source": "x", "target": "y"}]
    )
    assert p.core_assignment(range(cores)) == (
        {"z": [(0,)], "x": [(1,)], "y": [(0,)]}
        if cores == 2
        else {"z": [(0,)], "x": [(1,)], "y": [(2,)]}
    )
    r = simulate_plan(p, _one_request(), SimConfig(cpu_cores=cores))
    assert r.finish_s[0] == pytest.approx(ends_ms / 1000.0, abs=1e-12)
    assert _busy_ms(r) == busy_ms


def test_a_batch_on_two_cores_goes_at_the_pace_of_its_most_crowded_one() -> None:
    """On two cores: w takes both (0, 1), u then gets 0, v gets 1, t gets 0 again. One
    request runs all four at once: core 0 holds w, u and t, core 1 w and v. w goes at a
    third (its crowded core), u and t at a third, v at a half: v (6 ms) ends at 12 ms;
    w, u and t have 2 ms left then, still at a third (core 0 holds three): they end at
    18 ms."""
    p = plan_of(
        {
            "w": task(6.0, segment={"kind": "cpu", "cores": 2}),
            "u": task(6.0),
            "v": task(6.0),
            "t": task(6.0),
        }
    )
    assert p.core_assignment([0, 1]) == {"w": [(0, 1)], "u": [(0,)], "v": [(1,)], "t": [(0,)]}
    r = simulate_plan(p, _one_request(), SimConfig(cpu_cores=2))
    assert r.finish_s[0] == pytest.approx(0.018, abs=1e-12)
    assert _busy_ms(r) == {"w": 18.0, "u": 18.0, "v": 12.0, "t": 18.0}


def test_cores_are_dealt_in_turn_and_an_instance_asking_more_than_the_host_gets_each_once() -> None:
    """As the runtime pins them: in turn over tasks and instances, wrapping round; three
    cores asked of a two-core host give both, and the core that showed the wrap is
    passed, so the next instance starts on core 1."""
    p = plan_of(
        {
            "big": task(1.0, segment={"kind": "cpu", "cores": 3}),
            "a": task(1.0, instances=2),
            "gpu": task(1.0, segment={"kind": "mig", "gpu": "A100-80GB", "profile": "1g.10gb"}),
        }
    )
    assert p.core_assignment([0, 1]) == {"big": [(0, 1)], "a": [(1,), (0,)]}
    assert p.core_assignment([4, 7, 9]) == {"big": [(4, 7, 9)], "a": [(4,), (7,)]}


def test_cores_enough_for_every_instance_change_nothing() -> None:
    """With a core for every instance nothing is shared: bit for bit the run without
    cores, noise, batching and drops included."""
    plain = simulate_plan(three_tasks(), poisson(300, 5, seed=7), SimConfig(seed=7))
    cored = simulate_plan(three_tasks(), poisson(300, 5, seed=7), SimConfig(seed=7, cpu_cores=3))
    assert np.array_equal(plain.finish_s, cored.finish_s)
    assert np.array_equal(plain.status, cored.status)


def test_instances_sharing_one_core_conserve_its_work() -> None:
    """Six requests at 0 to one task of 10 ms: one instance answers them at 10, 20, ...
    60 ms; three instances pinned to one core run three at a time at a third of its
    speed, 30, 30, 30, 60, 60, 60. The core never idles with work on it: the last is at
    60 ms either way."""
    burst = Schedule(np.zeros(6), None, 1.0, "six at 0")
    one = simulate_plan(plan_of({"a": task(10.0)}), burst, SimConfig(cpu_cores=1))
    three = simulate_plan(plan_of({"a": task(10.0, instances=3)}), burst, SimConfig(cpu_cores=1))
    assert np.allclose(np.sort(one.finish_s), [0.01, 0.02, 0.03, 0.04, 0.05, 0.06], atol=1e-12)
    assert np.allclose(np.sort(three.finish_s), [0.03] * 3 + [0.06] * 3, atol=1e-12)


def test_sharing_fewer_cores_lengthens_latency() -> None:
    """The example's shape without sharing, on two cores (detect and face share one)
    and on one (all three share it): every request answered, later the fewer cores."""
    sched = poisson(120, 30, seed=3)
    runs = [
        simulate_plan(three_tasks(), sched, SimConfig(seed=3, drop=False, cpu_cores=c))
        for c in (None, 2, 1)
    ]
    assert all(r.answered == r.requests for r in runs)
    mean = [float(np.mean(r.finish_s - r.arrival_s)) for r in runs]
    assert mean[0] < mean[1] < mean[2]


# --- service times --------------------------------------------------------------------------


def _row(variant: str, batch: int, ms: float, source: str = "measured", **kw: Any) -> ProfileRow:
    pool, segment = kw.get("pool", "cpu"), kw.get("segment", "cpu1")
    return ProfileRow(variant, pool, segment, batch, ms, batch * 1000 / ms, source)  # type: ignore[arg-type]


def test_profile_rows_are_fitted_by_least_squares_measured_first() -> None:
    """Measured rows of the task's variant and segment, of batches up to its own."""
    p = plan_of({"t": {**task(1.0, batch=4), "synthetic": None, "variant": "m"}})
    table = ProfileTable(
        [
            _row("m", 1, 3.0),
            _row("m", 2, 4.0),
            _row("m", 4, 6.0),
            _row("m", 8, 30.0),  # a batch it never runs
            _row("m", 4, 99.0, "modelled"),  # measured rows win
            _row("m", 1, 50.0, segment="cpu2"),  # another segment
            _row("other", 1, 50.0),
        ]
    )
    (s,) = service_times(p, table).values()
    assert (s.base_s, s.per_row_s) == pytest.approx((0.002, 0.001))
    assert s.noise_cv == 0.1 and s.source == "profiles: 3 measured rows"
    assert service_times(p, table, noise_cv=0.3)["t"].noise_cv == 0.3


def test_an_mps_share_matches_its_profile_label() -> None:
    seg = {"kind": "mps", "gpu": "A100-80GB", "profile": "1g.10gb", "share": 0.333}
    p = plan_of({"t": {**task(1.0), "synthetic": None, "variant": "m", "segment": seg}})
    table = ProfileTable([_row("m", 4, 8.0, "modelled", pool="A100-80GB", segment="1g.10gb@1/3")])
    (s,) = service_times(p, table).values()
    assert (s.base_s, s.per_row_s) == (0.008, 0.0)  # one batch size: every batch costs it


def test_fit_linear_keeps_both_terms_non_negative() -> None:
    assert fit_linear([1, 2, 4], [3.0, 4.0, 6.0]) == pytest.approx((2.0, 1.0))
    assert fit_linear([1, 2], [5.0, 4.0]) == (4.5, 0.0)  # falling: a constant
    assert fit_linear([1, 10], [0.5, 20.0])[0] == 0.0  # through the origin
    assert fit_linear([4, 4], [6.0, 8.0]) == (7.0, 0.0)


def test_a_task_without_a_service_time_is_named_with_the_fix() -> None:
    p = plan_of({"ok": task(1.0), "bare": {**task(1.0), "synthetic": None, "variant": "m"}})
    with pytest.raises(PlanError, match=r"task 'bare' has no service time.*--profiles"):
        service_times(p)
    table = ProfileTable([_row("m", 1, 2.0, segment="cpu2")])
    with pytest.raises(PlanError, match=r"no row for it \(the table has 'm' on cpu2\)"):
        service_times(p, table)


def test_arrivals_need_a_rate_or_a_trace() -> None:
    with pytest.raises(ConfigError, match="--rate"):
        arrival_schedule(duration_s=10)
    with pytest.raises(ConfigError, match="--target-rate"):
        arrival_schedule(trace="x.csv", duration_s=10)


def test_a_request_larger_than_a_preferred_size_goes_alone_as_in_the_runtime() -> None:
    """b's preferred size (2) is smaller than the 3 rows each request sends it: the
    request goes alone, a batch of 3, in the simulator as in the runtime (the one queue,
    ``policies.queue``, never splits a request nor spins on it)."""
    p = plan_of(
        {"a": task(1.0), "b": task(1.0, batch=4, preferred_batch_sizes=[2])},
        [{"source": "a", "target": "b", "factor": 3}],
    )
    sim = _agree(p, poisson(10, 2, seed=3), seed=1, drop=False)
    b = next(t for t in sim.tasks if t.name == "b")
    assert sim.answered == sim.requests > 0
    assert b.rows == 3 * b.batches


# --- the simulator decides as the runtime does ---------------------------------------------


class _VirtualSelector(selectors.DefaultSelector):
    loop: _VirtualLoop

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        scheduled = self.loop._scheduled  # type: ignore[attr-defined]
        if not events and (timeout is None or timeout > 0) and scheduled:
            self.loop.now_s = max(self.loop.now_s, scheduled[0]._when)
        return events


class _VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop in virtual time: when nothing is ready, time jumps to the next
    timer instead of sleeping."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.now_s = 0.0
        self._clock_resolution = 1e-12

    def time(self) -> float:
        return self.now_s


class _LoopClock:
    def now(self) -> float:
        return asyncio.get_running_loop().time()


class _Sleeping:
    """An instance that sleeps the task's batch time: mean × the task's noise draw."""

    def __init__(self, mean_s: list[float], noise: Noise) -> None:
        self.mean_s, self.noise = mean_s, noise

    async def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        rows = len(inputs["x"])
        took = self.mean_s[rows]
        if took > 0.0 and self.noise.cv > 0.0:
            took *= self.noise.draw()
        await asyncio.sleep(took)
        return {"y": inputs["x"]}


def _served(plan: Plan, times: np.ndarray, seed: int, drop: bool) -> tuple[list[int], list[float]]:
    """``plan`` served by the runtime's own TaskQueues and GraphRunner, its instances
    sleeping in virtual time: each request's status and finish."""
    services = service_times(plan)
    clock = _LoopClock()
    spec = [TensorSpec("x", "FP32", (-1, 1))]
    out = [TensorSpec("y", "FP32", (-1, 1))]
    status, finish = [0] * len(times), [0.0] * len(times)

    async def main() -> None:
        metrics = ServeMetrics(clock.now)
        queues: dict[str, TaskQueue] = {}
        for k, (name, t) in enumerate(plan.tasks.items()):
            s = services[name]
            mean = [s.mean_s(r) for r in range(t.batch_size + 1)]
            noise = Noise(s.noise_cv, seed, k)
            after = [e.target for e in plan.children(name)]

            def remaining(
                ahead_rows: float = 0.0, elapsed_s: float = 0.0, /, after: list[str] = after
            ) -> float:
                paths = (queues[c].expected_s(ahead_rows, elapsed_s) for c in after)
                return max(paths, default=0.0)

            cfg = BatchingConfig(
                max_batch_size=t.batch_size,
                max_queue_delay_s=t.max_queue_delay_ms / 1000.0,
                preferred_batch_sizes=t.preferred_batch_sizes,
            )
            instances = [_Sleeping(mean, noise) for _ in range(t.instances)]
            q = TaskQueue(name, spec, out, cfg, instances, clock, metrics, remaining, drop)
            q.core.exec = ExecModel.from_warmup(mean[1], t.batch_size, mean[t.batch_size])
            queues[name] = q
        runner = GraphRunner(plan, queues, clock)
        loop = asyncio.get_running_loop()
        pending = []

        async def one(i: int) -> None:
            try:
                await runner.infer(1, [np.zeros((1, 1), np.float32)], drop=drop)
                status[i] = ANSWERED
            except Exception:
                status[i] = DROPPED
            finish[i] = clock.now()

        def start(i: int) -> None:
            pending.append(asyncio.ensure_future(one(i)))

        for i, t in enumerate(times.tolist()):
            loop.call_at(t, start, i)
        await asyncio.sleep(float(times[-1]) + 1e-9)
        while pending:
            await pending.pop()

    loop = _VirtualLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return status, finish


def _agree(plan: Plan, schedule: Schedule, seed: int, drop: bool) -> PlanSimResult:
    sim = simulate_plan(plan, schedule, SimConfig(seed=seed, drop=drop))
    status, finish = _served(plan, schedule.times, seed=seed, drop=drop)
    assert sim.status.tolist() == status
    assert np.allclose(sim.finish_s, finish, rtol=0, atol=1e-9)
    return sim


@pytest.mark.parametrize(
    ("rate", "drop"),
    [(150.0, True), (800.0, True), (450.0, False)],
    ids=["under capacity", "over capacity", "over capacity, no drops"],
)
def test_the_simulator_answers_and_drops_each_request_as_the_runtime_does(
    rate: float, drop: bool
) -> None:
    """The same plan (fan-out 2 and 1.5 into smaller batches, noise, two detector
    instances, preferred sizes) served by the runtime's TaskQueue and GraphRunner on a
    virtual-time event loop, and simulated: every request's outcome is the same, and its
    finish to rounding. Drops at arrival, at a queue and at batch forming, the execution
    model and the slack all take part."""
    p = plan_of(
        {
            "detect": task(4.0, 1.0, cv=0.3, batch=4, delay_ms=3, instances=2, budget_ms=60),
            "car": task(1.0, 0.8, cv=0.3, batch=3, delay_ms=2, budget_ms=40),
            "face": task(2.0, 0.5, cv=0.3, batch=4, delay_ms=2, budget_ms=40,
                         preferred_batch_sizes=[2, 4]),
        },
        [
            {"source": "detect", "target": "car", "factor": 2},
            {"source": "detect", "target": "face", "factor": 1.5},
        ],
        slo_ms=100,
    )  # fmt: skip
    sim = _agree(p, poisson(rate, 8.0, seed=11), seed=5, drop=drop)
    if drop and rate > 300:  # the drops were exercised, at arrival and at the tasks
        assert sim.dropped > 0.1 * sim.requests
        assert 0 < sim.dropped_at_arrival < sim.dropped


_tasks = st.builds(
    lambda base, per, cv, batch, delay, instances: task(
        base, per, cv=cv, batch=batch, delay_ms=delay, instances=instances, budget_ms=30
    ),
    st.floats(0.5, 5.0),
    st.floats(0.0, 2.0),
    st.floats(0.05, 0.8),  # noise: no two batches end at one instant (see engine.py)
    st.integers(1, 6),
    st.sampled_from([0.0, 1.0, 3.0]),
    st.integers(1, 3),
)


@settings(max_examples=10)
@given(
    tasks=st.fixed_dictionaries({k: _tasks for k in "abcd"}),
    factors=st.tuples(*(st.sampled_from([0.7, 1.0, 1.5, 2.0, 3.3]) for _ in range(4))),
    diamond=st.booleans(),
    rate=st.floats(50.0, 800.0),
    drop=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_plans_agree_with_the_runtime_request_by_request(
    tasks: dict[str, Any],
    factors: tuple[float, ...],
    diamond: bool,
    rate: float,
    drop: bool,
    seed: int,
) -> None:
    """a → b, a → c, then b → d and c → d (a diamond: d runs twice per request) or d a
    second source; fractional factors into batches smaller than the rows sent."""
    edges = [("a", "b"), ("a", "c"), *((("b", "d"), ("c", "d")) if diamond else ())]
    p = plan_of(
        tasks,
        [
            {"source": s, "target": d, "factor": f}
            for (s, d), f in zip(edges, factors[: len(edges)], strict=True)
        ],
        slo_ms=100,
    )
    _agree(p, poisson(rate, 2.0, seed=seed), seed=seed, drop=drop)


# --- the command line -----------------------------------------------------------------------


def simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return ridgeline("simulate", *args)


def test_simulate_the_example_plan_with_its_profiles_as_json() -> None:
    res = simulate(
        str(EXAMPLE), "--profiles", str(EXAMPLE_PROFILES), "--rate", "10", "--duration", "30",
        "--seed", "1", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert {
        "plan", "requests", "answered", "dropped", "late", "violations", "violation_rate",
        "latency_ms", "tasks", "segments", "gpu_slices", "cpu_cores", "simulated_s",
        "wall_s", "warnings",
    } <= set(doc)  # fmt: skip
    assert set(doc["latency_ms"]) == {"mean", "p50", "p90", "p99", "p999"}
    assert set(doc["tasks"]) == {"detect", "car", "face"}
    assert {"utilisation", "mean_queue_wait_ms", "mean_batch", "drops"} <= set(
        doc["tasks"]["detect"]
    )
    assert doc["segments"] == {"cpu1": 3} and doc["cpu_cores"] == 3
    assert doc["requests"] == doc["answered"] + doc["dropped"] > 200
    assert doc["tasks"]["car"]["rows"] == 2 * doc["tasks"]["detect"]["rows"]


def test_simulate_a_trace_and_print_the_table(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: s\nslo_ms: 100\ntasks:\n"
        "  t: {variant: v, synthetic: {base_ms: 2, per_item_ms: 1}, batch_size: 4,"
        " latency_budget_ms: 100}\n"
    )
    from ridgeline.workload import bundled_trace_path

    res = simulate(str(plan), "--trace", str(bundled_trace_path()), "--target-rate", "50",
                    "--duration", "20")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "simulated plan s" in res.stdout and "requests 1,000" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([str(EXAMPLE), "--duration", "5"], "--rate"),
        (["missing.yaml", "--rate", "5"], "missing.yaml"),
        ([str(EXAMPLE), "--rate", "5"], "task 'detect' has no service time"),
        ([str(EXAMPLE), "--rate", "5", "--noise-cv", "-1"], "--noise-cv: "),
    ],
    ids=["no arrivals", "no plan file", "no service time", "bad noise"],
)
def test_a_bad_input_is_a_clear_error_and_exit_code_2(args: list[str], message: str) -> None:
    res = simulate(*args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("error:") and message in res.stderr, res.stderr
