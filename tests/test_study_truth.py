"""The truth's runs meet a server at a random point of its periodic behaviour (issue 31):
each seed's run starts at its own server time within a stall period and its neighbour at
its own phase, and each run lasts whole periods; a server with neither is judged exactly
as before."""

from __future__ import annotations

import numpy as np
import pytest

from ridgeline.report.vanguard import _rate
from ridgeline.sim import SimPreset, SimState
from ridgeline.study.bank import load_bank
from ridgeline.study.truth import Recorded, TruthConfig, phased, runs_at, true_capacity
from ridgeline.telemetry.records import Records
from ridgeline.workload.traces import Trace

EVERY_10_MS = Recorded(Trace.from_times(np.arange(1000.0)))
"""Constant gaps: at 100 req/s a request every 10 ms, the first at 0 (exact times)."""


def _server(model: dict[str, object] | None = None, **extra: object) -> SimPreset:
    """1 ms a request, one instance, no noise: nothing but a stall or the neighbour holds
    a request past 1 ms when they arrive 10 ms apart."""
    plain = {"base_ms": 1.0, "per_item_ms": 0.0, "instances": 1}
    return SimPreset.model_validate(
        {
            "description": "test server",
            "model": {**plain, **(model or {})},
            "slo": "p99<1s",
            **extra,
        }
    )


def _phase(server: SimPreset, seed: int) -> float:
    neighbour = phased(server, seed)[0].interference
    assert neighbour is not None
    return neighbour.phase_s


STALLED = _server(model={"periodic_stall": {"every_s": 12.0, "duration_ms": 150.0}})


def _stalls_seen(rec: Records) -> int:
    """Stalls that held a request: the arrivals held past 5 ms, in clusters (a stall
    holds 150 ms of arrivals; stalls are 12 s apart)."""
    held = rec.scheduled[rec.done - rec.scheduled > 0.005]
    return 0 if held.size == 0 else 1 + int(np.count_nonzero(np.diff(held) > 1.0))


@pytest.mark.timeout(60)
def test_each_truth_run_starts_at_its_own_stall_phase_and_sees_every_stall_of_its_span() -> None:
    # 100 req/s for 120 s: 12,000 requests a run, arrivals over [0, 119.99] s, 10 whole
    # 12 s periods. From server time 0 every run would meet the stalls at 12, 24, …, 108 s
    # (stalls fall at every_s, 2·every_s, … of server time): 9, never 10. From a start s
    # in (0, 12) they fall at 12 − s, 24 − s, …, 120 − s of the run: 10 in every run (the
    # last held when s > 0.009 s; the seeds' starts below are 1.3 s and more).
    cfg = TruthConfig(requests=1_000, seeds=8, run_s=120.0)
    starts = [phased(STALLED, seed)[1].server_time_s for seed in range(8)]
    assert all(1.0 < s < 12.0 for s in starts)
    assert min(starts) < 2.0 and max(starts) > 11.0  # spread over the period
    runs = runs_at(STALLED, 100.0, traffic=EVERY_10_MS, cfg=cfg)
    assert [len(r) for r in runs] == [12_000] * 8
    assert [_stalls_seen(r) for r in runs] == [10] * 8  # on average 10, as the span holds


@pytest.mark.timeout(60)
def test_each_truth_run_meets_the_neighbour_at_its_own_phase() -> None:
    # a neighbour busy half of every 20 s (service doubled to 2 ms): from phase 0 every
    # run would start in a busy window and see the next open at 20 s. Each seed's phase
    # is its own; a run of 6 whole periods is busy for half its requests, whatever it is.
    neighbour = {"amount": 1.0, "period_s": 20.0, "duty": 0.5}
    server = _server(interference=neighbour)
    cfg = TruthConfig(requests=1_000, seeds=8, run_s=120.0)
    phases = [_phase(server, seed) for seed in range(8)]
    assert all(0.0 <= p < 20.0 for p in phases) and len({round(p) for p in phases}) >= 6
    assert [phased(server, seed)[1] for seed in range(8)] == [SimState()] * 8  # no stalls
    opens = []
    for rec in runs_at(server, 100.0, traffic=EVERY_10_MS, cfg=cfg):
        busy = rec.done - rec.scheduled > 0.0015
        assert len(rec) == 12_000 and abs(int(busy.sum()) - 6_000) <= 6  # 1 a window edge
        first = int(np.flatnonzero(busy[1:] & ~busy[:-1])[0]) + 1
        opens.append(float(rec.scheduled[first]))
    assert all(0.0 < t <= 20.0 for t in opens)
    assert len({round(t) for t in opens}) >= 6  # not all at 20 s, as from phase 0


@pytest.mark.timeout(60)
def test_each_run_lasts_whole_periods_of_the_longest_behaviour() -> None:
    # a 7 s stall at 100 req/s: run_s 120 s is 17.1 periods, so each run lasts 18 (126 s,
    # 12,600 requests); the short pass's tenth (12 s, 1.7 periods) lasts 2 (1,400). A
    # server without periodic behaviour keeps 120 s and its tenth, 12,000 and 1,200.
    cfg = TruthConfig(requests=1_000, seeds=4, run_s=120.0)
    every_7 = _server(model={"periodic_stall": {"every_s": 7.0, "duration_ms": 50.0}})
    plain = _server()
    assert [len(r) for r in runs_at(every_7, 100.0, traffic=EVERY_10_MS, cfg=cfg)] == [12_600] * 4
    short = runs_at(every_7, 100.0, traffic=EVERY_10_MS, cfg=cfg, share=0.1)
    assert [len(r) for r in short] == [1_400] * 4
    assert [len(r) for r in runs_at(plain, 100.0, traffic=EVERY_10_MS, cfg=cfg)] == [12_000] * 4
    assert [len(r) for r in runs_at(plain, 100.0, cfg=cfg, share=0.1)] == [1_200] * 4


@pytest.mark.timeout(120)
def test_a_truth_without_periodic_behaviour_is_unchanged() -> None:
    # nlp-errors (no stall, no neighbour) at the default config: the value the truth gave
    # before runs had phases (commit 8237dc1), which the bank's table shows as 411
    case = next(c for c in load_bank() if c.name == "nlp-errors")
    assert phased(case.preset, 3) == (case.preset, SimState())
    t = true_capacity(case.preset)
    assert t.capacity_rps == 410.7887642491943
    assert (_rate(t.capacity_rps), t.broken_by, t.requests_per_rate) == ("411", "errors", 200_000)
