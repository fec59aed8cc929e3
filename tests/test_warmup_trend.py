"""The warm-up phase (issue 31): a rate that exercises the server, raised while the
server is well inside its SLO, held, and ended when the p50 at the held rate has stopped
trending, however many requests that takes; its length reported, the cap named when it
ends a warm-up still trending. The trend rule with exact values; the phase in virtual
time against simulated servers that warm by work and that do not warm at all."""

from __future__ import annotations

import asyncio
import math

import pytest

from ridgeline.health.warmup import (
    WarmupConfig,
    WarmupState,
    _slope,
    t_quantile,
    trend_per_window,
    trend_settled,
    trend_span,
    warmup_ceiling,
    warmup_round,
    warmup_start,
)
from ridgeline.probe._run import Run, Warmed
from ridgeline.probe._warmup import warmup
from ridgeline.probe.api import run_probe
from ridgeline.probe.config import ProbeConfig
from ridgeline.probe.drivers import SimDriver
from ridgeline.sim import SimPreset
from ridgeline.study.truth import true_capacity

# ------------------------------------------------------------------ the trend rule, exactly


def test_the_t_quantile_matches_the_tables() -> None:
    assert t_quantile(0.99, 28) == pytest.approx(2.4671, abs=2e-3)
    assert t_quantile(0.975, 10) == pytest.approx(2.2281, abs=2e-3)
    assert t_quantile(0.99, 118) == pytest.approx(2.3587, abs=2e-3)


def test_the_slope_and_its_standard_error() -> None:
    assert _slope([1.0, 2.0, 3.0]) == (1.0, 0.0)
    # x̄ = ȳ = 1.5, Sxx = 5, Sxy = -4; residuals 0.3, -0.9, 0.9, -0.3: RSS 1.8 on 2 df
    slope, se = _slope([3.0, 1.0, 2.0, 0.0])
    assert slope == pytest.approx(-0.8)
    assert se == pytest.approx(math.sqrt(1.8 / 2 / 5))


def test_the_span_is_the_trend_windows_or_the_last_half_of_a_long_hold() -> None:
    cfg = WarmupConfig(trend_windows=120)
    assert [trend_span(n, cfg) for n in (50, 120, 240, 300, 1000)] == [50, 120, 120, 150, 500]


CFG = WarmupConfig(trend_windows=4, trend_confidence=0.99, max_drop=0.01, cv_threshold=0.1)


def test_too_few_values_are_never_settled() -> None:
    assert not trend_settled([10.0, 10.0, 10.0], CFG)
    assert trend_settled([10.0, 10.0, 10.0, 10.0], CFG)


def test_a_fall_without_noise_is_certain() -> None:
    assert not trend_settled([12.0, 11.0, 10.0, 9.0], CFG)


def test_a_rise_is_no_warmup() -> None:
    assert trend_settled([9.0, 10.0, 11.0, 12.0], CFG)


def test_a_noisy_fall_settles_only_when_it_is_not_significant() -> None:
    # slope -0.8, se 0.424: t = -1.886 against -t(0.99, 2 df) ≈ -6.0 (and -1.886 < -1.6,
    # the 0.80 quantile): the same fall is noise at 99 % and a trend at 80 %
    values = [3.0, 1.0, 2.0, 0.0]
    assert trend_settled([v + 10 for v in values], CFG)
    strict = CFG.model_copy(update={"trend_confidence": 0.8, "cv_threshold": 1e-6})
    assert t_quantile(0.8, 2) < 1.886
    assert not trend_settled([v + 10 for v in values], strict)


def test_a_precise_but_negligible_fall_is_settled() -> None:
    # a straight fall (certain) of 0.09 across 4 values of mean ~100: 0.09 % ≤ 1 %
    tiny = [100.03, 100.0, 99.97, 99.94]
    assert trend_settled(tiny, CFG)
    assert not trend_settled(tiny, CFG.model_copy(update={"max_drop": 1e-4}))
    assert trend_per_window(tiny, CFG) == pytest.approx(-0.03 / 99.985)


# ------------------------------------------------------------------- the ramp, exactly

RAMP = WarmupConfig(min_windows=2, trend_windows=4, growth=1.5)


def test_the_start_and_the_ceiling() -> None:
    assert warmup_start(10.0, RAMP, None) == WarmupState(rate=10.0)
    assert warmup_ceiling(RAMP, None) == math.inf
    assert warmup_ceiling(RAMP, 400.0) == 200.0  # half the search's max_rate
    assert warmup_start(300.0, RAMP, 400.0) == WarmupState(rate=200.0, held=True)
    given = RAMP.model_copy(update={"rate": 50.0})
    assert warmup_start(10.0, given, 400.0) == WarmupState(rate=50.0, held=True)
    assert warmup_ceiling(given, 400.0) == 50.0


def test_a_healthy_round_raises_the_rate_to_the_ceiling() -> None:
    s = warmup_round(WarmupState(rate=10.0), [20.0, 20.0], True, RAMP)
    assert (s.rate, s.healthy_rate, s.held, s.recent, s.windows) == (15.0, 10.0, False, (), 2)
    s = warmup_round(s, [20.0, 20.0], True, RAMP, ceiling=20.0)
    assert (s.rate, s.healthy_rate, s.held) == (20.0, 15.0, True)
    # the first window at a new rate is left out of the trend: a queue drains in it
    s = warmup_round(s, [99.0, 20.0], True, RAMP, ceiling=20.0)
    assert s.recent == (20.0,) and s.windows == 6


def test_an_unhealthy_round_steps_back_and_holds() -> None:
    s = WarmupState(rate=15.0, healthy_rate=10.0, windows=4)
    s = warmup_round(s, [30.0, 30.0], False, RAMP)
    assert (s.rate, s.held, s.recent, s.steady) == (10.0, True, (), False)
    # unhealthy at the first rate twice: nowhere to step back to, held there
    s = warmup_round(WarmupState(rate=1.0), [30.0, 30.0], False, RAMP)
    s = warmup_round(s, [30.0, 30.0], False, RAMP)
    assert (s.rate, s.held, s.healthy_rate) == (1.0, True, None)


def test_the_first_round_is_cold_and_tried_again_before_the_ramp_holds() -> None:
    """Over HTTP, the example plan's first 10 requests reached 350 ms against 190-260 ms
    after: an unhealthy first round says the server was cold, not that the rate is too
    high. It runs again at its rate, its p50s left out of the trend; healthy then, the
    ramp climbs."""
    s = warmup_round(WarmupState(rate=1.0), [80.0, 90.0], False, RAMP)
    assert (s.rate, s.held, s.recent, s.windows) == (1.0, False, (), 2)
    s = warmup_round(s, [80.0, 80.0], True, RAMP)
    assert (s.rate, s.held, s.healthy_rate) == (1.0 * RAMP.growth, False, 1.0)


def test_at_the_held_rate_it_ends_once_the_trend_stops() -> None:
    s = WarmupState(rate=10.0, healthy_rate=10.0, held=True, windows=10, recent=(20.0, 20.0))
    s = warmup_round(s, [20.0, 20.0], True, RAMP)
    assert s.steady and s.rate == 10.0


def test_a_server_still_warming_at_the_held_rate_is_tried_higher() -> None:
    s = WarmupState(rate=10.0, healthy_rate=10.0, held=True, windows=10, recent=(23.0, 22.0))
    s = warmup_round(s, [21.0, 20.0], True, RAMP)
    assert not s.steady
    assert s.rate == pytest.approx(10.0 * math.sqrt(1.5)) and s.recent == ()
    # not while the round was unhealthy, nor above the ceiling
    s = WarmupState(rate=10.0, healthy_rate=10.0, held=True, windows=10, recent=(23.0, 22.0))
    assert warmup_round(s, [21.0, 20.0], True, RAMP, ceiling=10.0).rate == 10.0
    assert warmup_round(s, [21.0, 20.0], False, RAMP).rate == 10.0


# ------------------------------------------------------------- the phase, in virtual time

SLO = "p99<60ms,errors<0.1%"


def cache_server(requests: int | None = 300_000) -> SimPreset:
    """One instance, plain batching up to 16 (2 ms + 0.5 ms a row: 1,600 req/s
    saturated), 3× slower until ``requests`` requests were served (a cache filling)."""
    model: dict[str, object] = {
        "base_ms": 2.0,
        "per_item_ms": 0.5,
        "instances": 1,
        "noise_cv": 0.1,
        "batching": {"max_batch_size": 16},
    }
    if requests is not None:
        model["warmup"] = {"factor": 3.0, "requests": requests}
    return SimPreset.model_validate({"description": "cache", "model": model, "slo": SLO})


def warm_up(preset: SimPreset, **cfg: object) -> tuple[Warmed, Run, list[float]]:
    options = {"min_rate": 1.0, **cfg.pop("strategy_options", {})}  # type: ignore[dict-item]
    config = ProbeConfig(slo=SLO, strategy_options=options, **cfg)  # type: ignore[arg-type]
    rates: list[float] = []
    run = Run(
        SimDriver(preset, label="t"), config, None, None, on_start=lambda _, p: rates.append(p.rate)
    )
    return asyncio.run(warmup(run, 1.0, asyncio.Event())), run, rates


def test_a_server_warming_by_work_is_warmed_through_its_requests() -> None:
    """3× slower for 300,000 requests: the old warm-up, 90 s at the first step's 1 req/s,
    served it 90 of them. Now the rate rises while the server is well inside its SLO,
    and the warm-up ends only once its p50 has stopped falling: past 300,000 requests."""
    w, run, rates = warm_up(cache_server())
    assert w.steady and not w.capped and w.note == ""
    assert 300_000 <= w.requests <= 600_000, w
    assert w.seconds == run.warmup_s and w.requests == run.warmup_requests == run.sent
    assert w.windows == round(w.seconds)  # one-second windows, every one counted
    assert rates[0] == 1.0 and max(rates) > 300.0  # it exercised the server
    assert w.seconds < ProbeConfig(slo=SLO).warmup_config.max_s


def test_a_server_that_does_not_warm_ends_its_warmup_quickly() -> None:
    """No warm-up: the ramp (×1.5 a 10 s round while healthy) and one trend span at the
    held rate, then the end; a bounded number of windows."""
    w, _, rates = warm_up(cache_server(None))
    assert w.steady and not w.capped
    ramp = math.ceil(math.log(w.rate) / math.log(1.5)) + 2  # rounds up, and one back
    assert w.windows <= 10 * ramp + 2 * 130, (w, rates)


def test_a_warmup_the_cap_ends_still_trending_says_so() -> None:
    """3× slower for 1,000,000 requests, with a 600 s cap: the warm-up serves some
    170,000 of them, its rate rising as the server gets faster, and says it stopped at
    the cap before the p50 had stopped falling."""
    w, run, _ = warm_up(cache_server(1_000_000), warmup_config={"max_s": 600.0})
    assert w.capped and not w.steady
    assert w.seconds == run.warmup_s == 600.0 and w.requests == run.warmup_requests
    assert w.fall > 0.05 and w.fall_windows >= 120, w
    assert w.note.startswith("the warm-up reached its 600 s cap (warmup_config.max_s) after ")
    assert f"{w.requests:,} requests" in w.note and "stopped falling" in w.note


def test_the_rate_stays_under_half_the_search_ceiling_and_an_explicit_rate_is_held() -> None:
    _, _, rates = warm_up(cache_server(None), strategy_options={"max_rate": 200.0})
    assert max(rates) == 100.0
    w, _, rates = warm_up(cache_server(None), warmup_config={"rate": 50.0})
    assert set(rates) == {50.0} and w.steady


@pytest.mark.slow
def test_the_default_probe_of_a_server_warming_by_work_is_within_5_percent_of_its_truth() -> None:
    """The issue's server: 3× slower until 300,000 requests served. The default adaptive
    probe from 1 req/s once estimated it 17 % low (1,289 against 1,550 req/s: its search
    resumed upward twice, from a server still warming); now its warm-up serves the
    300,000 requests first, and the search judges the warm server. The truth is the warm
    server's, as ``study.truth`` judges every warming server."""
    preset = cache_server()
    r = run_probe(
        SimDriver(preset, label="t"), ProbeConfig(slo=SLO, strategy_options={"min_rate": 1.0})
    )
    truth = true_capacity(preset).capacity_rps
    assert truth is not None and r.capacity_rps is not None and r.confirmed, r.reason
    assert abs(r.capacity_rps / truth - 1) <= 0.05, (r.capacity_rps, truth)
    warm = [t for t in r.health_timeline if t["state"] == "warmup"]
    assert len(warm) >= 300  # the warm-up's windows: past 300,000 requests at < 1,600/s
    assert r.warmup_excluded_s >= len(warm)
