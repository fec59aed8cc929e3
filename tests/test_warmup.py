"""Warmup: MSER-5 truncation on constructed series, and the online warmup detector (its
trend rule and ramp in detail: tests/test_warmup_trend.py)."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from ridgeline.health import WarmupConfig, WarmupState, mser5, steady_start, warmup_step
from ridgeline.health.warmup import warmup_expired


def transient_then_noise(seed: int, n: int = 200) -> list[float]:
    """A server getting faster: 50 ms of extra latency decaying (time constant 6
    windows) onto a steady 10 ms ± 0.5 ms; the transient falls below the noise by ~28."""
    r = random.Random(seed)
    return [10 + 50 * math.exp(-i / 6) + r.gauss(0, 0.5) for i in range(n)]


def test_mser5_truncates_near_the_end_of_a_transient() -> None:
    for seed in range(3):
        d = mser5(transient_then_noise(seed))
        assert d % 5 == 0
        assert 20 <= d <= 50, (seed, d)


def test_mser5_keeps_a_flat_series_whole() -> None:
    assert mser5([10.0] * 100) == 0
    assert mser5([10.0, 11.0] * 50) == 0
    r = random.Random(7)
    assert mser5([10 + r.gauss(0, 0.5) for _ in range(200)]) == 0


def test_a_series_that_never_settles_loses_at_most_half() -> None:
    rising = [float(i * i) for i in range(100)]
    assert mser5(rising) <= 50
    assert steady_start(rising) <= 50


@given(st.lists(st.floats(min_value=0.0, max_value=1e6), max_size=300))
def test_never_more_than_half(values: list[float]) -> None:
    d = mser5(values)
    assert d % 5 == 0 and d <= len(values) / 2
    assert 0 <= steady_start(values) <= len(values) // 2


def test_steady_start_uses_mser5_on_long_series() -> None:
    v = transient_then_noise(0, 60)
    assert steady_start(v) == mser5(v)


def test_steady_start_on_a_short_series_waits_for_the_settled_level() -> None:
    # second half settles at 10; the first value within 10 % of it is index 3
    assert steady_start([50.0, 30.0, 12.0, 10.0, 11.0, 10.0]) == 3
    assert steady_start([10.0, 10.5, 9.8, 10.1]) == 0
    assert steady_start([]) == 0 and steady_start([5.0]) == 0


CFG = WarmupConfig(trend_windows=5, cv_threshold=0.1, max_drop=0.1)


def feed(values: list[float], cfg: WarmupConfig = CFG) -> list[bool]:
    state, out = WarmupState(), []
    for v in values:
        steady, state = warmup_step(state, v, cfg)
        out.append(steady)
    return out


def test_steady_only_after_trend_windows_values_that_do_not_fall() -> None:
    assert feed([10.0] * 6) == [False, False, False, False, True, True]
    # one slow window first is no significant fall (t = -1.73 > -4.45 at 3 df)
    assert feed([30.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]) == [False] * 4 + [True] * 3


def test_not_steady_while_latency_is_still_falling() -> None:
    falling = [12.0, 11.5, 11.0, 10.5, 10.0]  # a straight fall: no noise, certain
    assert feed(falling) == [False] * 5
    # 11.5 … 10, 10: t = -6.9, still falling; 11 … 10, 10, 10: a 1.0 ms fitted fall,
    # at most 10 % of 10.3 with CV < 0.1: negligible (and t = -3.3, not significant)
    assert feed([*falling, 10.0, 10.0, 10.0]) == [False] * 6 + [True, True]


def test_a_window_without_answers_restarts_the_count() -> None:
    assert feed([10.0] * 4 + [0.0] + [10.0] * 5) == [False] * 9 + [True]
    assert feed([10.0] * 4 + [math.nan] + [10.0] * 4) == [False] * 9


def test_warmup_expires_after_max_s() -> None:
    cfg = WarmupConfig(window_s=2.0, max_s=6.0)
    state = WarmupState()
    expired = []
    for v in (50.0, 40.0, 30.0):
        _, state = warmup_step(state, v, cfg)
        expired.append(warmup_expired(state, cfg))
    assert expired == [False, False, True]
    assert (state.windows, state.elapsed_s) == (3, 6.0)
