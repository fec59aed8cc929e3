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
    Holdout,
    Slack,
    TaskTiming,
    Trail,
    arrival_gap,
    expected_remaining_s,
    learn,
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


def test_each_place_a_request_is_judged_scales_its_expectation_by_what_answers_showed_there() -> (
    None
):
    """A task's checks (as a request joins its queue, as its batch forms) expect afresh
    from the queues as they are then, and scale that by the ``Slack`` learnt at that
    same place: here answers took half as long as expected from joining and 1.5 times as
    long from their batch forming. A request the raw model expects 10 ms late is let in,
    then dropped as its batch forms; one whose deadline the batch's 1.5 times still makes
    goes. Each check joins the request's trail, which teaches each place once the
    request is answered."""
    cfg = BatchingConfig(max_batch_size=4, max_queue_delay_s=0.0)
    queue: BatchQueue[str] = BatchQueue(cfg, 1, drop=True, exec_model=ExecModel(0.050))
    for _ in range(20):
        queue.joining.observe(0.025, 0.050)
        queue.forming.observe(0.075, 0.050)
    trail: Trail = []
    tight = Entry("tight", 1, 0.0, 0.040, trail=trail)  # raw, every check expects 50 ms
    assert queue.refuses(tight, 0.0, lambda: 0.050) is None  # 25 ms of 40
    queue.push(tight)
    formed = queue.form(0.0)
    assert isinstance(formed, Formed)
    assert [(e.payload, why) for e, why in formed.dropped] == [("tight", DropReason.LATE)]
    assert trail == [(queue.joining, 0.0, 0.050), (queue.forming, 0.0, 0.050)]
    roomy = Entry("roomy", 1, 0.010, 0.090)
    assert queue.refuses(roomy, 0.010, lambda: 0.050) is None
    queue.push(roomy)
    queue.release(0, 0.010)
    formed = queue.form(0.010)
    assert isinstance(formed, Formed) and [e.payload for e in formed.batch] == ["roomy"]
    # answers at 100 ms: each place learns from when it judged and what it expected
    joined, formed_at = Slack(), Slack()
    for _ in range(20):
        learn([(joined, 0.0, 0.050), (formed_at, 0.050, 0.010)], 0.100)
    assert (joined.factor_for(0.050), formed_at.factor_for(0.010)) == (2.0, 5.0)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 1 / 3, 0.9]),
    st.integers(0, 500),
    st.integers(0, 2**32 - 1),
)
def test_a_holdout_keeps_its_share_of_each_block_of_neighbours(
    share: float, n: int, seed: int
) -> None:
    """Of each block of requests in arrival order (the share's denominator), exactly its
    numerator are kept from dropping, so that over any run the arms differ by less than
    a block from the share asked for."""
    holdout = Holdout(share, seed)
    draws = [holdout.keeps() for _ in range(n)]
    b = holdout.block
    assert holdout.kept / b == pytest.approx(share, abs=0.005)
    for i in range(0, n - n % b, b):
        assert sum(draws[i : i + b]) == holdout.kept
    assert abs(sum(draws) - n * holdout.kept / b) < b


def test_a_holdout_of_half_keeps_one_of_each_pair_and_refuses_a_share_past_one() -> None:
    holdout = Holdout(0.5, seed=7)
    pairs = [(holdout.keeps(), holdout.keeps()) for _ in range(50)]
    assert all(a != b for a, b in pairs) and {a for a, _ in pairs} == {True, False}
    with pytest.raises(ValueError, match="holdout share 1"):
        Holdout(1.0)
