"""Stationary arrival specs: the rate is the same throughout the run.

``constant`` sends evenly spaced requests from 0; ``poisson`` draws independent
exponential gaps; ``gamma`` draws gamma gaps, bursty when ``cv > 1`` (production LLM
traces often show a gap CV well above 1, which loads a server very differently from
Poisson at the same mean rate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ridgeline._fields import Rate
from ridgeline.workload import _unit
from ridgeline.workload._unit import Floats


def _at_rate(
    rate: float,
    duration_s: float,
    seed: int,
    unit_points: Callable[[float, np.random.Generator], Floats],
) -> Floats:
    """A stationary schedule: the points of a unit-rate process below ``rate·duration_s``
    (drawn with a generator seeded by ``seed``), scaled to ``rate``."""
    total = rate * duration_s
    _unit.check_run(total, duration_s, seed)
    return _unit.within(unit_points(total, np.random.default_rng(seed)) / rate, duration_s)


class SpecModel(BaseModel):
    """Base of every arrival spec: frozen, and unknown parameters are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ConstantArrivals(SpecModel):
    """Evenly spaced sends, the first at 0."""

    kind: Literal["constant"] = "constant"
    rate: Rate = Field(description="requests per second")

    def schedule(self, duration_s: float, seed: int = 0) -> Floats:
        return _at_rate(self.rate, duration_s, seed, lambda total, _: _unit.even_points(total))

    def mean_rate(self, duration_s: float) -> float:
        return self.rate


class PoissonArrivals(SpecModel):
    """A Poisson process: independent exponential gaps of mean ``1/rate``."""

    kind: Literal["poisson"] = "poisson"
    rate: Rate = Field(description="mean requests per second")

    def schedule(self, duration_s: float, seed: int = 0) -> Floats:
        gaps = _unit.exponential_gaps
        return _at_rate(
            self.rate, duration_s, seed, lambda total, rng: _unit.renewal_points(total, rng, gaps)
        )

    def mean_rate(self, duration_s: float) -> float:
        return self.rate


class GammaArrivals(SpecModel):
    """A renewal process with gamma gaps of mean ``1/rate`` and coefficient of variation
    ``cv`` (shape ``1/cv²``): ``cv = 1`` is Poisson, ``cv > 1`` bursty, ``cv < 1`` regular."""

    kind: Literal["gamma"] = "gamma"
    rate: Rate = Field(description="mean requests per second")
    cv: float = Field(gt=0, allow_inf_nan=False, description="gap std / gap mean (1 = Poisson)")

    def schedule(self, duration_s: float, seed: int = 0) -> Floats:
        gaps = _unit.gamma_gaps(self.cv)
        return _at_rate(
            self.rate, duration_s, seed, lambda total, rng: _unit.renewal_points(total, rng, gaps)
        )

    def mean_rate(self, duration_s: float) -> float:
        return self.rate
