"""The score as a continuous signal: 1/score as a line in rate, and where it crosses 1.

Queueing intuition: latency grows like ``1/(1 − ρ)``, so ``1/score`` falls roughly
linearly toward the capacity — exactly so for an M/M/1 queue — and a line through two
measured points extrapolates well to the rate where ``score = 1``. The score is not
monotone at low load, though (dynamic batching makes latency *fall* as load rises), so a
line is used only where it points the right way, and its crossing is always clipped
into the bracket [highest sustainable, lowest unsustainable] the verdicts have proved.
Overloaded verdicts carry a saturated score, not a distance, so no secant passes through
one; a bracket end may still be one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ridgeline.health.state import HealthState
from ridgeline.search._driver import bracket
from ridgeline.search.base import StepVerdict

_TINY = 1e-9


def inverse_score(verdict: StepVerdict) -> float:
    """``1/score``, finite for any score (a score ≤ 0 counts as a tiny one)."""
    if math.isinf(verdict.score):
        return 0.0
    return 1.0 / max(verdict.score, _TINY)


@dataclass(frozen=True, slots=True)
class Line:
    """``1/score`` as a straight line in rate, through two measured points."""

    rate0: float
    inv0: float
    rate1: float
    inv1: float

    @classmethod
    def through(cls, a: StepVerdict, b: StepVerdict) -> Line:
        return cls(a.rate, inverse_score(a), b.rate, inverse_score(b))

    @property
    def slope(self) -> float:
        return (self.inv1 - self.inv0) / (self.rate1 - self.rate0)

    def score(self, rate: float) -> float:
        """The score the line predicts at ``rate`` (inf past where 1/score reaches 0)."""
        inv = self.inv0 + self.slope * (rate - self.rate0)
        return math.inf if inv <= 0 else 1.0 / inv

    def crossing(self) -> float | None:
        """The rate where the score reaches 1; None when the score is not rising."""
        if self.slope >= 0:
            return None
        return self.rate0 + (1.0 - self.inv0) / self.slope


def _distinct(points: Iterable[StepVerdict]) -> list[StepVerdict]:
    """The latest verdict at each rate, by rate ascending."""
    latest = {p.rate: p for p in points}
    return [latest[r] for r in sorted(latest)]


def fit(
    points: tuple[StepVerdict, ...], lo: StepVerdict | None, hi: StepVerdict | None
) -> Line | None:
    """The line the boundary estimate rests on: the first of these whose score rises
    and crosses 1 strictly inside the bracket (open where an end is missing).

    1. The secant through the two points whose scores are nearest to 1 (the secant
       method: the nearest points carry the most information about the crossing).
    2. The secant through the two highest sustainable points (extrapolating up).
    3. The secant through the two lowest failures (extrapolating down).
    4. The chord from ``lo`` to ``hi`` (regula falsi).
    """
    usable = _distinct(p for p in points if p.state is not HealthState.OVERLOADED)
    for pair in _pairs(usable, lo, hi):
        if len(pair) == 2:
            a, b = sorted(pair, key=lambda p: p.rate)
            line = Line.through(a, b)
            cross = line.crossing()
            if (
                cross is not None
                and cross > 0
                and (lo is None or lo.rate < cross)
                and (hi is None or cross < hi.rate)
            ):
                return line
    return None


def _pairs(
    usable: list[StepVerdict], lo: StepVerdict | None, hi: StepVerdict | None
) -> list[list[StepVerdict]]:
    nearest = sorted(usable, key=lambda p: abs(inverse_score(p) - 1.0))[:2]
    held = [p for p in usable if p.sustainable]
    failed = [p for p in usable if not p.sustainable]
    return [nearest, held[-2:], failed[:2], [lo, hi] if lo and hi else []]


def estimate(
    points: tuple[StepVerdict, ...], lo: StepVerdict | None, hi: StepVerdict | None
) -> float | None:
    """The rate where ``score = 1`` by the fitted line; without one, the bracket's
    (geometric) middle; None with neither."""
    line = fit(points, lo, hi)
    if line is not None:
        return line.crossing()
    if lo is not None and hi is not None:
        return math.sqrt(lo.rate * hi.rate)
    return None


def throughput_ceiling(points: tuple[StepVerdict, ...]) -> float | None:
    """The throughput the server tends to: measured, as the most an overloaded step got
    through, when a step overloaded it; else the fitted line's pole (where ``1/score``
    reaches 0); None with neither."""
    overloaded = [
        p.achieved_rps
        for p in points
        if p.state is HealthState.OVERLOADED and 0 < p.achieved_rps < p.rate
    ]
    if overloaded:
        return max(overloaded)
    line = fit(points, *bracket(points))
    if line is None or line.slope >= 0:
        return None
    return line.rate0 - line.inv0 / line.slope


def predicted_score(
    points: tuple[StepVerdict, ...], lo: StepVerdict | None, hi: StepVerdict | None, rate: float
) -> float:
    """The score expected at ``rate``: from the fitted line, else from the secant through
    the two measured points nearest to ``rate``, else proportional to the rate from the
    one point there is (latency ∝ load)."""
    line = fit(points, lo, hi)
    if line is None:
        usable = _distinct(p for p in points if p.state is not HealthState.OVERLOADED)
        near = sorted(usable, key=lambda p: abs(math.log(p.rate / rate)))[:2]
        if len(near) == 2:
            line = Line.through(*sorted(near, key=lambda p: p.rate))
    if line is not None:
        return line.score(rate)
    nearest = min(points, key=lambda p: abs(math.log(p.rate / rate)))
    return nearest.score * rate / nearest.rate


def spread(values: tuple[float, ...]) -> float:
    """Coefficient of variation (population standard deviation over the mean)."""
    mean = math.fsum(values) / len(values)
    var = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return math.sqrt(var) / mean
