"""Warmup: the online warmup detector (its
trend rule and ramp in detail: tests/test_warmup_trend.py)."""

from __future__ import annotations

import math

from ridgeline.health import WarmupConfig, WarmupState, warmup_step
from ridgeline.health.warmup import warmup_expired

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
