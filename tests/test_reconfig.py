"""Reconfiguration: the pure policy (estimate, band, cool-down, difference) exactly, and
the controller scaling a live server up and back down with every request answered."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.pipeline.plan import Plan
from ridgeline.serve.controller import Reconfigurer
from ridgeline.serve.reconfig import (
    ReconfigConfig,
    ReconfigState,
    Replan,
    TaskChange,
    decide,
    diff,
    estimate_rps,
    failed,
)
from ridgeline.serve.runtime import PlanServer
from ridgeline.workload.arrivals import parse_arrival


def test_demand_is_the_arrivals_in_the_window() -> None:
    assert estimate_rps([0.5, 1.2, 1.9, 2.0, 2.5], now=2.0, window_s=1.0) == 3.0


def test_a_replan_waits_for_the_band_and_the_cooldown() -> None:
    cfg = ReconfigConfig(band=0.2, cooldown_s=10.0, headroom=0.1)
    state = ReconfigState(planned_rps=100.0, last_change_s=0.0)
    assert decide(cfg, state, 50.0, 115.0) == (None, state)  # inside [80, 120]
    assert decide(cfg, state, 5.0, 200.0) == (None, state)  # out, but cooling down
    replan, after = decide(cfg, state, 12.0, 200.0)
    assert replan == Replan(
        pytest.approx(220.0),
        "demand 200.0 req/s is above the band [80.0, 120.0] around the planned 100.0 "
        "req/s; re-plan for 220.0 req/s",
    )
    assert after == ReconfigState(planned_rps=pytest.approx(220.0), last_change_s=12.0)
    down, _ = decide(cfg, after, 30.0, 10.0)
    assert down is not None and down.demand_rps == pytest.approx(11.0)


def test_a_failed_replan_keeps_the_band_and_retries_after_the_cooldown() -> None:
    cfg = ReconfigConfig(band=0.2, cooldown_s=10.0, headroom=0.0)
    before = ReconfigState(planned_rps=100.0, last_change_s=0.0)
    replan, moved = decide(cfg, before, 12.0, 200.0)
    assert replan is not None and moved.planned_rps == 200.0
    after = failed(before, moved)  # the planner found no plan for 200 req/s
    assert after == ReconfigState(planned_rps=100.0, last_change_s=12.0)
    assert decide(cfg, after, 15.0, 200.0) == (None, after)  # cooling down
    again, _ = decide(cfg, after, 22.0, 200.0)
    assert again is not None and "around the planned 100.0 req/s" in again.reason


def test_stabilisation_scales_down_to_the_highest_estimate_of_its_window() -> None:
    """A burst, a gap, a burst: without stabilisation the gap drains the plan; with a
    window of 3 s the plan holds until the estimate has stayed low that long, then goes
    down to the highest estimate of those 3 s. Rising demand is followed at once."""
    estimates = [(1.0, 100.0), (2.0, 0.0), (3.0, 5.0), (4.0, 8.0), (5.0, 6.0), (6.0, 4.0)]

    def run(cfg: ReconfigConfig) -> list[tuple[float, float]]:
        state, out = ReconfigState(planned_rps=100.0), []
        for t, e in estimates:
            replan, state = decide(cfg, state, t, e)
            if replan is not None:
                out.append((t, replan.demand_rps))
        return out

    plain = ReconfigConfig(band=0.2, cooldown_s=0.0, headroom=0.0)
    assert run(plain) == [(2.0, 1.0), (3.0, 5.0), (4.0, 8.0), (5.0, 6.0), (6.0, 4.0)]
    held = ReconfigConfig(band=0.2, cooldown_s=0.0, headroom=0.0, stabilize_s=3.0)
    # at 2 and 3 the burst at 1 is in the window; at 4 the highest of (2, 4] is 8; then
    # 8 stays the highest of the window and inside the band around 8 until it leaves it
    assert run(held) == [(4.0, 8.0)]
    replan, _ = decide(held, ReconfigState(planned_rps=10.0), 1.0, 50.0)
    assert replan is not None and replan.demand_rps == 50.0  # up: at once
    down, _ = decide(held, ReconfigState(planned_rps=100.0, recent=((0.5, 40.0),)), 1.0, 10.0)
    assert down is not None and down.demand_rps == 40.0
    assert down.reason.startswith("demand 40.0 req/s (the highest of the last 3 s) is below")


def plan(
    instances: dict[str, int], batch: int = 4, demand: float = 20.0, budget_ms: float = 100
) -> Plan:
    task: dict[str, Any] = {
        "segment": {"kind": "cpu", "cores": 1},
        "batch_size": batch,
        "max_queue_delay_ms": 2,
        "latency_budget_ms": budget_ms,
        "synthetic": {"base_ms": 2, "per_item_ms": 1},
    }
    return Plan.model_validate(
        {
            "name": "pipe",
            "slo_ms": 400,
            "demand_rps": demand,
            "tasks": {
                "detect": {**task, "variant": "d", "instances": instances["detect"]},
                "classify": {**task, "variant": "c", "instances": instances["classify"]},
            },
            "edges": [{"source": "detect", "target": "classify", "factor": 2}],
        }
    )


def test_the_difference_names_instance_changes_and_replacements() -> None:
    old = plan({"detect": 1, "classify": 1})
    assert diff(old, plan({"detect": 3, "classify": 1})) == [TaskChange("detect", 1, 3, False)]
    assert diff(old, plan({"detect": 1, "classify": 1}, batch=8)) == [
        TaskChange("detect", 1, 1, True),
        TaskChange("classify", 1, 1, True),
    ]
    assert diff(old, old) == []


@contextlib.asynccontextmanager
async def controlled(
    tmp_path: Path, replan: Callable[[float], Plan], cfg: ReconfigConfig, interval_s: float
) -> AsyncIterator[tuple[PlanServer, Reconfigurer]]:
    """A one-instance pipeline served, its controller watching until the block ends."""
    async with PlanServer(
        plan({"detect": 1, "classify": 1}), tmp_path, http_port=0, grpc_port=None
    ) as server:
        ctl = Reconfigurer(server, replan, cfg, interval_s=interval_s)
        stop = asyncio.Event()
        watching = asyncio.create_task(ctl.run(stop))
        try:
            yield server, ctl
        finally:
            stop.set()
            await watching


@pytest.mark.slow
async def test_demand_up_and_down_scales_live_and_every_request_is_answered(
    tmp_path: Path,
) -> None:
    def replan(demand: float) -> Plan:
        n = min(3, math.ceil(demand / 60))
        return plan({"detect": n, "classify": n}, demand=demand)

    cfg = ReconfigConfig(window_s=1.0, band=0.3, cooldown_s=1.0, headroom=0.0)
    async with controlled(tmp_path, replan, cfg, 0.2) as (server, ctl):
        steps = []
        for rate, seconds in ((20.0, 2.0), (150.0, 3.0)):
            sched = from_arrival(parse_arrival("poisson", rate), seconds)
            steps.append(await measure_step(server.model_url(), sched, StepConfig()))
        # back to 20 req/s until the controller has scaled in, in 1 s steps, for at most
        # 30 s: it acts a window and a cool-down after the drop, once the scale-up's
        # workers have started, and starting them takes a busy host seconds (a fixed 3 s
        # phase ended before it got there)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sched = from_arrival(parse_arrival("poisson", 20.0), 1.0)
            steps.append(await measure_step(server.model_url(), sched, StepConfig()))
            if all(p.instances == 1 for p in server.plan.tasks.values()):
                break
        final = {t: p.instances for t, p in server.plan.tasks.items()}
    for step in steps:
        s = step.summary
        assert s.errors == 0 and s.timeouts == 0 and s.incomplete == 0 and s.not_sent == 0, s
        assert s.ok + s.dropped == s.sent, s  # every request sent got an answer
    peak = max(e.instances["detect"] for e in ctl.events)
    assert peak == 3, ctl.events
    assert final == {"detect": 1, "classify": 1}, ctl.events
    assert all(not e.skipped for e in ctl.events)
    assert all("re-plan for" in e.reason for e in ctl.events)


async def test_the_controller_retries_a_replan_that_failed_around_the_old_demand(
    tmp_path: Path,
) -> None:
    """The first re-plan fails (the planner finds nothing); the served plan is still the
    old one, so the next re-plan, a cool-down later, is around the old demand again."""
    from ridgeline.errors import PlanError

    asked: list[float] = []

    def replan(demand: float) -> Plan:
        asked.append(demand)
        if len(asked) == 1:
            raise PlanError(f"no plan for {demand:.1f} req/s")
        return plan({"detect": 2, "classify": 2}, demand=demand)

    cfg = ReconfigConfig(window_s=0.5, band=0.3, cooldown_s=0.5, headroom=0.0)
    async with controlled(tmp_path, replan, cfg, 0.1) as (server, ctl):
        deadline = time.monotonic() + 30
        while len(ctl.events) < 2 and time.monotonic() < deadline:
            sched = from_arrival(parse_arrival("poisson", 100.0), 0.5)
            await measure_step(server.model_url(), sched, StepConfig())
    first, second = ctl.events[:2]
    assert "failed: no plan for" in first.skipped[0] and first.planned_rps == 20.0
    assert first.instances == {"detect": 1, "classify": 1}
    assert "around the planned 20.0 req/s" in second.reason, ctl.events
    assert second.planned_rps == asked[1] and second.instances["detect"] == 2
    assert first.applied == ()
    assert second.applied == ("detect: 1 -> 2 instances", "classify: 1 -> 2 instances")


def test_an_event_says_what_changed_or_that_nothing_did() -> None:
    from ridgeline.serve.controller import ReconfigEvent
    from ridgeline.serve.reconfig import describe, diff

    old = plan({"detect": 1, "classify": 1})
    new = plan({"detect": 2, "classify": 1})
    (change,) = diff(old, new)
    said = describe(change, old.tasks["detect"], new.tasks["detect"])
    assert said == "detect: 1 -> 2 instances"
    moved = ReconfigEvent(3.0, 40.0, 44.0, "demand rose", {"detect": 2, "classify": 1}, (), (said,))
    same = ReconfigEvent(9.0, 41.0, 45.0, "demand rose", {"detect": 2, "classify": 1})
    assert (
        moved.line()
        == "t=3s demand rose: detect: 1 -> 2 instances (instances detect 2, classify 1)"
    )
    assert same.line() == (
        "t=9s demand rose: the served tasks unchanged (instances detect 2, classify 1)"
    )


@pytest.mark.slow
async def test_verify_passes_a_plan_within_its_demand_and_fails_one_beyond(
    tmp_path: Path,
) -> None:
    from ridgeline.loop.verify import verify

    # each task may spend half the 400 ms SLO, as a planner splits it: with 100 ms a task,
    # one ~200 ms stall of a loaded CI host dropped 2 of 125 requests (1.6 %, over the 1 %)
    served = plan({"detect": 1, "classify": 1}, demand=40.0, budget_ms=200)
    async with PlanServer(served, tmp_path, http_port=0, grpc_port=None) as server:
        # the margin needs the search's brackets at 40 and 80 req/s to hold, not a long
        # step at each: 1 s steps (the probe's warm-up before them is its own 10 s); 5 s
        # at the demand (~200 requests) so that one late request is not the 1 % alone
        # sent from a process of its own: the server runs in this event loop
        ok = await verify(
            served, server.model_url(), seconds=5.0, warmup_s=1.0, step_s=1.0, apart=True
        )
        too_much = served.model_copy(update={"demand_rps": 2000.0, "slo_ms": 20.0})
        # 2,000 requests at six times what the pipeline serves: missed in any second
        bad = await verify(too_much, server.model_url(), seconds=1.0, warmup_s=0.0, search=False)
    assert ok.passed and ok.fail_rate <= 0.01 and ok.p99_ms is not None and ok.p99_ms <= 400
    assert ok.capacity_rps is not None and ok.margin is not None and ok.margin > 0
    assert ok.summary().startswith("PASS: 40 req/s")
    assert not bad.passed and bad.capacity_rps is None
    assert bad.summary().startswith("FAIL: 2000 req/s")


@pytest.mark.slow
async def test_verify_replays_each_arrival_process_the_plan_was_checked_under(
    tmp_path: Path,
) -> None:
    """A plan sized for bursts (``ridgeline plan --check-arrivals``) records them, and
    verify replays each at the demand: one step per process, the counts summed, the
    summary naming them. A process that names no trace is refused before any load."""
    from ridgeline.errors import RidgelineError
    from ridgeline.loop.verify import verify

    checked = plan({"detect": 1, "classify": 1}, demand=40.0, budget_ms=200).model_copy(
        update={"checked_arrivals": ("poisson", "gamma:cv=3")}
    )
    async with PlanServer(checked, tmp_path, http_port=0, grpc_port=None) as server:
        got = await verify(checked, server.model_url(), seconds=2.0, warmup_s=0.0, search=False)
        broken = checked.model_copy(update={"checked_arrivals": ("trace:no-such-trace",)})
        with pytest.raises(RidgelineError, match="no-such-trace"):
            await verify(broken, server.model_url(), seconds=2.0, warmup_s=0.0, search=False)
    assert got.arrivals == ("poisson", "gamma:cv=3")
    assert 100 <= got.sent <= 220  # two steps of 2 s at 40 req/s (80 each, drawn)
    assert "40 req/s under poisson, gamma:cv=3" in got.summary()
