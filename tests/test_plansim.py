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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=20)
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
    """Mean number in system (the engine's own count, integrated over the arrival
    window) = arrival rate × mean time in system (from the requests' columns). The two
    differ only by the requests still in the system at the window's end, about L of
    them holding about W each: a relative error of order W/T, checked below 0.2 % here,
    so 1 % is a bound that never excuses a bookkeeping error."""
    capacity = instances * batch / ((base_ms + per_item_ms * batch) / 1000.0)
    rate = load * capacity
    duration = 20_000 / rate
    p = plan_of({"t": task(base_ms, per_item_ms, cv=cv, batch=batch, delay_ms=delay_ms,
                           instances=instances, budget_ms=1000)}, slo_ms=1000)  # fmt: skip
    r = simulate_plan(p, poisson(rate, duration, seed), SimConfig(seed=seed, drop=drop))
    assert r.mean_time_in_system_s / duration < 0.002
    lam = r.requests / duration
    assert r.mean_in_system == pytest.approx(lam * r.mean_time_in_system_s, rel=0.01)


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
    for k in ("mean", "p50", "p99", "p99.9"):
        a, b = runs[1].latency_ms[k], runs[0].latency_ms[k]
        assert a is not None and b is not None and a <= b + 1e-6


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


def test_a_preferred_size_smaller_than_a_request_is_refused_not_spun_on() -> None:
    p = plan_of(
        {"a": task(1.0), "b": task(1.0, batch=4, preferred_batch_sizes=[2])},
        [{"source": "a", "target": "b", "factor": 3}],
    )
    with pytest.raises(PlanError, match="preferred_batch_sizes"):
        simulate_plan(p, poisson(10, 2), NO_DROP)


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

            def remaining(after: list[str] = after) -> float:
                return max((queues[c].expected_s() for c in after), default=0.0)

            cfg = BatchingConfig(
                max_batch_size=t.batch_size,
                max_queue_delay_s=t.max_queue_delay_ms / 1000.0,
                preferred_batch_sizes=t.preferred_batch_sizes,
            )
            instances = [_Sleeping(mean, noise) for _ in range(t.instances)]
            q = TaskQueue(name, spec, out, cfg, instances, clock, metrics, remaining, drop)
            q.exec = ExecModel.from_warmup(mean[1], t.batch_size, mean[t.batch_size])
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
    [(150.0, True), (450.0, True), (450.0, False)],
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


def ridgeline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ridgeline", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_simulate_the_example_plan_with_its_profiles_as_json() -> None:
    res = ridgeline(
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
    assert set(doc["latency_ms"]) == {"mean", "p50", "p90", "p99", "p99.9"}
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

    res = ridgeline(str(plan), "--trace", str(bundled_trace_path()), "--target-rate", "50",
                    "--duration", "20")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "simulated plan s" in res.stdout and "requests 1,000" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([str(EXAMPLE), "--duration", "5"], "--rate"),
        (["missing.yaml", "--rate", "5"], "missing.yaml"),
        ([str(EXAMPLE), "--rate", "5"], "task 'detect' has no service time"),
        ([str(EXAMPLE), "--rate", "5", "--noise-cv", "-1"], "noise_cv"),
    ],
    ids=["no arrivals", "no plan file", "no service time", "bad noise"],
)
def test_a_bad_input_is_a_clear_error_and_exit_code_2(args: list[str], message: str) -> None:
    res = ridgeline(*args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("error:") and message in res.stderr, res.stderr
