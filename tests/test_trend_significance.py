"""The latency trend reads Overloaded only on a significant rise (issue 31).

The slope of the windows' p50 is tested one-sided at 0.99 (its t statistic against
Student's t with n − 2 degrees of freedom): the scatter of a few noisy windows — four
requests a window at 4 req/s — is no rising trend.
"""

from __future__ import annotations

import numpy as np
import pytest

from ridgeline.health.engine import assess
from ridgeline.health.slo import parse_slo
from ridgeline.health.state import HealthState, Observation

pytestmark = pytest.mark.timeout(60)

POLICY = parse_slo("p99<100ms,errors<1%")
"""Trend of the p50 over 5 windows; Overloaded past 5 % of 100 ms = 5 ms a window."""


def _obs(p50: float) -> Observation:
    return Observation(
        start_s=0.0,
        end_s=1.0,
        offered_rps=100.0,
        achieved_rps=100.0,
        error_rate=0.0,
        latency_ms={"p50": p50, "p99": 60.0},
        answered=100,
    )


def _trend(p50s: list[float], windows: int = 5) -> tuple[float, HealthState]:
    policy = POLICY.model_copy(update={"trend_windows": windows})
    seen = [_obs(v) for v in p50s]
    a = assess(seen[-1], policy, seen[:-1])
    return a.metric_scores["trend"], a.state


def test_noisy_windows_are_no_trend() -> None:
    """A least-squares slope of +6.5 ms a window (over the 5 ms limit: Overloaded without
    the test), which the windows' scatter explains: t = 0.59, far below 4.541."""
    p50s = [30.0, 15.0, 50.0, 20.0, 60.0]
    assert np.polyfit(np.arange(5), p50s, 1)[0] == pytest.approx(6.5)
    assert _trend(p50s) == (0.0, HealthState.HEALTHY)


def test_pure_noise_around_a_flat_level_gives_no_trend() -> None:
    """Seeded noise around 30 ms: many of the fitted slopes exceed the 5 ms limit (the
    old reading would call them Overloaded), none is significant."""
    rng = np.random.default_rng(31)
    draws = [rng.normal(30.0, 10.0, 5).round(1).tolist() for _ in range(20)]
    steep = [d for d in draws if np.polyfit(np.arange(5), d, 1)[0] > 5.0]
    assert len(steep) == 2
    assert [_trend(d)[0] for d in draws] == [0.0] * 20


def test_noise_reads_as_a_trend_at_the_tests_level_only() -> None:
    """Over 2,000 seeded noise sequences, 133 fitted slopes pass the 5 ms limit (6.7 %,
    each one an Overloaded step before); 24 rises are significant (1.2 %: the one-sided
    0.99 level, give or take the count's ±0.45 % spread)."""
    rng = np.random.default_rng(31)
    draws = [rng.normal(30.0, 10.0, 5).round(1).tolist() for _ in range(2000)]
    assert sum(np.polyfit(np.arange(5), d, 1)[0] > 5.0 for d in draws) == 133
    assert sum(_trend(d)[0] > 0.0 for d in draws) == 24


def test_noise_over_many_windows_gives_no_trend() -> None:
    """Forty windows (38 degrees of freedom: the normal expansion of t's quantile)."""
    rng = np.random.default_rng(8)
    for _ in range(10):
        assert _trend(rng.normal(30.0, 10.0, 40).round(1).tolist(), windows=40)[0] == 0.0


def test_a_steady_rise_scores_as_before() -> None:
    """Exactly 10 ms a window: the score is the slope over the limit, 10 / 5."""
    score, state = _trend([10.0, 20.0, 30.0, 40.0, 50.0])
    assert (score, state) == (2.0, HealthState.OVERLOADED)


def test_a_clear_rise_with_some_scatter_scores_its_slope() -> None:
    """Slope 10 ms a window, residuals under ±1.2 ms: t ≈ 33, significant."""
    score, state = _trend([10.0, 21.0, 29.0, 41.0, 50.0])
    assert score == pytest.approx(2.0)
    assert state is HealthState.OVERLOADED


def test_a_slow_steady_rise_over_many_windows_is_significant() -> None:
    """1 ms a window over 40 windows with ±3 ms of alternating scatter: t ≈ 12."""
    p50s = [30.0 + k + (3.0 if k % 2 else -3.0) for k in range(40)]
    score, _ = _trend(p50s, windows=40)
    assert score == pytest.approx(np.polyfit(np.arange(40), p50s, 1)[0] / 5.0)
    assert score > 0.0
