"""Judging a confirmation: one long run, or a majority of three when it failed narrowly.

A long run's p99 is itself a noisy estimate: on a server with heavy-tailed service
times, runs of the same length at the same rate score on both sides of the SLO. A
confirmation that fails near the boundary — within ``margin``, or within ``Z`` standard
errors of its own score, measured from the spread of the run's quarters — is a coin
toss, so it is run again, up to three times, and the majority decides — or, when the
three disagree, their requests beyond the bound added up against what the percentile
allows of all their requests (``pooled_tail``: a long run weighs by its requests, and
two short ones that caught no stall do not outvote it). A pass stands at
once when its count beyond the bound could not be a boundary server's luck
(``unsure``), as does a clear failure: a pass above the boundary grows rarer fast the further
above it is, while a narrow failure at a sustainable rate would send the search lower
for nothing. Once a confirmation has failed, though, the search's short steps have
been shown optimistic; from then on a narrow pass goes to the majority as well. The
probe's confirmation (after any strategy) and the adaptive search's own confirmation
both judge by ``decide``; after a failure, ``below_failed`` says where to confirm next.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from ridgeline.health.sampling import binomial_cdf
from ridgeline.search._model import throughput_ceiling
from ridgeline.search.base import StepVerdict

MAX_RUNS = 3
DEFAULT_MARGIN = 0.0
ConfirmMargin = Annotated[
    float,
    Field(
        ge=0,
        le=1,
        description="a confirmation failing within this of the boundary, or within "
        "4 standard errors of its score (from its quarters), is run again, up to 3 times, "
        "and the majority decides",
    ),
]
"""The ``confirm_margin`` setting, as the probe's and the adaptive search's configs
declare it (default ``DEFAULT_MARGIN``)."""
MAX_BACKOFF = 0.04
MAX_CALIBRATED_BACKOFF = 0.15
CLEAR_FAILURE = 2.0
"""A failed confirmation scoring at least this is far past the boundary: its calibrated
back-off may reach ``MAX_CALIBRATED_BACKOFF``. Nearer, it stops at ``MAX_BACKOFF``:
run-to-run noise would make a longer step a gamble (one run's score moves it by (score
noise)·(ceiling − rate)/rate)."""
Z = 4.0
"""The marginal band in standard errors of ln(score) from the run's quarters. A run's
p99 is set by its worst stretch, so the quarters understate run-to-run spread: on the
``nlp`` class, ln(score) across 8 runs of 120 s had SD 0.12, the quarters' SE about
0.06. Four quarter-SEs are about two run-to-run SDs."""


class Decision(StrEnum):
    HELD = "held"
    FAILED = "failed"
    AGAIN = "again"
    """Marginal and undecided: run the same confirmation once more."""


def marginal(verdict: StepVerdict, margin: float) -> bool:
    """Whether ``verdict`` lies near the boundary: its score within
    ``margin`` of 1, or within ``Z`` standard errors of it (``score_se``, from the spread
    of the run's quarters: a noisy server widens the band). Only valid runs: an invalid
    run failed."""
    if not verdict.valid or not 0.0 < verdict.score < math.inf:
        return False
    band = max(math.log1p(margin), Z * verdict.score_se)
    return abs(math.log(verdict.score)) < band


UNSURE_LEVEL = 0.05
"""A held run is sure only if its count beyond the bound is below what the percentile
allows at this one-sided level (``unsure``)."""


def boundary_chance(verdict: StepVerdict) -> float | None:
    """How often a server right at the boundary would hold as well as ``verdict`` did:
    P(a count beyond the bound no higher than its own), in effective requests
    (``dispersion``: clustered late requests count as one). None for a run that did not
    hold, or was judged on no percentile."""
    if not verdict.sustainable or not verdict.judged or verdict.samples <= 0:
        return None
    share = verdict.allowed / verdict.samples
    if not 0.0 < share < 1.0:
        return None
    d = max(verdict.dispersion, 1.0)
    n = max(round(verdict.samples / d), 1)
    return binomial_cdf(round(verdict.beyond / d), n, share)


def unsure(verdict: StepVerdict) -> bool:
    """Whether a held run's pass could be chance: its count beyond the bound, in
    effective requests (``dispersion``: clustered late requests count as one), is no
    lower than a server right at the boundary would give it at least ``UNSURE_LEVEL``
    of the time (``boundary_chance``). A run of a heavy-tailed server held at 0.91 %
    beyond a p99 bound, where the steps around it had 1.3 % to 1.9 %, by the luck of its
    90 s: its 206 beyond were worth 34 independent requests against 38 allowed, a 1-in-3
    draw."""
    chance = boundary_chance(verdict)
    return chance is not None and chance > UNSURE_LEVEL


def decide(
    runs: Sequence[StepVerdict], margin: float = DEFAULT_MARGIN, *, contested: bool = False
) -> Decision:
    """The verdict of the confirmation runs so far (all at one rate), in order.

    ``contested``: a confirmation has already failed in this search, so long runs have
    contradicted the short steps once; then a narrow pass goes to the majority too.
    """
    if not runs:
        return Decision.AGAIN
    first = runs[0]
    alone = not unsure(first) and (
        not marginal(first, margin) or (first.sustainable and not contested)
    )
    if len(runs) == 1 and alone:
        return Decision.HELD if first.sustainable else Decision.FAILED
    held = sum(r.sustainable for r in runs)
    failed = len(runs) - held
    if held and failed and len(runs) >= MAX_RUNS and (pooled := pooled_tail(runs)) is not None:
        return Decision.HELD if pooled else Decision.FAILED
    need = MAX_RUNS // 2 + 1
    if held >= need:
        return Decision.HELD
    if failed >= need:
        return Decision.FAILED
    if len(runs) >= MAX_RUNS:  # unreachable with an odd MAX_RUNS; kept for safety
        return Decision.HELD if held > failed else Decision.FAILED
    return Decision.AGAIN


def pooled_tail(runs: Sequence[StepVerdict]) -> bool | None:
    """Whether runs that disagree held together: their requests beyond the percentile's
    bound, added up, within what the percentile allows of their requests added up, as
    one run as long as all of them would be judged (they ran at one rate). A vote would
    let two short runs that caught no stall outvote a long one that caught several: a
    long run's verdict weighs by its requests. None where a run failed by more than its
    tail (errors, a trend) or the runs were judged on different bounds: then the
    majority decides."""
    judged = {r.judged for r in runs}
    if len(judged) != 1 or not next(iter(judged)) or any(r.allowed <= 0 for r in runs):
        return None
    if any(not r.sustainable and r.beyond <= r.allowed for r in runs):
        return None
    return sum(r.beyond for r in runs) <= sum(r.allowed for r in runs)


def deciding(runs: Sequence[StepVerdict], decision: Decision) -> StepVerdict:
    """The run that speaks for a decided confirmation: on the winning side, the one
    nearest the boundary (the least-failed failure, the closest-run success), so that one
    wild run does not set how far the next confirmation backs off."""
    if decision is Decision.HELD:
        return max((r for r in runs if r.sustainable), key=lambda r: r.score)
    return min((r for r in runs if not r.sustainable), key=lambda r: r.score)


def backoff(score: float, precision: float, cap: float = MAX_BACKOFF) -> float:
    """How far below a failed confirmation to confirm again: further the further past
    the boundary it scored, (score − 1)/2, between the precision and ``cap`` (4 %: a
    larger step would overshoot on a system whose latency rises steeply near the
    boundary; a clear failure's cap is ``MAX_CALIBRATED_BACKOFF``)."""
    return min(max((score - 1.0) / 2.0, precision), cap)


def calibrated_backoff(rate: float, score: float, ceiling: float, precision: float) -> float:
    """How far below a failed confirmation the boundary lies, by the long run's own score.

    Short steps see fewer tail events than a long run, so their scores run low; but both
    fall toward the same throughput ``ceiling`` (where ``1/score`` reaches 0). A line in
    ``1/score`` through the long run's point and that ceiling crosses 1 at
    ``ceiling − score·(ceiling − rate)``: the long-run boundary. The back-off to it is
    kept between the precision and ``MAX_CALIBRATED_BACKOFF``. Near the boundary (score
    ≈ 1) the ceiling barely matters, which keeps a poor ceiling from doing harm there.
    """
    boundary = ceiling - score * (ceiling - rate)
    return min(max(1.0 - boundary / rate, precision), MAX_CALIBRATED_BACKOFF)


def below_failed(failed: StepVerdict, search: Sequence[StepVerdict], precision: float) -> float:
    """The rate to confirm at after ``failed``: where the long run's score puts the
    boundary (``calibrated_backoff``) when the search's steps point to a throughput
    ceiling above it, else ``backoff``; either way at most 4 % lower, or
    ``MAX_CALIBRATED_BACKOFF`` when it failed clearly (``CLEAR_FAILURE``: an error rate
    of 90 % at twice the capacity once took six 4 % back-offs of 600 s each)."""
    cap = MAX_CALIBRATED_BACKOFF if failed.score >= CLEAR_FAILURE else MAX_BACKOFF
    drop = backoff(failed.score, precision, cap)
    ceiling = throughput_ceiling(tuple(p for p in search if p.purpose != "confirm"))
    if ceiling is not None and ceiling > failed.rate and math.isfinite(failed.score):
        drop = calibrated_backoff(failed.rate, failed.score, ceiling, precision)
    rate = failed.rate * (1 - min(drop, cap))
    crossing = secant_boundary(failed, search)
    if crossing is not None:
        rate = min(rate, max(crossing, failed.rate * (1 - MAX_SECANT_BACKOFF)))
    held = [
        p.rate
        for p in search
        if p.purpose == "confirm" and p.valid and p.sustainable and p.rate < failed.rate
    ]
    if held and failed.rate > max(held) * (1 + precision) ** 2:
        # a long run held below: the boundary lies between the two, and a back-off past
        # the held rate would end the search there (rank-bigdelay: held 7,704, failed
        # 8,986 after a 15 % back-off; its boundary 8,743)
        rate = max(rate, math.sqrt(max(held) * failed.rate))
    return rate


SECANT_SPAN = 2 * MAX_BACKOFF
"""The failed confirmations a secant is drawn through must span at least this share of
the lowest one's rate: over less, run-to-run noise in their scores sets the slope."""
MAX_SECANT_BACKOFF = 0.5
"""A secant's back-off goes at most this far below the failed confirmation at once."""
SECANT_POINTS = 3
"""The secant is drawn through the lowest this many failed confirmations: the nearest
the boundary (a clear failure far above it, 13 times the bound, would set the slope)."""


def secant_boundary(failed: StepVerdict, search: Sequence[StepVerdict]) -> float | None:
    """Where the failed confirmations at ``failed``'s rate and above put the boundary:
    the least-squares line of the lowest ``SECANT_POINTS`` scores against their rates,
    where it reaches 1. None with fewer of them, a span under ``SECANT_SPAN``, or a slope that
    does not rise. Long runs that all failed by a similar margin over a wide span of
    rates say the score falls slowly with the rate (a stall every minute: the share of
    requests it makes late hardly depends on the rate), so the boundary lies far below,
    where 4 % back-offs would not reach it (an 800 ms stall every 60 s: confirmations
    from 1,025 down to 569 req/s failed at scores 1.7 to 1.25; the boundary was 292).
    Where latency rises steeply toward the boundary (a convex score), the line through
    points above it crosses 1 above the boundary, so the step does not overshoot."""
    points = [
        (p.rate, p.score)
        for p in search
        if p.purpose == "confirm"
        and p.valid
        and not p.sustainable
        and p.rate >= failed.rate
        and 1.0 < p.score < math.inf
    ]
    points = sorted(points)[:SECANT_POINTS]
    if len(points) < SECANT_POINTS:
        return None
    rates = [r for r, _ in points]
    if max(rates) - min(rates) < SECANT_SPAN * min(rates):
        return None
    mean_r = sum(rates) / len(rates)
    mean_s = sum(s for _, s in points) / len(points)
    sxx = sum((r - mean_r) ** 2 for r in rates)
    slope = sum((r - mean_r) * (s - mean_s) for r, s in points) / sxx
    if slope <= 0:
        return None
    return mean_r - (mean_s - 1.0) / slope
