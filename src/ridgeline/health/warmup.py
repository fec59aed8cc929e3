"""Warmup: when the explicit warm-up phase before a probe's search is done.

A server's first seconds are not its steady state: caches fill, kernels are compiled or
autotuned, batches form. The probe warms it in a phase of its own, left out of every
verdict; no step is cut afterwards (a steady-state cut inside steps, MSER-5, once
dropped the first 5-65 s of a third of the steps and passed some that failed over all
their requests: the verdict must not censor).

- ``warmup_round(state, readings, cfg)`` — online, the explicit warm-up phase before the
  search, in rounds of ``min_windows`` windows. Its rate starts at the search's first
  and rises (× ``growth`` a round) while every window is well inside the SLO
  (``headroom``), up to a ceiling; a round that is not steps back to the last rate that
  was, and holds it. At the held rate, the warm-up ends when the p50 has stopped
  trending (``trend_settled``: no significant fall of the slope fitted to the last
  ``trend_windows`` p50s), however many requests that takes; ``max_s`` is only a safety
  cap. A server still warming at the held rate (a significant fall, every window
  healthy) is tried higher again: a server gets faster as it warms, and it warms by the
  requests it serves.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._fields import Share, StepRate
from ridgeline.health.judge import Judgment


class WarmupConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    window_s: float = Field(1.0, gt=0, description="width of a warmup window, s")
    min_windows: int = Field(
        10,
        ge=2,
        description="windows in a round: the warm-up's rate changes only between rounds",
    )
    cv_threshold: float = Field(
        0.15,
        gt=0,
        description="a fall no larger than max_drop, across trend windows whose p50s vary "
        "less than this (sd/mean), is steady however significant",
    )
    max_drop: float = Field(
        0.005,
        gt=0,
        description="largest fall of the p50 fitted across the trend windows, as a fraction "
        "of their mean, that is steady however significant (a precise server's drift); a "
        "larger one is steady only when it is not significant",
    )
    max_s: float = Field(
        1800.0,
        gt=0,
        description="a safety cap, s: the warm-up ends here even while its latency still "
        "falls, and says so",
    )
    rate: StepRate | None = Field(
        None,
        description="explicit warmup rate, req/s, held throughout; default: from "
        "rate_fraction × first rate, rising while the server is well inside the SLO",
    )
    rate_fraction: Share = Field(
        1.0, description="first warmup rate as a fraction of the search's first step"
    )
    requests: int | None = Field(
        None,
        ge=1,
        description="warm until at least this many requests were sent, and steady: a "
        "server that warms by work done (JIT, caches, autotuning) needs its requests",
    )
    growth: float = Field(
        1.5, gt=1, le=10, description="the rate's factor after a round of healthy windows"
    )
    headroom: Share = Field(
        0.8,
        description="a round is healthy, and the rate may rise, when every latency bound's "
        "statistic over its requests is below this fraction of its bound and its error rate "
        "below this fraction of the SLO's",
    )
    ceiling_fraction: Share = Field(
        0.5,
        description="the warm-up rate rises to at most this fraction of the search's "
        "max_rate (none: as far as the windows stay healthy)",
    )
    trend_windows: int = Field(
        120, ge=3, description="windows at the held rate the p50's trend is fitted to"
    )
    trend_confidence: float = Field(
        0.99,
        gt=0.5,
        lt=1,
        description="one-sided confidence that the p50 still falls (slope's t-test): below "
        "it, the trend has stopped",
    )


def round_healthy(j: Judgment, cfg: WarmupConfig) -> bool:
    """Whether a round, judged whole (``health.judge``), was well inside its SLO: answers
    came, every latency bound's statistic is below ``headroom`` × its bound, and the
    error rate below ``headroom`` × the SLO's. The round's requests pooled, not its
    windows one by one: a one-second window of a few requests has its p99 at its max."""
    if j.answered == 0 or j.error_rate >= cfg.headroom * j.policy.max_error_rate:
        return False
    for b in j.policy.latency:
        v = j.statistics[b.metric].get(b.percentile)
        if v is None or not (math.isfinite(v) and v < cfg.headroom * b.bound_ms):
            return False
    return True


@dataclass(frozen=True, slots=True)
class WarmupState:
    recent: tuple[float, ...] = ()
    """The p50s at the current rate, oldest first (at most ``MAX_RECENT``)."""
    windows: int = 0
    """Windows seen, measured or not."""
    elapsed_s: float = 0.0
    rate: float = 0.0
    """The rate of the next round, req/s."""
    healthy_rate: float | None = None
    """The highest rate a whole round was healthy at."""
    held: bool = False
    """The ramp is over (a round was unhealthy, or the rate is at its ceiling): the rate
    is held, and rises only while the server is seen still warming."""
    steady: bool = False
    """The p50 at the held rate has stopped trending."""
    fall: float = 0.0
    """The fitted fall of the p50 across the last trend span tested (``trend_windows``
    windows at least, at one rate), as a fraction of its mean: what the last test saw."""
    fall_windows: int = 0
    """The windows that span held (0: none tested yet)."""


MAX_RECENT = 4096
"""The p50s a state keeps at one rate: over an hour of one-second windows."""


def warmup_start(first_rate: float, cfg: WarmupConfig, max_rate: float | None) -> WarmupState:
    """The state before the first round: ``cfg.rate`` held, or ``rate_fraction`` of the
    search's first rate, ramping (held at once if that is already the ceiling)."""
    if cfg.rate is not None:
        return WarmupState(rate=cfg.rate, held=True)
    rate = max(first_rate * cfg.rate_fraction, 1e-3)
    ceiling = warmup_ceiling(cfg, max_rate)
    return WarmupState(rate=min(rate, ceiling), held=rate >= ceiling)


def warmup_ceiling(cfg: WarmupConfig, max_rate: float | None) -> float:
    """The highest warm-up rate: ``cfg.rate`` when given, ``ceiling_fraction`` of the
    search's ``max_rate``, else none."""
    if cfg.rate is not None:
        return cfg.rate
    return math.inf if max_rate is None else cfg.ceiling_fraction * max_rate


def warmup_step(state: WarmupState, p50_ms: float, cfg: WarmupConfig) -> tuple[bool, WarmupState]:
    """Add one window's p50 (ms) at the current rate; return whether its trend has
    stopped (``trend_settled``), and the state.

    A window with no measurement (p50 ≤ 0 or not finite: nothing answered) clears the
    recent values: the trend must be shown by measured windows in a row.
    """
    nxt = _added(state, p50_ms, cfg)
    return bool(nxt.recent) and trend_settled(nxt.recent, cfg), nxt


def _added(state: WarmupState, p50_ms: float | None, cfg: WarmupConfig) -> WarmupState:
    """``state`` one window on: its p50 added to ``recent`` (a window that answered
    nothing clears them; None, a window left out of the trend, leaves them)."""
    windows, elapsed = state.windows + 1, state.elapsed_s + cfg.window_s
    if p50_ms is None:
        return replace(state, windows=windows, elapsed_s=elapsed)
    if not (math.isfinite(p50_ms) and p50_ms > 0):
        return replace(state, recent=(), windows=windows, elapsed_s=elapsed)
    recent = (*state.recent, p50_ms)[-MAX_RECENT:]
    return replace(state, recent=recent, windows=windows, elapsed_s=elapsed)


def warmup_round(
    state: WarmupState,
    p50s: Sequence[float | None],
    healthy: bool,
    cfg: WarmupConfig,
    ceiling: float = math.inf,
) -> WarmupState:
    """One round at ``state.rate``: its windows' p50s (None: nothing sent in the window)
    and whether it was well inside the SLO (``round_healthy``); the state after it,
    ``steady`` once the warm-up is done, else with the next round's ``rate``.

    - An unhealthy first round is run again at its rate (the server was cold);
    - an unhealthy round steps the rate back to the highest healthy one (none yet: it
      stays), and holds it;
    - a healthy round while ramping multiplies the rate by ``growth`` (to ``ceiling``;
      there, it is held);
    - at the held rate, the warm-up is done once the p50's trend has stopped
      (``trend_settled``); while it still falls significantly, every ``trend_windows``
      windows of healthy rounds say the server is still warming and getting faster: the
      rate rises by √growth (to ``ceiling``), and the series starts again there.

    The first window at a new rate is left out of the trend (a queue from the round
    before drains in it).
    """
    first = state.rate
    state = replace(state, steady=False)
    new_rate = not state.recent and state.windows > 0
    for i, v in enumerate(p50s):
        state = _added(state, None if i == 0 and new_rate else v, cfg)
    settled = trend_settled(state.recent, cfg)
    if len(state.recent) >= cfg.trend_windows:
        span = trend_span(len(state.recent), cfg)
        fall = -trend_per_window(state.recent, cfg) * (span - 1)
        state = replace(state, fall=fall, fall_windows=span)
    if not healthy and state.windows <= len(p50s):
        # the server's very first round is its coldest: it says nothing yet of the
        # rate, which is tried once more before the ramp holds (over HTTP, the example
        # plan's first 10 requests reached 350 ms against 190-260 ms after)
        return replace(state, recent=())
    if not healthy:
        back = min(state.healthy_rate or first, first)
        if back < first:
            return replace(state, rate=back, held=True, recent=())
        return replace(state, held=True, steady=settled)
    state = replace(state, healthy_rate=max(state.healthy_rate or 0.0, first))
    if not state.held:
        up = min(first * cfg.growth, ceiling)
        if up <= first:
            return replace(state, held=True, steady=settled)
        return replace(state, rate=up, held=up >= ceiling, recent=())
    if settled:
        return replace(state, steady=True)
    if len(state.recent) >= cfg.trend_windows and first < ceiling:
        up = min(first * math.sqrt(cfg.growth), ceiling)
        return replace(state, rate=up, recent=())
    return state


def trend_span(n: int, cfg: WarmupConfig) -> int:
    """How many of ``n`` p50s at one rate the trend is fitted to: the last
    ``trend_windows``, or the last half when that is more (a slow warm-up's fall is
    small against the noise of a few windows; the longer the hold, the finer the test)."""
    return min(n, max(cfg.trend_windows, n // 2))


def trend_settled(values: Sequence[float], cfg: WarmupConfig) -> bool:
    """Whether ``values`` (p50s at one rate, oldest first) have stopped trending: at least
    ``trend_windows`` of them, and the least-squares line through the last
    ``trend_span`` of them does not fall significantly (one-sided t-test of its slope at
    ``trend_confidence``, n − 2 degrees of freedom), or falls negligibly: by at most
    ``max_drop`` of their mean, with their spread under ``cv_threshold``. A rise is no
    warm-up: settled."""
    if len(values) < cfg.trend_windows:
        return False
    v = list(values)[-trend_span(len(values), cfg) :]
    mean = statistics.fmean(v)
    slope, se = _slope(v)
    if slope >= 0:
        return True
    fall = -slope * (len(v) - 1)
    if fall <= cfg.max_drop * mean and statistics.pstdev(v) < cfg.cv_threshold * mean:
        return True
    if se == 0:
        return False  # a fall without noise: certain
    return slope / se > -t_quantile(cfg.trend_confidence, len(v) - 2)


def warmup_expired(state: WarmupState, cfg: WarmupConfig) -> bool:
    """Whether the warmup phase has run its ``max_s`` (its safety cap) without becoming
    steady."""
    return state.elapsed_s >= cfg.max_s and not state.steady


def trend_per_window(values: Sequence[float], cfg: WarmupConfig) -> float:
    """The fitted slope of the last ``trend_span`` values, per window, as a fraction
    of their mean (negative: falling); 0 for fewer than two."""
    v = list(values)[-trend_span(len(values), cfg) :]
    if len(v) < 2:
        return 0.0
    mean = statistics.fmean(v)
    return _slope(v)[0] / mean if mean > 0 else 0.0


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile ``p`` with ``df`` degrees of freedom, by the Cornish–Fisher
    expansion about the normal's (Abramowitz & Stegun 26.7.5): within 0.002 of the exact
    for df ≥ 10 at p ≤ 0.99 (2.467 for df 28 at 0.99); a little small for fewer."""
    z = NormalDist().inv_cdf(p)
    n = max(df, 1)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / n + g2 / n**2 + g3 / n**3


def _slope(values: Sequence[float]) -> tuple[float, float]:
    """The least-squares slope through ``values`` (x = 0, 1, …) and its standard error
    (0 for fewer than three values)."""
    n = len(values)
    mx = (n - 1) / 2
    my = statistics.fmean(values)
    sxx = sum((i - mx) ** 2 for i in range(n))
    slope = sum((i - mx) * (v - my) for i, v in enumerate(values)) / sxx
    if n < 3:
        return slope, 0.0
    rss = sum((v - my - slope * (i - mx)) ** 2 for i, v in enumerate(values))
    return slope, math.sqrt(max(rss, 0.0) / (n - 2) / sxx)
