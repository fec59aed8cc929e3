"""Warmup: where a step's steady state starts, and when an explicit warmup phase is done.

A server's first seconds are not its steady state: caches fill, kernels are compiled or
autotuned, batches form. Two tools, both pure:

- ``steady_start(values)`` — after the fact, the index of the first steady window of a
  step's window series (p50 per window, say): MSER-5 (White 1997; Franklin & White 2008)
  when the series is long enough, else a simple rule. Never more than half the series:
  a step that never settles is judged on its second half, not discarded.
- ``warmup_step(state, p50_ms, cfg)`` — online, for the explicit warmup phase at a low
  rate before the search: steady once the last ``min_windows`` p50s vary little (CV <
  ``cv_threshold``) and are not still falling (a server warming up gets faster).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._fields import Share

BATCH = 5
SHORT_TOLERANCE = 0.1
"""The simple rule for short series: steady from the first value at most 10 % above the
median of the second half."""


def mser5(values: Sequence[float]) -> int:
    """MSER-5 truncation: how many leading values to drop (a multiple of 5).

    Means of batches of 5 consecutive values (a trailing partial batch is ignored); the
    truncation d (in batches) minimises Σ(remaining batch means − their mean)² / (m − d)²
    over d < m/2, so at most half the series is dropped. Ties go to the smaller d.
    """
    m = len(values) // BATCH
    batches = [sum(values[i * BATCH : (i + 1) * BATCH]) / BATCH for i in range(m)]
    best_d, best = 0, math.inf
    for d in range((m + 1) // 2):
        rest = batches[d:]
        mean = sum(rest) / len(rest)
        stat = sum((b - mean) ** 2 for b in rest) / len(rest) ** 2
        if stat < best:
            best_d, best = d, stat
    return best_d * BATCH


def steady_start(values: Sequence[float], min_len: int = 10) -> int:
    """Index of the first steady value of ``values``: MSER-5 from ``min_len`` values on,
    else the first value at most 10 % above the median of the second half; never more
    than half the series."""
    n = len(values)
    if n < 2:
        return 0
    if n >= min_len:
        return min(mser5(values), n // 2)
    settled = statistics.median(values[n // 2 :]) * (1 + SHORT_TOLERANCE)
    first = next((i for i, v in enumerate(values) if v <= settled), 0)
    return min(first, n // 2)


class WarmupConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    window_s: float = Field(1.0, gt=0, description="width of a warmup window, s")
    min_windows: int = Field(
        10, ge=2, description="consecutive stable windows that make the server steady"
    )
    cv_threshold: float = Field(
        0.15, gt=0, description="largest coefficient of variation (sd/mean) of those p50s"
    )
    max_drop: float = Field(
        0.03,
        gt=0,
        description="largest fall of the p50 fitted across those windows, as a fraction of "
        "their mean, still steady (more: the server is still warming up)",
    )
    max_s: float = Field(90.0, gt=0, description="warmup gives up after this long, s")
    rate: float | None = Field(
        None, gt=0, description="explicit warmup rate, req/s; default rate_fraction × first rate"
    )
    rate_fraction: Share = Field(
        1.0, description="warmup rate as a fraction of the search's first step"
    )
    requests: int | None = Field(
        None,
        ge=1,
        description="warm until at least this many requests were sent, and steady: a "
        "server that warms by work done (JIT, caches, autotuning) needs its requests",
    )


@dataclass(frozen=True, slots=True)
class WarmupState:
    recent: tuple[float, ...] = ()
    """The last ``min_windows`` p50s, oldest first."""
    windows: int = 0
    """Windows seen, measured or not."""
    elapsed_s: float = 0.0


def warmup_step(state: WarmupState, p50_ms: float, cfg: WarmupConfig) -> tuple[bool, WarmupState]:
    """Add one window's p50 (ms); return whether the server is steady now, and the state.

    A window with no measurement (p50 ≤ 0 or not finite: nothing answered) clears the
    recent values: stability must be shown by ``min_windows`` measured windows in a row.
    """
    windows, elapsed = state.windows + 1, state.elapsed_s + cfg.window_s
    if not (math.isfinite(p50_ms) and p50_ms > 0):
        return False, WarmupState((), windows, elapsed)
    recent = (*state.recent, p50_ms)[-cfg.min_windows :]
    nxt = WarmupState(recent, windows, elapsed)
    if len(recent) < cfg.min_windows:
        return False, nxt
    mean = statistics.fmean(recent)
    cv = statistics.pstdev(recent) / mean
    return cv < cfg.cv_threshold and _fitted_drop(recent) <= cfg.max_drop * mean, nxt


def warmup_expired(state: WarmupState, cfg: WarmupConfig) -> bool:
    """Whether the warmup phase has run its ``max_s`` without becoming steady."""
    return state.elapsed_s >= cfg.max_s


def _fitted_drop(values: Sequence[float]) -> float:
    """How far the least-squares line falls from the first value to the last (≥ 0)."""
    n = len(values)
    mx = (n - 1) / 2
    my = statistics.fmean(values)
    sxx = sum((i - mx) ** 2 for i in range(n))
    slope = sum((i - mx) * (v - my) for i, v in enumerate(values)) / sxx
    return max(0.0, -slope * (n - 1))
