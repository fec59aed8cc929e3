"""The metric table and the one judge (``health.metrics``, ``health.judge``)."""

from __future__ import annotations

import numpy as np
import pytest

from ridgeline.health.hysteresis import HysteresisConfig
from ridgeline.health.judge import judge
from ridgeline.health.metrics import DEFAULT, METRICS
from ridgeline.health.slo import PERCENTILES, LatencyBound, SLOPolicy, format_slo, parse_slo
from ridgeline.health.state import HealthState
from ridgeline.loadgen.step import StepResult
from ridgeline.probe.assess import assess_step
from ridgeline.probe.config import ProbeConfig
from ridgeline.search.base import StepPlan
from ridgeline.telemetry.histogram import STATISTICS, latency_summary_ms
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.summary import good, summarize
from ridgeline.telemetry.windows import windows


def _records(latency_ms: list[float], outcomes: list[Outcome] | None = None) -> Records:
    n = len(latency_ms)
    rec = Records.empty(np.arange(n) / 10.0)
    rec.sent[:] = rec.scheduled
    rec.done[:] = rec.scheduled + np.asarray(latency_ms) / 1000.0
    rec.outcome[:] = [int(o) for o in (outcomes or [Outcome.OK] * n)]
    return rec


def test_one_key_set() -> None:
    assert PERCENTILES == STATISTICS
    assert set(latency_summary_ms(np.array([0.01]))) == set(STATISTICS)


def test_every_metric_is_named_by_the_slo_text() -> None:
    for name in METRICS:
        policy = parse_slo(f"{name}_p99<50ms,errors<1%")
        assert policy.latency[0].metric == name
        assert parse_slo(format_slo(policy)) == policy


def test_judge_reads_the_statistic_and_the_error_rate() -> None:
    lat = [10.0] * 98 + [30.0, 40.0]
    rec = _records(lat, [Outcome.OK] * 99 + [Outcome.ERROR])
    j = judge(rec, parse_slo("p99<35ms,errors<2%"))
    # the error is beyond every bound, whatever time it came at (40 ms here)
    beyond = np.where(rec.outcome == int(Outcome.OK), rec.latency_from_schedule, np.inf)
    assert j.statistics[DEFAULT] == latency_summary_ms(beyond)
    assert j.statistics[DEFAULT]["max"] == j.statistics[DEFAULT]["mean"] == np.inf
    assert j.answered == 100 and j.error_rate == pytest.approx(0.01)
    assert j.value(j.policy.latency[0]) == j.statistics[DEFAULT]["p99"]
    assert j.latency_held and j.passed  # p99 30 ms (nearest rank: the 99th of 100)
    assert not judge(rec, parse_slo("p99<20ms,errors<2%")).latency_held
    assert not judge(rec, parse_slo("p99<35ms,errors<0.5%")).passed
    # good: succeeded and within every bound on its own latency
    assert j.good.tolist() == [True] * 98 + [True, False]
    assert int(judge(rec, parse_slo("p99<20ms")).good.sum()) == 98


def test_judge_only_over_the_judged_requests() -> None:
    rec = _records([10.0, 10.0, 500.0, 500.0])
    first = np.array([True, True, False, False])
    j = judge(rec, parse_slo("p99<50ms"), first)
    assert j.answered == 2 and j.latency_held
    assert j.good.tolist() == [True, True, False, False]


def test_no_samples_is_no_pass() -> None:
    rec = _records([10.0], [Outcome.NOT_SENT])
    j = judge(rec, parse_slo("p99<50ms"))
    assert j.answered == 0 and j.statistics[DEFAULT]["p99"] is None and not j.latency_held


def test_goodput_and_the_judge_read_the_same_rule() -> None:
    rec = _records([10.0, 60.0, 20.0], [Outcome.OK, Outcome.OK, Outcome.TIMEOUT])
    bound = LatencyBound(percentile="p99", bound_ms=50.0)
    assert good(rec, [bound]).tolist() == [True, False, False]
    assert judge(rec, SLOPolicy(latency=(bound,))).good.tolist() == [True, False, False]


def test_a_config_holds_the_parsed_slo_and_writes_its_text() -> None:
    cfg = ProbeConfig(slo="p99<50ms,ttft_p99<1s,errors<0.1%")
    assert isinstance(cfg.slo, SLOPolicy) and cfg.policy() is cfg.slo
    text = cfg.model_dump()["slo"]
    assert text == "p99<50ms,ttft_p99<1s,errors<0.1%,attainment>95%"
    assert ProbeConfig.model_validate_json(cfg.model_dump_json()).slo == cfg.slo
    assert ProbeConfig(slo=cfg.slo).slo == cfg.slo


def test_an_unknown_metric_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown metric 'queue'"):
        LatencyBound(percentile="p99", bound_ms=1.0, metric="queue")


def test_send_bounds_the_latency_from_the_actual_send() -> None:
    """``send_p99<b``: the server's own time. Requests sent 100 ms late and answered
    10 ms after their send are 110 ms late from the schedule, 10 ms from the send."""
    rec = _records([110.0] * 100)
    rec.sent[:] = rec.scheduled + 0.1
    policy = parse_slo("send_p99<50ms,errors<1%")
    assert policy.latency[0].metric == "send" and format_slo(policy).startswith("send_p99<50ms")
    j = judge(rec, policy)
    assert j.value(policy.latency[0]) == pytest.approx(10.0, rel=1e-3)
    assert j.passed and j.good.all()
    assert not judge(rec, parse_slo("p99<50ms")).passed
    assert good(rec, policy.latency).all() and not good(rec, parse_slo("p99<50ms").latency).any()
    unanswered = _records([110.0, 10.0], [Outcome.INCOMPLETE, Outcome.OK])
    unanswered.done[0] = np.nan  # never answered: beyond every bound
    assert judge(unanswered, policy).good.tolist() == [False, True]


def test_the_probe_judges_a_step_on_a_send_bound() -> None:
    """A step whose requests the generator sent 100 ms late (answered 10 ms after their
    send) holds ``send_p99<50ms``, and misses ``p99<50ms``: the table entry alone carries
    the new metric through the step's verdict and its tail count."""
    rec = _records([110.0] * 400)
    rec.sent[:] = rec.scheduled + 0.1
    result = StepResult(
        summarize(rec, 40.0, valid=True, invalid_reason=None), windows(rec, 40.0), rec, False
    )

    def verdict(slo: str) -> tuple[HealthState, str, int]:
        v = assess_step(
            result,
            StepPlan(10.0, 40.0, "probe"),
            parse_slo(slo),
            HysteresisConfig(),
            step_index=0,
            t0_s=0.0,
        ).verdict
        return v.state, v.judged, v.beyond

    assert verdict("send_p99<50ms,errors<1%")[1:] == ("send_p99", 0)
    assert verdict("send_p99<50ms,errors<1%")[0].sustainable
    assert verdict("p99<50ms,errors<1%")[1:] == ("p99", 400)
    assert not verdict("p99<50ms,errors<1%")[0].sustainable
