"""Pure rules over constructed records: validity, summary, windows, histograms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.loadgen.validity import ValidityConfig, assess_validity
from ridgeline.telemetry.histogram import decode, encode, histogram_of, merge
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows


def records(scheduled, sent, done, outcome) -> Records:  # type: ignore[no-untyped-def]
    rec = Records.empty(np.asarray(scheduled, dtype=np.float64))
    rec.sent[:] = sent
    rec.done[:] = done
    rec.outcome[:] = outcome
    return rec


def test_a_step_whose_p99_lateness_exceeds_the_bound_is_invalid() -> None:
    sched = np.arange(100) / 100.0
    late = np.zeros(100)
    late[-2:] = 0.005  # 2 % of sends 5 ms late: p99 above 1 ms
    rec = records(sched, sched + late, sched + late + 0.01, [0] * 100)
    valid, reason = assess_validity(rec, ValidityConfig())
    assert not valid
    assert reason is not None and "p99 lateness" in reason
    valid, reason = assess_validity(rec, ValidityConfig(lateness_p99_bound_s=0.01))
    assert (valid, reason) == (True, None)


def test_unsent_requests_make_a_step_invalid() -> None:
    sched = np.arange(10) / 10.0
    sent = np.where(np.arange(10) < 8, sched, np.nan)
    outcome = [0] * 8 + [int(Outcome.NOT_SENT)] * 2
    valid, reason = assess_validity(records(sched, sent, sent + 0.001, outcome), ValidityConfig())
    assert not valid
    assert reason == "2 of 10 scheduled requests were never sent"


def test_summary_counts_errors_and_timeouts_in_latency_and_error_rate() -> None:
    sched = np.arange(10) / 10.0
    outcome = [
        0,
        0,
        0,
        0,
        0,
        0,
        int(Outcome.ERROR),
        int(Outcome.TIMEOUT),
        int(Outcome.DROPPED),
        int(Outcome.NOT_SENT),
    ]
    sent = np.where(np.arange(10) < 9, sched, np.nan)
    lat = np.array([0.010] * 6 + [0.002, 1.0, 0.001, np.nan])
    s = summarize(records(sched, sent, sent + lat, outcome), 1.0, valid=True, invalid_reason=None)
    assert (s.scheduled, s.sent, s.ok, s.errors, s.timeouts, s.dropped, s.not_sent) == (
        10,
        9,
        6,
        1,
        1,
        1,
        1,
    )
    assert s.error_rate == 2 / 9
    assert s.drop_rate == 1 / 9
    assert s.offered_rps == 10.0
    assert s.achieved_rps == 6.0
    # HdrHistogram keeps 3 significant figures: values are exact to 1 part in 1000
    assert s.latency_ms.max == pytest.approx(1000.0, rel=1e-3)  # the timeout counts
    assert s.latency_ms.p50 == pytest.approx(10.0, rel=1e-3)


def test_windows_attribute_latency_by_schedule_and_throughput_by_completion() -> None:
    sched = np.array([0.1, 0.2, 0.3, 1.1, 1.2])
    done = np.array([0.15, 0.25, 1.5, 1.15, 1.3])
    w = windows(records(sched, sched, done, [0, 0, 0, 0, int(Outcome.ERROR)]), 2.0, 1.0)
    assert [x.offered for x in w] == [3, 2]
    assert [x.ok for x in w] == [3, 1]
    assert [x.failed for x in w] == [0, 1]
    assert [x.completed_ok for x in w] == [2, 2]
    assert w[0].latency_ms.max == pytest.approx(1200.0, rel=1e-3)
    assert w[1].error_rate == 0.5


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-6, 100.0), min_size=1, max_size=300), st.integers(1, 5))
def test_shard_histograms_merge_exactly(values: list[float], shards: int) -> None:
    arr = np.asarray(values)
    whole = histogram_of(arr)
    parts = [decode(encode(histogram_of(arr[k::shards]))) for k in range(shards)]
    merged = merge(parts)
    assert merged.get_total_count() == whole.get_total_count() == len(values)
    for p in (50, 90, 99, 99.9, 100):
        assert merged.get_value_at_percentile(p) == whole.get_value_at_percentile(p)
