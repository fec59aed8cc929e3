"""How far the adaptive search moves: the score-damped step, the gain, the bracket.

Outside a bracket (everything held so far: up; everything failed: down) a step moves by
at most ``cap = 1 + gain·(max_growth − 1)`` (×2 by default), and the gain halves each
time the direction reverses. The controller's step is that, damped in proportion once
the score is within ``damping_distance`` of 1 — within half of it when the score has not
visibly moved toward 1 since the previous step (×``SIGNAL``): a flat score is a latency
floor or noise, a falling one is dynamic batching at low load, and neither says the
boundary is near. With a boundary estimate the step aims just past it. Until the recent
estimates agree, a score that is still far lets the longer of the two steps win (a
convex score makes an early secant look near), a near one the shorter; once they agree,
the estimate alone decides.

Inside a bracket the step goes to the estimate (just past it once the estimates agree),
moved from the last step by at most the controller's factor but never less than a
bisection step; when two narrowings have not halved the bracket it bisects (geometric
middle). It keeps a quarter of the bracket from either end until the estimates agree,
a tenth after: the search is never much slower than bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ridgeline.search._driver import clamp, round_rate
from ridgeline.search.base import StepVerdict

if TYPE_CHECKING:
    from ridgeline.search.config import AdaptiveConfig

MIN_GAIN = 1 / 64
"""The gain never halves below this."""
SIGNAL = 1.1
"""A score says how near the boundary is only once it has moved toward 1 by this factor
since the neighbouring step: smaller moves are noise, or a latency floor."""


@dataclass(frozen=True, slots=True)
class AdaptiveState:
    points: tuple[StepVerdict, ...] = ()
    """Accepted evidence, in order (contradicted points dropped)."""
    estimates: tuple[float | None, ...] = ()
    """The boundary estimate after each accepted step (None without a line)."""
    widths: tuple[float | None, ...] = ()
    """ln(hi/lo) of the bracket after each accepted step (None without one)."""
    surprise: float | None = None
    """|ln(score / predicted score)| of the last accepted step (None: nothing predicted)."""
    gain: float = 1.0
    direction: int = 0
    """+1 after a step up, −1 after a step down, 0 before any move."""
    held: StepVerdict | None = None
    """A suspected spike awaiting its re-test."""
    confirmed: StepVerdict | None = None
    tally: tuple[StepVerdict, ...] = ()
    """Runs of a marginal confirmation so far, awaiting the majority (``confirmation``)."""


def next_rate(
    cfg: AdaptiveConfig,
    state: AdaptiveState,
    lo: StepVerdict | None,
    hi: StepVerdict | None,
    est: float | None,
    settled: bool,
) -> tuple[float, str]:
    """The next search step's rate and purpose (not a confirmation); ``settled``: the
    recent estimates agree."""
    p = cfg.precision
    if lo is not None and hi is not None:
        return _inside(cfg, state, lo, hi, est, settled)
    up = hi is None
    ref = lo if up else hi
    assert ref is not None
    direction = 1 if up else -1
    gain = gain_after(state.gain, state.direction, direction)
    cap = 1 + max(gain * (cfg.max_growth - 1), p)
    distance = cfg.damping_distance
    if not _informative(state.points, ref, up):
        distance /= 2  # the level alone is weaker evidence of nearness: damp only when close
    control = _factor(cfg, gain, ref.score, distance)
    if est is None:
        factor = control
    else:
        wanted = est * (1 + p / 4) / ref.rate if up else ref.rate / (est * (1 - p / 4))
        far = abs(1.0 - ref.score) >= distance
        factor = min(wanted if settled else (max if far else min)(wanted, control), cap)
    rate = ref.rate * factor if up else ref.rate / factor
    return clamp(round_rate(rate, p), cfg.min_rate, cfg.max_rate), "bracket"


def _inside(
    cfg: AdaptiveConfig,
    state: AdaptiveState,
    lo: StepVerdict,
    hi: StepVerdict,
    est: float | None,
    settled: bool,
) -> tuple[float, str]:
    width = math.log(hi.rate / lo.rate)
    known = [w for w in state.widths[-3:] if w is not None]
    # narrowed twice, but not halved: regula falsi creeping from one end
    stalled = len(known) == 3 and known[0] >= known[1] >= known[2] > known[0] / 2
    if est is None or stalled:
        rate, purpose = math.sqrt(lo.rate * hi.rate), "bisect"
    else:
        last = state.points[-1]
        rate = est * (1 + cfg.precision / 4) if settled else est
        direction = 1 if rate > last.rate else -1
        gain = gain_after(state.gain, state.direction, direction)
        limit = max(_factor(cfg, gain, last.score, cfg.damping_distance), math.exp(width / 2))
        rate = min(max(rate, last.rate / limit), last.rate * limit)
        purpose = "probe"
    margin = math.exp(width / (10 if settled else 4))
    rate = min(max(rate, lo.rate * margin), hi.rate / margin)
    rounded = round_rate(rate, cfg.precision)
    return (rounded if lo.rate < rounded < hi.rate else rate), purpose


def _factor(cfg: AdaptiveConfig, gain: float, score: float, distance: float) -> float:
    """The controller's largest step factor: the gain, damped in proportion once ``score``
    is within ``distance`` of 1, and never below ``1 + precision``."""
    damp = min(1.0, abs(1.0 - score) / distance)
    return 1.0 + max(gain * (cfg.max_growth - 1.0) * damp, cfg.precision)


def _informative(points: tuple[StepVerdict, ...], ref: StepVerdict, up: bool) -> bool:
    """Whether ``ref``'s score says how near the boundary is: it must have moved toward 1
    since the neighbouring point on the far side (True when there is none). A score that
    falls as load rises (dynamic batching at low load) or does not move at all says
    nothing of the distance, so it does not damp the step."""
    if up:
        side = [p for p in points if p.sustainable and p.rate < ref.rate]
        neighbour = max(side, key=lambda p: p.rate) if side else None
        return neighbour is None or ref.score > SIGNAL * neighbour.score
    side = [p for p in points if not p.sustainable and p.rate > ref.rate]
    neighbour = min(side, key=lambda p: p.rate) if side else None
    return neighbour is None or neighbour.score > SIGNAL * ref.score


def gain_after(gain: float, direction: int, move: int) -> float:
    """The gain once a step in direction ``move`` follows one in ``direction``: halved
    when it reverses, never below ``MIN_GAIN``."""
    if move and direction and move != direction:
        return max(gain / 2, MIN_GAIN)
    return gain
