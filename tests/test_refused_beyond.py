"""A request not answered OK is beyond every latency bound (issue 31).

A full queue that answers 503 at once, a timeout, an error, an answer cut short: each
counts beyond every bound in the judge's percentiles and in the probe's tail count,
whatever time it took to fail, as the independent truth (``study.truth``) counts it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ridgeline.health.hysteresis import HysteresisConfig
from ridgeline.health.judge import judge
from ridgeline.health.metrics import METRICS
from ridgeline.health.slo import parse_slo
from ridgeline.loadgen.step import StepResult
from ridgeline.probe.assess import assess_step, tail_count
from ridgeline.search.base import StepPlan
from ridgeline.study.truth import broken_records
from ridgeline.telemetry.records import Outcome, Records, gaps_from
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows

pytestmark = pytest.mark.timeout(60)

N = 1000
DURATION_S = 50.0
SLO = "p99<50ms,errors<5%"


def _step(refused: int, outcome: Outcome = Outcome.DROPPED) -> Records:
    """``N`` requests 50 ms apart, answered OK in 10 ms, but every ``N // refused``-th
    one met with ``outcome`` 0.2 ms after its send (an incomplete one never answered)."""
    rec = Records.empty(np.arange(N) * (DURATION_S / N))
    rec.sent[:] = rec.scheduled
    rec.done[:] = rec.scheduled + 0.010
    rec.outcome[:] = int(Outcome.OK)
    bad = np.arange(refused) * (N // refused) if refused else np.arange(0)
    rec.outcome[bad] = int(outcome)
    rec.done[bad] = np.nan if outcome is Outcome.INCOMPLETE else rec.scheduled[bad] + 0.0002
    return rec


def _result(rec: Records) -> StepResult:
    summary = summarize(rec, DURATION_S, valid=True, invalid_reason=None)
    return StepResult(summary, windows(rec, DURATION_S), rec, False)


@pytest.mark.parametrize(
    "outcome", [Outcome.DROPPED, Outcome.ERROR, Outcome.TIMEOUT, Outcome.INCOMPLETE]
)
def test_two_percent_not_answered_ok_fails_p99_in_the_judge(outcome: Outcome) -> None:
    policy = parse_slo(SLO)
    j = judge(_step(20, outcome), policy)
    assert j.answered == N
    assert j.statistics["e2e"]["p99"] == math.inf  # rank 990 of 1000 falls among the 20
    assert j.statistics["e2e"]["p95"] == pytest.approx(10.0, abs=0.01)
    assert j.statistics["e2e"]["max"] == j.statistics["e2e"]["mean"] == math.inf
    assert not j.latency_held and not j.passed
    assert broken_records(_step(20, outcome), policy) == "p99"  # the truth agrees


def test_half_a_percent_refused_leaves_p99_within() -> None:
    policy = parse_slo(SLO)
    j = judge(_step(5), policy)
    assert j.statistics["e2e"]["p99"] == pytest.approx(10.0, abs=0.01)
    assert j.latency_held and j.passed
    assert broken_records(_step(5), policy) is None


def test_the_summary_shows_the_answered_latency_and_the_drops_apart() -> None:
    """What ``ridgeline run`` shows is what was measured: a refusal's 0.2 ms is in the
    step summary's percentiles, its count in ``drop_rate``; the SLO judges it beyond."""
    s = summarize(_step(20), DURATION_S, valid=True, invalid_reason=None)
    assert s.dropped == 20 and s.drop_rate == pytest.approx(0.02)
    assert s.latency_ms.p99 == pytest.approx(10.0, abs=0.01)


def test_the_probe_counts_refusals_beyond_the_bound() -> None:
    result = _result(_step(20))
    policy = parse_slo(SLO)
    tail = tail_count(result, policy, 0.95)
    assert (tail.samples, tail.beyond, tail.allowed) == (N, 20, pytest.approx(10.0))
    assert tail.interval_ms is not None and tail.interval_ms[1] == math.inf
    verdict = assess_step(
        result,
        StepPlan(20.0, DURATION_S, "probe"),
        policy,
        HysteresisConfig(),
        step_index=0,
        t0_s=0.0,
    ).verdict
    assert not verdict.state.sustainable
    assert (verdict.judged, verdict.beyond, verdict.p99_ms) == ("p99", 20, math.inf)
    assert verdict.score == math.inf


def test_token_metrics_count_a_refusal_beyond_too() -> None:
    """Two streamed answers and a refusal: TTFT has the refusal as +inf (it has no first
    token); ITL keeps every gap that came and adds one +inf for the refusal."""
    rec = Records.empty(np.array([0.0, 1.0, 2.0]))
    rec.sent[:] = rec.scheduled
    rec.done[:] = rec.scheduled + np.array([0.05, 0.0002, 0.05])
    rec.first_token[:] = rec.scheduled + np.array([0.02, np.nan, 0.03])
    rec.output_tokens[:] = [3, 0, 2]
    rec.outcome[:] = [int(Outcome.OK), int(Outcome.DROPPED), int(Outcome.OK)]
    rec.gaps, rec.gap_start = gaps_from([[0.01, 0.02], [], [0.02]])
    every = np.ones(3, dtype=np.bool_)
    ttft = METRICS["ttft"].samples(rec, every)
    assert ttft.values.tolist() == pytest.approx([0.02, math.inf, 0.03])
    itl = METRICS["itl"].samples(rec, every)
    assert itl.values.tolist() == [0.01, 0.02, 0.02, math.inf]
    assert itl.when.tolist() == [0.0, 0.0, 2.0, 1.0]
    assert itl.owner is not None and itl.owner.tolist() == [0, 0, 2, 1]
    tpot = METRICS["tpot"].samples(rec, every)
    assert tpot.values.tolist() == pytest.approx([0.015, math.inf, 0.02])
    j = judge(rec, parse_slo("ttft_p50<100ms"))
    assert j.statistics["ttft"]["p50"] == pytest.approx(30.0, abs=0.05)
    assert j.statistics["ttft"]["max"] == math.inf
