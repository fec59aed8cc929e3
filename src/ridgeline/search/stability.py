"""The stability check: one long constant-rate step that confirms or refutes a rate.

Run after another strategy to ask "does its estimate really hold?": a slow leak, a
queue that creeps up, a GPU that throttles when warm, show in a step five times as long
(``duration_s``, default ``5 × step_duration_s``) where a short one passed. The capacity
is ``rate`` when the step is sustainable, else None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ridgeline.search._driver import Bounds, Finished, Search, no_sustainable_rate
from ridgeline.search.base import StepPlan, StepVerdict, register

if TYPE_CHECKING:
    from ridgeline.search.config import StabilityConfig


@dataclass(frozen=True, slots=True)
class StabilityState:
    verdict: StepVerdict | None = None


@dataclass(frozen=True, slots=True)
class StabilityPolicy:
    rate: float
    duration_s: float

    def plan(self, state: StabilityState) -> StepPlan | Finished:
        held = state.verdict
        if held is None:
            return StepPlan(self.rate, self.duration_s, "stability")
        if not held.sustainable:
            return no_sustainable_rate(held.rate)
        return Finished(f"{held.rate:g} req/s held for {held.duration_s:g} s ({held.state})")

    def update(self, state: StabilityState, verdict: StepVerdict) -> StabilityState:
        return StabilityState(verdict)

    def bounds(self, state: StabilityState) -> Bounds:
        held = state.verdict
        if held is None:
            return Bounds(None, None, None)
        if held.sustainable:
            return Bounds(held.rate, held.rate, None)
        return Bounds(None, None, held.rate)


@register("stability")
class StabilityStrategy(Search[StabilityState]):
    """One long step at ``rate``: capacity ``rate`` if it holds, else None."""

    def __init__(self, cfg: StabilityConfig) -> None:
        policy = StabilityPolicy(cfg.rate, cfg.duration_s)
        super().__init__("stability", policy, StabilityState(), cfg.budget())
