"""Sequential confirmations: a confirmation that ends as soon as its outcome is decided.

A confirmation is a long run at the estimate (10,000 requests for a p99: 100 expected
beyond the bound). Far inside the SLO its pass is plain long before that, and far
outside its failure; only a rate near the boundary needs the whole run. Run in *looks*
instead — the first ``MIN_LOOK_S`` at least, each later one doubling the run so far,
every look judged on all the requests since the start (``Run.longer`` pools them) —
it stops at the first look that decides:

- **held**: the count beyond the bound, in independent requests (``dispersion``:
  clustered late requests count as one), is so low that a server right at the
  boundary would give it at most ``α_j`` of the time, where look ``j`` may spend
  ``α_j = (1 − confidence)/2^(j+1)`` (their sum stays within ``1 − confidence``: the
  error of stopping at whichever look comes first is bounded as for one look), and the
  errors likewise under their bound;
- **failed**: the failure is decided (``StepVerdict.decided``: too many beyond the
  bound, or errors, to be chance; for a confirmation, worth the independent requests it
  needs).

A look that decides neither runs on; at the confirmation's full length the usual rule
judges it (``confirmation.decide``). ``MIN_LOOK_S`` keeps a pass from standing on a
stretch shorter than the slow behaviour servers commonly have (a GC pause or a
checkpoint a minute); a run as long as the clusters the probe has seen ask for is
required too (``orchestrator._covering``).
"""

from __future__ import annotations

import math
from enum import StrEnum

from ridgeline.health.sampling import binomial_cdf
from ridgeline.search.base import StepVerdict
from ridgeline.search.confirmation import boundary_chance

MIN_LOOK_S = 60.0
"""No look decides a pass on less than a minute of load."""


class Look(StrEnum):
    HELD = "held"
    FAILED = "failed"
    MORE = "more"


def look_level(look: int, confidence: float) -> float:
    """The error look ``look`` (from 0) may spend: ``(1 − confidence)/2^(look+1)``."""
    return (1.0 - confidence) / 2.0 ** (look + 1)


def look_lengths(first_s: float, full_s: float) -> list[float]:
    """The run's length at each look: ``first_s``, doubling, ending at ``full_s``."""
    if first_s >= full_s:
        return [full_s]
    lengths = [first_s]
    while lengths[-1] * 2 < full_s:
        lengths.append(lengths[-1] * 2)
    return [*lengths, full_s]


def first_look_s(rate: float, share: float, confidence: float, cover_s: float) -> float:
    """The first look's length at ``rate``: a minute (``MIN_LOOK_S``), the clusters' cover
    (``cover_s``), or as long as a pass with nothing beyond the bound needs at the first
    look's level (``share``: the percentile's, 0.01 for a p99), whichever is longest."""
    if 0.0 < share < 1.0:
        zero_beyond = math.log(look_level(0, confidence)) / math.log1p(-share)
    else:
        zero_beyond = 0.0
    return max(MIN_LOOK_S, cover_s, zero_beyond / rate)


def sure_look_s(
    rate: float, share: float, level: float, dispersion: float, least_s: float
) -> float:
    """The shortest look at ``rate`` that could pass surely at ``level``: a minute, the
    ``least_s`` the SLO needs to decide (its errors' bound too), and requests enough that
    none beyond the bound is that rare at the boundary, each worth ``1/dispersion`` of an
    independent one (late requests seen coming ``dispersion`` together)."""
    zero_beyond = math.log(level) / math.log1p(-share) if 0.0 < share < 1.0 else 0.0
    return max(MIN_LOOK_S, least_s, zero_beyond * max(dispersion, 1.0) / rate)


def sure_latency(v: StepVerdict, level: float) -> bool:
    """Whether ``v`` held its percentile so plainly that a server at the boundary would
    do as well at most ``level`` of the time (``confirmation.boundary_chance``)."""
    chance = boundary_chance(v) if v.valid else None
    return chance is not None and chance <= level


def sure_pass(v: StepVerdict, level: float, errors: int, answered: int, max_error: float) -> bool:
    """``sure_latency``, and its errors as unlikely under their bound (``max_error``)."""
    if not sure_latency(v, level):
        return False
    if max_error <= 0.0:
        return errors == 0
    return answered > 0 and binomial_cdf(errors, answered, max_error) <= level


def judge_look(
    v: StepVerdict,
    look: int,
    confidence: float,
    errors: int,
    answered: int,
    max_error: float,
) -> Look:
    """What look ``look`` of a confirmation decides (module docstring)."""
    if not v.valid:
        return Look.MORE
    if not v.sustainable and v.decided:
        return Look.FAILED
    if sure_pass(v, look_level(look, confidence), errors, answered, max_error):
        return Look.HELD
    return Look.MORE
