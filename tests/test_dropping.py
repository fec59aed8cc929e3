"""The early-drop policy's slack: the sorted window reads the same quantile as
``np.quantile`` over the window in arrival order, to the bit."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.policies.dropping import Slack, quantile_sorted

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
    slack = Slack(initial_s=0.01, quantile=q, window=window, min_answers=min_answers)
    kept: deque[float] = deque(maxlen=window)
    for latency, expected in answers:
        slack.observe(latency, expected)
        kept.append(latency - expected)
        want = float(np.quantile(kept, q)) if len(kept) >= min_answers else 0.01
        assert slack.slack_s == want


@given(st.lists(_errors, min_size=1, max_size=60), st.floats(0.0, 1.0))
def test_quantile_sorted_is_np_quantile(values: list[float], q: float) -> None:
    assert quantile_sorted(sorted(values), q) == float(np.quantile(values, q))
