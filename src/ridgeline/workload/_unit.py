"""Unit-rate point processes and time-rescaling: the randomness every arrival spec shares.

Every schedule is made in two steps. First, points ``s_1 < s_2 < ...`` of a process with
mean gap 1 are laid on ``[0, Λ(T))``, where ``Λ(t)`` is the expected number of arrivals
by ``t`` (exponential gaps for Poisson, gamma gaps for bursty renewals, ``0, 1, 2, ...``
for evenly spaced). Then each point is mapped to time ``t = Λ⁻¹(s)``. For a Poisson
unit process this is exact (the time-rescaling theorem): the count over ``[a, b)`` is
Poisson with mean ``Λ(b) - Λ(a)``, with no thinning approximation.

Points are drawn in blocks of doubling size (1024, 2048, ...) whatever ``Λ(T)`` is, so a
seed fixes the whole infinite sequence: a longer schedule extends a shorter one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import ConfigError

Floats = NDArray[np.float64]
GapSampler = Callable[[np.random.Generator, int], Floats]

MAX_ARRIVALS = 100_000_000
"""Refuse schedules expected to hold more arrivals than this (about 800 MB of offsets)."""

_FIRST_BLOCK = 1024


def exponential_gaps(rng: np.random.Generator, size: int) -> Floats:
    """Gaps of a unit-rate Poisson process."""
    return rng.standard_exponential(size)


def gamma_gaps(cv: float) -> GapSampler:
    """Gamma gaps with mean 1 and coefficient of variation ``cv`` (shape ``1/cv²``)."""
    shape = 1.0 / (cv * cv)

    def draw(rng: np.random.Generator, size: int) -> Floats:
        return rng.standard_gamma(shape, size) / shape

    return draw


def check_duration(duration_s: float) -> None:
    """Refuse a duration that is not a finite number of seconds > 0."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"duration_s must be a finite number of seconds > 0, got {duration_s}")


def check_run(total: float, duration_s: float, seed: int) -> None:
    """Refuse a bad duration or seed, or an expected arrival count too large to hold."""
    check_duration(duration_s)
    if seed < 0:
        raise ConfigError(f"seed must be an integer ≥ 0, got {seed}")
    if total > MAX_ARRIVALS:
        raise ConfigError(
            f"the schedule would hold about {total:.3g} arrivals over {duration_s:g} s, "
            f"more than the {MAX_ARRIVALS:,} ridgeline holds in memory; "
            "shorten the duration or lower the rate"
        )


def renewal_points(total: float, rng: np.random.Generator, gaps: GapSampler) -> Floats:
    """Points in ``[0, total)`` of a renewal process with mean gap 1, the first one gap
    after 0."""
    blocks: list[Floats] = []
    end = 0.0
    size = _FIRST_BLOCK
    while end < total:
        block = end + np.cumsum(gaps(rng, size))
        blocks.append(block)
        end = float(block[-1])
        size *= 2
    if not blocks:
        return np.empty(0, dtype=np.float64)
    points = np.concatenate(blocks)
    return points[: int(np.searchsorted(points, total, side="left"))]


def even_points(total: float) -> Floats:
    """``0, 1, 2, ...`` below ``total``."""
    return np.arange(math.ceil(total), dtype=np.float64)


def unit_points(total: float, seed: int, poisson: bool) -> Floats:
    """Unit-rate Poisson points (seeded) or evenly spaced ones, in ``[0, total)``."""
    if not poisson:
        return even_points(total)
    return renewal_points(total, np.random.default_rng(seed), exponential_gaps)


def within(times: Floats, duration_s: float) -> Floats:
    """Sorted float64 times in ``[0, duration_s)`` (guards rounding at both ends)."""
    times = np.sort(np.asarray(times, dtype=np.float64))
    lo = int(np.searchsorted(times, 0.0, side="left"))
    hi = int(np.searchsorted(times, duration_s, side="left"))
    return times[lo:hi]


def invert_monotone(
    cumulative: Callable[[Floats], Floats],
    rate: Callable[[Floats], Floats],
    s: Floats,
    guess: Floats,
    lo: Floats,
    hi: Floats,
) -> Floats:
    """Solve ``cumulative(t) = s`` for each ``s`` by Newton's method from ``guess``, kept
    inside the bracket ``[lo, hi]`` (bisection when a step leaves it), to about 1e-12
    relative.

    ``cumulative`` must be increasing with derivative ``rate > 0``.
    """
    t = np.clip(guess, lo, hi)
    for _ in range(200):
        f = cumulative(t) - s
        lo = np.where(f < 0, t, lo)
        hi = np.where(f > 0, t, hi)
        stepped = t - f / rate(t)
        stepped = np.where((stepped < lo) | (stepped > hi), 0.5 * (lo + hi), stepped)
        done = np.abs(stepped - t) <= 1e-12 * np.maximum(1.0, np.abs(t))
        t = stepped
        if bool(np.all(done)):
            break
    return t
