"""The early-drop policy's slack: the sorted window reads the same quantile of the
latency-to-expected ratios as ``np.quantile`` over the window in arrival order, to the
bit."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.policies.batching import BatchingConfig
from ridgeline.policies.dropping import (
    ExecModel,
    Slack,
    TaskTiming,
    arrival_gap,
    expected_remaining_s,
    quantile_sorted,
    reached,
)
from ridgeline.policies.queue import BatchQueue, DropReason, Entry, Formed

pytestmark = pytest.mark.timeout(60)

_errors = st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_errors, st.sampled_from([0.0, 0.25, 0.5]))),
    st.integers(1, 50),
    st.integers(1, 30),
    st.sampled_from([0.0, 0.3, 0.5, 0.9, 0.995, 1.0]),
)
def test_the_slack_is_np_quantile_of_the_window_to_the_bit(
    answers: list[tuple[float, float]], window: int, min_answers: int, q: float
) -> None:
    slack = Slack(
        quantile=q, window=window, min_answers=min_answers, initial=0.7, by_expectation=False
    )
    kept: deque[float] = deque(maxlen=window)
    for latency, expected in answers:
        slack.observe(latency, expected)
        if expected > 0.0:
            kept.append(latency / expected)
        want = float(np.quantile(kept, q)) if len(kept) >= min_answers else 0.7
        assert slack.factor == want


@given(st.lists(_errors, min_size=1, max_size=60), st.floats(0.0, 1.0))
def test_quantile_sorted_is_np_quantile(values: list[float], q: float) -> None:
    assert quantile_sorted(sorted(values), q) == float(np.quantile(values, q))


def test_a_batch_that_waits_to_go_expects_the_rows_that_arrive_meanwhile() -> None:
    """Batch 8, queue delay 10 ms, one row queued ahead (the request's batch would have
    2): rows every 1 ms fill the other 6 in 6 ms, so it goes full then; rows every 5 ms
    bring 2 more within the delay, and it goes at 10 ms with 4; with no gap seen yet, the
    delay and the rows queued so far."""
    exec_ = ExecModel(base_s=0.010, per_row_s=0.002)
    timing = TaskTiming(exec_, queued_rows=1, batch_size=8, instances=1, max_queue_delay_s=0.010)
    fast = replace(timing, gap_s=0.001)
    slow = replace(timing, gap_s=0.005)
    assert (fast.fill_s, fast.batch_rows) == (pytest.approx(0.006), 8.0)
    assert (slow.fill_s, slow.batch_rows) == (0.010, pytest.approx(4.0))
    assert (timing.fill_s, timing.batch_rows) == (0.010, 2.0)
    # idle instance: the wait is the fill, then the batch it fills
    assert expected_remaining_s("t", {"t": fast}, {"t": []}) == pytest.approx(0.006 + 0.026)


def test_the_arrival_gap_is_a_moving_mean_of_the_gaps_per_row() -> None:
    assert arrival_gap(0.0, None, 5.0, 1) == 0.0  # the first arrival: no gap yet
    assert arrival_gap(0.0, 5.0, 5.004, 2) == pytest.approx(0.002)  # the first gap sets it
    assert arrival_gap(0.002, 5.004, 5.016, 1) == pytest.approx(0.002 + 0.1 * 0.010)


def test_rows_ahead_upstream_reach_a_slower_task_before_the_request() -> None:
    """Four rows wait at a 10 ms task before a 20 ms one (one instance each, batches of
    one). A request joining the first leaves it at 50 ms; the second has served 2.5 of
    the four rows ahead by then, so two wait before it and its instance is busy: half a
    batch, two batches, then its own, 70 ms more, 120 ms in all (run row by row, the
    answer comes at 110 ms). Read as the second task is now, idle and empty: 70 ms."""
    first = TaskTiming(ExecModel(0.010), queued_rows=4, batch_size=1, instances=1,
                       max_queue_delay_s=0.0)  # fmt: skip
    second = TaskTiming(ExecModel(0.020), queued_rows=0, batch_size=1, instances=1,
                        max_queue_delay_s=0.0)  # fmt: skip
    there = reached(second, 4, 0.050)
    assert (there.queued_rows, there.busy) == (2, 1)
    timings, children = {"a": first, "b": second}, {"a": ["b"], "b": []}
    assert expected_remaining_s("a", timings, children) == pytest.approx(0.120)
    assert expected_remaining_s("b", timings, children) == pytest.approx(0.020)
    # a queue that drains before the request gets there is not waited for
    assert reached(replace(second, queued_rows=3, busy=1), 0, 0.100).queued_rows == 0
    assert reached(second, 0, 0.0) is second


def test_a_task_scales_its_fresh_expectation_by_the_factor_the_request_arrived_with() -> None:
    """A task's own checks (on arrival, as the batch forms) expect afresh from the queues
    as they are then, and scale that by the ``Slack`` factor the request was judged by at
    its arrival (``Entry.factor``): where answers showed the model pessimistic (0.5) a
    request the raw model expects 10 ms late still goes; where they showed it optimistic
    (1.5) one the raw model expects on time is dropped."""
    cfg = BatchingConfig(max_batch_size=4, max_queue_delay_s=0.0)
    queue: BatchQueue[str] = BatchQueue(cfg, 1, drop=True, exec_model=ExecModel(0.050))
    deadline = 0.040  # the batch takes 50 ms: raw, every request here is 10 ms late
    as_is, pessimistic = (
        Entry("as is", 1, 0.0, deadline),
        Entry("0.5", 1, 0.0, deadline, factor=0.5),
    )
    for e in (as_is, pessimistic):
        assert queue.refuses(e, 0.0, lambda: 0.050) is (None if e.factor < 1 else DropReason.LATE)
        queue.push(e)
    formed = queue.form(0.0)
    assert isinstance(formed, Formed)
    assert [e.payload for e in formed.batch] == ["0.5"]
    assert [(e.payload, why) for e, why in formed.dropped] == [("as is", DropReason.LATE)]
    optimistic = Entry("1.5", 1, 0.0, 0.070, factor=1.5)  # raw 50 ms of 70: on time
    assert queue.refuses(optimistic, 0.0, lambda: 0.050) is DropReason.LATE
    assert queue.refuses(Entry("1", 1, 0.0, 0.070), 0.0, lambda: 0.050) is None
