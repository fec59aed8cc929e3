"""The adaptive search (the Vanguard method): steps sized by the score, a secant near
the boundary, and one long confirmation at the end.

Every verdict says how far from the SLO boundary its step was (``score``: < 1 inside,
> 1 past). The search uses that distance three ways:

* **Where the boundary is** (``_model``). ``1/score`` falls roughly linearly toward the
  capacity (latency ∝ 1/(1 − ρ)), so a line through two measured points — the secant
  method, nearest points first, regula falsi across the bracket as the fallback —
  crosses 1 near the boundary. Its crossing, kept strictly inside the bracket [highest
  sustainable, lowest unsustainable] the verdicts have proved, is the boundary estimate,
  recorded after every step.
* **How far to step** (``_steps``). Outside a bracket a step goes toward the estimate,
  at most ×``max_growth``·gain; the score damps it as it nears 1 (when the score has
  visibly risen: dynamic batching makes latency fall at low load, and a latency floor
  makes a far score look near), and the gain halves whenever the direction reverses.
  Inside a bracket a step goes to the estimate, never slower than bisection.
* **How long to step.** A step whose predicted score is far from 1 (≤ ``explore_score``
  or ≥ its inverse) lasts ``explore_duration_s`` (half a step): far verdicts are clear.
  Once a failure bounds the search, a step lasts for ``decisive_requests`` at least
  (the requests that can show the percentile held), and on a noisy server (the last
  step's quarters disagreed: ``NOISY_SE``) for ``boundary_requests``: a p99 from a few
  hundred heavy-tailed samples runs optimistic. Before any failure every pass is
  provisional (a confirmation of full length follows), and a noisy quarter at 4 req/s
  (5 requests) says nothing: such a step once ran 375 s at 8 req/s.

Convergence: once the last ``estimate_window`` estimates agree (CV < ``cv_threshold``)
and a confirmation at ``c`` would close a bracket [c, hi] within ``precision``, the
search runs one step ``confirm_factor`` times as long at ``c = min(hi/(1 + ¾·precision),
est·(1 − precision/4))``: a little below both the lowest failure and the estimate, since
a long step sees more than a short one. ``c`` may lie above ``lo`` only when the model
has just predicted a step's score within ``trust_tolerance``. If the step holds, the
search has converged at ``c``; if not, the next confirmation backs off below it
(``confirmation.below_failed``). A back-off that holds converges if it is no larger than a
narrow failure's (4 %); one further below (a clear failure's, up to 15 %) is the
bracket's long-run floor, and the search narrows the bracket above it. Every converged
estimate has been held that long, within 4 % of a failure (or at the ceiling, or at a
held confirmation that a later failure could not back off past).

A failure that most of its step's quarters held (a stall of the host in one slice of
time), or one scoring below ``spike_score`` that contradicts a sustained rate at or above
it, is held back and re-tested once before it moves the bracket. Otherwise the latest
evidence wins: a failure drops the sustainable points at or above it, a success the
failures at or below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ridgeline.search._driver import (
    Bounds,
    Finished,
    Search,
    bracket,
    no_sustainable_rate,
    round_rate,
)
from ridgeline.search._model import estimate, predicted_score, spread
from ridgeline.search._steps import AdaptiveState, gain_after, next_rate
from ridgeline.search.base import StepPlan, StepVerdict, register
from ridgeline.search.confirmation import (
    MAX_BACKOFF,
    Decision,
    below_failed,
    decide,
    deciding,
)

if TYPE_CHECKING:
    from ridgeline.search.config import AdaptiveConfig


def stable(cfg: AdaptiveConfig, state: AdaptiveState) -> bool:
    """Whether the last ``estimate_window`` estimates agree within ``cv_threshold``."""
    recent = [e for e in state.estimates[-cfg.estimate_window :] if e is not None]
    return len(recent) == cfg.estimate_window and spread(tuple(recent)) < cfg.cv_threshold


def plan(cfg: AdaptiveConfig, state: AdaptiveState) -> StepPlan | Finished:
    """The next step (a held spike is ignored, so its re-test is the same step)."""
    if state.confirmed is not None:
        return _converged(state)
    if state.tally:
        return _confirm(cfg, state.tally[0].rate)
    if not state.points:
        return StepPlan(cfg.start_rate, cfg.explore_duration_s, "start")
    lo, hi = bracket(state.points)
    if lo is None and hi is not None and hi.rate <= cfg.min_rate:
        return no_sustainable_rate(hi.rate)
    if lo is not None and hi is None and cfg.max_rate is not None and lo.rate >= cfg.max_rate:
        return _confirm(cfg, cfg.max_rate)
    backoff = _backoff(cfg, state)
    if backoff is not None:
        return _confirm(cfg, backoff)
    est, settled = state.estimates[-1], stable(cfg, state)
    if lo is not None and hi is not None and hi.rate / lo.rate - 1 <= cfg.precision / 4:
        return _confirm(cfg, lo.rate)  # tighter than any estimate can matter
    if hi is not None and settled:
        c = _confirmation_rate(cfg, state, lo, hi, est)
        if c is not None:
            return _confirm(cfg, c)
    rate, purpose = next_rate(cfg, state, lo, hi, est, settled)
    # once a failure bounds the search, a step places the boundary: it needs the requests
    # that can show the percentile held; before, a pass is provisional (the search goes on
    # up, and a confirmation of full length follows), as in the binary search
    duration = cfg.placing_s(rate) if hi is not None else cfg.step_duration_s
    if hi is not None and state.points[-1].score_se >= NOISY_SE:  # sample the tail enough
        duration = max(duration, cfg.boundary_requests / rate)
    score = predicted_score(state.points, lo, hi, rate)
    if score <= cfg.explore_score or score >= 1 / cfg.explore_score:
        duration = cfg.explore_duration_s
    return StepPlan(rate, duration, purpose)


def _confirmation_rate(
    cfg: AdaptiveConfig,
    state: AdaptiveState,
    lo: StepVerdict | None,
    hi: StepVerdict,
    est: float | None,
) -> float | None:
    """Where to confirm, if anywhere yet: safely below the lowest failure and the
    estimate, ``min(hi/(1 + ¾·precision), est·(1 − precision/4))``, but never so far that
    [c, hi] is wider than precision (if the estimate lies lower, only once the bracket is
    that tight). Above ``lo`` only when the model has earned it, by predicting the last
    step's score within ``trust_tolerance``."""
    p = cfg.precision
    floor = round_rate(hi.rate / (1 + p), p, "up")
    c = hi.rate / (1 + 0.75 * p)
    if est is not None:
        c = min(c, est * (1 - p / 4))
    c = round_rate(c, p)
    if c < floor:  # the estimate lies lower: fine only if the bracket is already that tight
        if lo is None or lo.rate < floor:
            return None
        c = floor
    if not cfg.min_rate <= c < hi.rate:
        return None
    trusted = state.surprise is not None and state.surprise <= cfg.trust_tolerance
    return c if (lo is not None and c <= lo.rate) or trusted else None


def _backoff(cfg: AdaptiveConfig, state: AdaptiveState) -> float | None:
    """After a failed confirmation, the next confirmation lower (``below_failed``) — the
    boundary is below, and a long run is the evidence that counts there — at most
    ``MAX_BACKOFFS`` times in a row before searching again."""
    failed = 0
    for p in reversed(state.points):
        if p.purpose != "confirm" or p.sustainable:
            break
        failed += 1
    if not 0 < failed <= MAX_BACKOFFS:
        return None
    rate = round_rate(below_failed(state.points[-1], state.points, cfg.precision), cfg.precision)
    return rate if rate >= cfg.min_rate else None


MAX_BACKOFFS = 5
NOISY_SE = 0.05
"""A step whose quarters' scores spread by this (standard error of ln score) or more
comes from a noisy server: the next step near the boundary runs for
``boundary_requests`` requests at least."""


def _confirm(cfg: AdaptiveConfig, rate: float) -> StepPlan:
    duration = max(cfg.confirm_factor * cfg.step_duration_s, cfg.confirm_requests / rate)
    return StepPlan(rate, duration, "confirm")


def _converged(state: AdaptiveState) -> Finished:
    assert state.confirmed is not None
    c = state.confirmed
    _, hi = bracket(state.points)
    if hi is None:
        return Finished(
            f"confirmed {c.rate:g} req/s over {c.duration_s:g} s; it is max_rate, the "
            "ceiling: raise max_rate to search higher"
        )
    return Finished(
        f"confirmed {c.rate:g} req/s over {c.duration_s:g} s; "
        f"the boundary lies in [{c.rate:g}, {hi.rate:g}] req/s"
    )


def update(cfg: AdaptiveConfig, state: AdaptiveState, verdict: StepVerdict) -> AdaptiveState:
    """The state after a valid verdict."""
    asked = plan(cfg, state)
    confirming = (
        isinstance(asked, StepPlan) and asked.purpose == "confirm" and asked.rate == verdict.rate
    )
    if confirming:  # a marginal confirmation is run again; the majority decides
        runs = (*state.tally, verdict)
        contested = any(p.purpose == "confirm" and not p.sustainable for p in state.points)
        decision = decide(runs, cfg.confirm_margin, contested=contested)
        if decision is Decision.AGAIN:
            return replace(state, tally=runs)
        verdict, state = deciding(runs, decision), replace(state, tally=())
    if state.held is None and _is_spike(cfg, state.points, verdict):
        return replace(state, held=verdict)
    surprise = None
    if state.points:
        lo, hi = bracket(state.points)
        predicted = predicted_score(state.points, lo, hi, verdict.rate)
        if 0 < predicted < math.inf and verdict.score > 0:
            surprise = abs(math.log(verdict.score / predicted))
    points = _accept(state.points, verdict)
    move = 0
    if state.points and verdict.rate != state.points[-1].rate:
        move = 1 if verdict.rate > state.points[-1].rate else -1
    lo, hi = bracket(points)
    after = AdaptiveState(
        points=points,
        estimates=(*state.estimates, estimate(points, lo, hi)),
        widths=(*state.widths, math.log(hi.rate / lo.rate) if lo and hi else None),
        surprise=surprise,
        gain=gain_after(state.gain, state.direction, move),
        direction=move or state.direction,
        held=None,
    )
    if confirming:
        return replace(after, confirmed=_converged_at(cfg, after, verdict))
    return after


def _converged_at(
    cfg: AdaptiveConfig, state: AdaptiveState, verdict: StepVerdict
) -> StepVerdict | None:
    """The held confirmation the search has converged at, once ``verdict`` (a decided
    confirmation) is in ``state``; None: search on.

    A held confirmation converges when it lies within a narrow failure's back-off
    (``MAX_BACKOFF``, 4 %; rounding aside) of the lowest failure, or there is none (the
    ceiling). One that held after a clear failure's back-off (up to 15 %) may lie far
    below the boundary: it is the bracket's long-run floor, and the search narrows the
    bracket above it. A failed one converges at the highest confirmation held before it
    when the next back-off would fall to it or below: that rate has held a long run."""
    _, hi = bracket(state.points)
    if verdict.sustainable:
        near = hi is None or verdict.rate >= hi.rate * (1 - MAX_BACKOFF) * (1 - cfg.precision / 20)
        return verdict if near else None
    held = [p for p in state.points if p.purpose == "confirm" and p.sustainable]
    if not held:
        return None
    best = max(held, key=lambda p: p.rate)
    backoff = _backoff(cfg, state)
    return best if backoff is None or backoff <= best.rate else None


def _is_spike(cfg: AdaptiveConfig, points: tuple[StepVerdict, ...], verdict: StepVerdict) -> bool:
    """A failure to re-test once before it moves the bracket: one carried by a single
    slice of its run (``transient``), or one only a little past the boundary at a rate
    some sustained rate at or above it contradicts."""
    if verdict.sustainable:
        return False
    if verdict.purpose != "confirm" and transient(verdict):
        return True  # confirmations have their own rule: the majority of three
    if verdict.score >= cfg.spike_score:
        return False
    # only evidence at least as long counts against it: a longer run that fails where a
    # shorter one passed is the better evidence, not a spike
    return any(
        p.sustainable and p.rate >= verdict.rate and p.duration_s >= verdict.duration_s
        for p in points
    )


def transient(verdict: StepVerdict) -> bool:
    """A failed step most of whose quarters held: the failure sits in one slice of time
    (a stall of the host, a pause of the server), not in the rate. An overload past the
    boundary fails in most quarters; one at the boundary in about half."""
    held = sum(q <= 1.0 for q in verdict.quarters)
    return not verdict.sustainable and 2 * held > len(verdict.quarters) > 0


def _accept(points: tuple[StepVerdict, ...], verdict: StepVerdict) -> tuple[StepVerdict, ...]:
    """Add ``verdict``, dropping the points it contradicts (the latest evidence wins)."""
    if verdict.sustainable:
        kept = [p for p in points if p.sustainable or p.rate > verdict.rate]
    else:
        kept = [p for p in points if not p.sustainable or p.rate < verdict.rate]
    return (*kept, verdict)


def bounds(cfg: AdaptiveConfig, state: AdaptiveState) -> Bounds:
    """Capacity: the confirmed rate, else the bracket's low end. The interval: from there
    to the bracket's high end; without one, to the highest recent estimate above it."""
    lo, hi = bracket(state.points)
    low = lo.rate if lo is not None else None
    if state.confirmed is not None:
        low = state.confirmed.rate
    high = hi.rate if hi is not None else None
    if high is None and low is not None:
        recent = [e for e in state.estimates[-cfg.estimate_window :] if e is not None]
        top = max((e for e in recent if e > low), default=None)
        high = round_rate(top, cfg.precision) if top is not None else None
    return Bounds(capacity=low, low=low, high=high)


@dataclass(frozen=True, slots=True)
class AdaptivePolicy:
    cfg: AdaptiveConfig

    def plan(self, state: AdaptiveState) -> StepPlan | Finished:
        return plan(self.cfg, state)

    def update(self, state: AdaptiveState, verdict: StepVerdict) -> AdaptiveState:
        return update(self.cfg, state, verdict)

    def bounds(self, state: AdaptiveState) -> Bounds:
        return bounds(self.cfg, state)


@register("adaptive")
class AdaptiveStrategy(Search[AdaptiveState]):
    """The Vanguard method: score-sized steps, a secant near the boundary, a confirmation."""

    def __init__(self, cfg: AdaptiveConfig) -> None:
        super().__init__("adaptive", AdaptivePolicy(cfg), AdaptiveState(), cfg.budget())
