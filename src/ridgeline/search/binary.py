"""Binary search: bracket by doubling, then bisect (MLPerf LoadGen's FindPeakPerformance).

From ``start_rate`` the rate doubles until a step fails (or ``max_rate`` holds, which
ends the search at the ceiling); a start that fails halves instead, down to
``min_rate``. Then the bracket [highest sustainable, lowest unsustainable] is bisected
until ``(hi − lo)/lo ≤ precision``. The capacity is ``lo``; the boundary lies in
``[lo, hi]``. A bracketing step lasts ``step_duration_s``, a bisecting one long enough
for ``decisive_requests`` too (it places the boundary: a p99 judged on 40 requests is a
guess). It uses nothing but its verdicts' sustainability: robust to any score, blind to
how far a step was from the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ridgeline.search._driver import (
    BracketPolicy,
    BracketSearch,
    Finished,
    Points,
    bracket,
    clamp,
    no_sustainable_rate,
    round_rate,
)
from ridgeline.search.base import StepPlan, register

if TYPE_CHECKING:
    from ridgeline.search.config import BinaryConfig


@dataclass(frozen=True, slots=True)
class BinaryPolicy(BracketPolicy):
    cfg: BinaryConfig

    def plan(self, state: Points) -> StepPlan | Finished:
        cfg = self.cfg
        if not state.points:
            return self._step(cfg.start_rate, "bracket")
        lo, hi = bracket(state.points)
        if hi is None:
            assert lo is not None
            if cfg.max_rate is not None and lo.rate >= cfg.max_rate:
                return Finished(
                    f"max_rate {cfg.max_rate:g} req/s held, the ceiling; "
                    "raise max_rate to search higher"
                )
            return self._step(2 * lo.rate, "bracket")
        if lo is None:
            if hi.rate <= cfg.min_rate:
                return no_sustainable_rate(hi.rate)
            return self._step(hi.rate / 2, "bracket")
        if (hi.rate - lo.rate) / lo.rate <= cfg.precision:
            return Finished(
                f"the boundary lies in [{lo.rate:g}, {hi.rate:g}] req/s, "
                f"within precision {cfg.precision:g}"
            )
        middle = (lo.rate + hi.rate) / 2
        rounded = round_rate(middle, cfg.precision)
        inside = lo.rate < rounded < hi.rate
        return self._step(rounded if inside else middle, "bisect", exact=not inside)

    def _step(self, rate: float, purpose: str, *, exact: bool = False) -> StepPlan:
        """A step at ``rate``, rounded (unless ``exact``) and kept in [min_rate, max_rate]."""
        cfg = self.cfg
        exact = exact or rate == cfg.start_rate
        rate = clamp(rate if exact else round_rate(rate, cfg.precision), cfg.min_rate, cfg.max_rate)
        duration = cfg.placing_s(rate) if purpose == "bisect" else cfg.step_duration_s
        return StepPlan(rate, duration, purpose)


@register("binary")
class BinaryStrategy(BracketSearch):
    """Double until a step fails, then bisect the bracket to ``precision``."""

    def __init__(self, cfg: BinaryConfig) -> None:
        super().__init__("binary", BinaryPolicy(cfg), cfg.budget())
