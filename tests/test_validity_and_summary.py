"""Pure rules over constructed records: validity, summary, windows, histograms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.loadgen.validity import ValidityConfig, assess_validity, validity_warning
from ridgeline.telemetry.histogram import (
    decode,
    encode,
    histogram_of,
    latency_summary_ms,
    merge,
    summary_ms,
)
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows


def records(scheduled, sent, done, outcome) -> Records:  # type: ignore[no-untyped-def]
    rec = Records.empty(np.asarray(scheduled, dtype=np.float64))
    rec.sent[:] = sent
    rec.done[:] = done
    rec.outcome[:] = outcome
    return rec


def late_step(late_ms: float) -> Records:
    """1,000 requests answered 20 ms after their send; 2 % of them sent ``late_ms`` late,
    so the generator moves the p99 from the schedule by ``late_ms``."""
    sched = np.arange(1000) / 1000.0
    late = np.zeros(1000)
    late[::50] = late_ms / 1000.0
    return records(sched, sched + late, sched + late + 0.020, [0] * 1000)


@pytest.mark.parametrize(
    ("late_ms", "valid", "warned"),
    [(1.5, True, False), (3.0, True, True), (10.0, False, False)],
)
def test_a_step_is_invalid_when_its_lateness_moves_the_p99_by_5_percent_of_the_slo(
    late_ms: float, valid: bool, warned: bool
) -> None:
    """Against a 100 ms bound: 5 ms of the p99 may be the generator's, and above 2 ms
    the step says it came near."""
    rec, cfg = late_step(late_ms), ValidityConfig(latency_bound_ms=100.0)
    ok, reason = assess_validity(rec, cfg)
    assert ok is valid, reason
    assert (validity_warning(rec, cfg) is not None) is warned
    if not valid:
        assert reason is not None and "generator fell behind" in reason
        assert f"moved the p99 latency by {late_ms:.2f} ms, against 5.00 ms allowed" in reason


def test_without_an_slo_the_step_is_judged_against_its_own_p99_and_a_fixed_bound_wins() -> None:
    rec = late_step(3.0)  # 3 ms on a 20 ms p99: 15 %
    ok, reason = assess_validity(rec, ValidityConfig())
    assert not ok and reason is not None and "the step's own p99 of 20.0 ms" in reason
    # a fixed bound judges the p99 of the lateness itself, by the summary's estimator
    p99 = summarize(rec, 1.0, valid=True, invalid_reason=None).lateness_ms.p99
    assert p99 == pytest.approx(3.0, abs=0.005)
    assert assess_validity(rec, ValidityConfig(lateness_p99_bound_s=0.005)) == (True, None)
    ok, reason = assess_validity(rec, ValidityConfig(lateness_p99_bound_s=0.002))
    assert not ok and reason is not None
    assert f"p99 lateness {p99:.3f} ms against a bound of 2 ms" in reason


def test_requests_that_fail_in_the_generator_make_the_step_invalid() -> None:
    import errno

    from ridgeline.loadgen.replayer import client_failure

    mine = OSError(errno.EMFILE, "Too many open files")
    wrapped = RuntimeError("cannot connect")
    wrapped.__cause__ = mine
    assert client_failure(wrapped) is not None and "ulimit -n" in str(client_failure(wrapped))
    assert client_failure(ConnectionResetError(errno.ECONNRESET, "reset")) is None
    rec = late_step(0.0)
    rec.outcome[:3] = int(Outcome.ERROR)
    rec.client_failures = 3
    rec.errors[str(client_failure(mine))] = 3
    ok, reason = assess_validity(rec, ValidityConfig())
    assert not ok and reason is not None
    assert reason.startswith("3 requests failed in the load generator itself (client: too many")


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


def test_a_step_answered_late_achieved_what_its_answers_took_not_what_it_offered() -> None:
    """5,000 requests scheduled over 1 s, sent up to 55 s late by a generator that fell
    behind (issue 33, fault 23): each answered 10 ms after its send, all ok. Offered
    5,000/s; achieved over the 56.01 s the answers took (89 a second), not 5,000/s. On
    time, the same requests achieved what they offered, less the 10 ms their last answer
    came after the step's end (as GuideLLM times a run: to its last answer)."""
    sched = np.arange(5000) / 5000.0
    sent = sched + np.linspace(0.0, 55.0, 5000)
    ok = np.full(5000, int(Outcome.OK))
    late = summarize(records(sched, sent, sent + 0.01, ok), 1.0, valid=False, invalid_reason="x")
    assert late.offered_rps == 5000.0
    assert late.achieved_rps == pytest.approx(89.27, abs=0.01)
    on_time = summarize(
        records(sched, sched, sched + 0.01, ok), 1.0, valid=True, invalid_reason=None
    )
    assert on_time.achieved_rps == pytest.approx(4951.5, abs=0.1)


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


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(1e-6, 100.0),
            st.floats(0.0, 1e-5),
            st.floats(3000.0, 1e5),
            st.just(float("nan")),
        ),
        max_size=400,
    )
)
def test_the_summary_reads_the_percentiles_hdrh_walks_its_buckets_for(values: list[float]) -> None:
    """The fast summary against hdrh's own walk over a histogram of the same values:
    equal to the microsecond, below 1 µs, beyond the hour and with NaN skipped."""
    arr = np.asarray(values, dtype=np.float64)
    finite = arr[np.isfinite(arr)]
    mean = float(finite.mean()) * 1000.0 if finite.size else None
    assert latency_summary_ms(arr) == summary_ms(histogram_of(arr), mean)


def test_a_window_sent_on_time_has_no_lateness_and_a_late_one_its_p99() -> None:
    sched = np.array([0.1, 0.2, 0.3, 1.1, 1.2, 1.3, 2.5])
    sent = sched + np.array([0.0, 0.0, 0.0, 0.0, 0.004, 0.001, 0.0])
    w = windows(records(sched, sent, sent + 0.01, [0] * 7), 4.0, 1.0)
    assert [x.lateness_p99_ms for x in w] == [
        0.0,
        float(np.percentile((sent - sched)[3:6], 99)) * 1e3,
        0.0,
        None,
    ]
