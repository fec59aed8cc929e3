"""The multi-rate sweep: every rate of a grid, ascending, until the first that fails.

The grid is geometric from ``min_rate`` to ``max_rate`` with ratio ``1 + precision``
(``max_rate`` itself closes it), or the explicit ``rates``; the sweep starts at the
first grid rate at or above ``start_rate``. The capacity is the highest sustainable rate
below the first unsustainable one, and the boundary lies between the two. Simple and
exhaustive, and the most expensive: the baseline the other strategies are measured by.
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
    no_sustainable_rate,
    round_rate,
)
from ridgeline.search.base import StepPlan, register

if TYPE_CHECKING:
    from ridgeline.search.config import SweepConfig


def sweep_grid(cfg: SweepConfig) -> tuple[float, ...]:
    """The rates a sweep runs, ascending, from the first at or above ``start_rate``."""
    if cfg.rates is not None:
        grid = sorted(set(cfg.rates))
    else:
        assert cfg.max_rate is not None  # the config requires one of the two
        grid = [cfg.min_rate]
        while (
            rate := round_rate(grid[-1] * (1 + cfg.precision), cfg.precision, "down")
        ) < cfg.max_rate:
            grid.append(rate)
        grid.append(cfg.max_rate)
    return tuple(r for r in grid if r >= cfg.start_rate * (1 - 1e-9))


@dataclass(frozen=True, slots=True)
class SweepPolicy(BracketPolicy):
    grid: tuple[float, ...]
    duration_s: float

    def plan(self, state: Points) -> StepPlan | Finished:
        lo, hi = bracket(state.points)
        if hi is not None:
            if lo is None:
                return no_sustainable_rate(min(p.rate for p in state.points))
            return Finished(
                f"{hi.rate:g} req/s was the first unsustainable rate of the sweep; "
                f"the boundary lies in [{lo.rate:g}, {hi.rate:g}] req/s"
            )
        if len(state.points) >= len(self.grid):
            return Finished(
                f"every rate of the sweep held, up to {self.grid[-1]:g} req/s; "
                "raise max_rate (or add rates) to look higher"
            )
        return StepPlan(self.grid[len(state.points)], self.duration_s, "sweep")


@register("sweep")
class SweepStrategy(BracketSearch):
    """Every grid rate, ascending, stopping after the first unsustainable one."""

    def __init__(self, cfg: SweepConfig) -> None:
        self.grid = sweep_grid(cfg)
        policy = SweepPolicy(self.grid, cfg.step_duration_s)
        super().__init__("sweep", policy, cfg.budget())
