"""Time-varying arrival specs: ``ramp``, ``steps`` and ``diurnal``.

Each defines its cumulative rate ``Λ(t)`` (expected arrivals by ``t``) and its inverse in
closed form or by bracketed Newton iteration; a unit-rate process mapped through ``Λ⁻¹``
gives the schedule exactly (see ``_unit``): Poisson by default, evenly spaced in ``Λ``
with ``poisson: false`` (then the first arrival is at 0, like ``constant``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Literal

import numpy as np
from pydantic import AliasChoices, Field, field_validator, model_validator

from ridgeline._fields import NonNegativeRate, Rate
from ridgeline.workload import _unit
from ridgeline.workload._unit import Floats
from ridgeline.workload.stationary import SpecModel

_TABLE_POINTS = 4097
"""Points tabulating one diurnal period, for Newton's first guess."""


class _Varying(SpecModel, ABC):
    """A rate that changes with time, realised exactly by time-rescaling."""

    poisson: bool = Field(
        True, description="Poisson arrivals (true) or evenly spaced in expected count (false)"
    )

    @abstractmethod
    def _cumulative(self, t: Floats, duration_s: float) -> Floats:
        """Λ(t): expected arrivals in ``[0, t)``."""

    @abstractmethod
    def _inverse(self, s: Floats, duration_s: float) -> Floats:
        """Λ⁻¹(s), for ``0 ≤ s < Λ(duration_s)``."""

    def schedule(self, duration_s: float, seed: int = 0) -> Floats:
        total = self._total(duration_s)
        _unit.check_run(total, duration_s, seed)
        points = _unit.unit_points(total, seed, self.poisson)
        return _unit.within(self._inverse(points, duration_s), duration_s)

    def mean_rate(self, duration_s: float) -> float:
        _unit.check_duration(duration_s)
        return self._total(duration_s) / duration_s

    def _total(self, duration_s: float) -> float:
        return float(self._cumulative(np.array([duration_s]), duration_s)[0])


class RampArrivals(_Varying):
    """A rate moving linearly from ``start_rate`` at 0 to ``end_rate`` at the run's end."""

    kind: Literal["ramp"] = "ramp"
    start_rate: NonNegativeRate = Field(
        validation_alias=AliasChoices("start_rate", "from"), description="requests/s at 0"
    )
    end_rate: NonNegativeRate = Field(
        validation_alias=AliasChoices("end_rate", "to"), description="requests/s at the end"
    )

    @model_validator(mode="after")
    def _not_idle(self) -> RampArrivals:
        if self.start_rate == 0 and self.end_rate == 0:
            raise ValueError("start_rate and end_rate are both 0; make one of them > 0")
        return self

    def _cumulative(self, t: Floats, duration_s: float) -> Floats:
        slope = (self.end_rate - self.start_rate) / duration_s
        return self.start_rate * t + 0.5 * slope * t * t

    def _inverse(self, s: Floats, duration_s: float) -> Floats:
        # The root of start·t + slope·t²/2 = s, in the form that is stable for any slope.
        slope = (self.end_rate - self.start_rate) / duration_s
        root = np.sqrt(np.maximum(self.start_rate**2 + 2.0 * slope * s, 0.0))
        denominator = self.start_rate + root
        safe = np.where(denominator > 0, denominator, 1.0)
        return np.where(denominator > 0, 2.0 * s / safe, 0.0)


class StepArrivals(_Varying):
    """A piecewise-constant rate: ``rates[i]`` for ``step_s`` seconds each, then the last
    rate for the rest of the run."""

    kind: Literal["steps"] = "steps"
    rates: tuple[NonNegativeRate, ...] = Field(
        min_length=1, description="requests/s of each step, in order (10/20/40 on the CLI)"
    )
    step_s: float = Field(
        gt=0,
        allow_inf_nan=False,
        validation_alias=AliasChoices("step_s", "step"),
        description="seconds each step lasts",
    )

    @field_validator("rates", mode="before")
    @classmethod
    def _split_slashes(cls, value: Any) -> Any:
        return value.split("/") if isinstance(value, str) else value

    @model_validator(mode="after")
    def _not_idle(self) -> StepArrivals:
        if not any(self.rates):
            raise ValueError("every step rate is 0; make at least one of them > 0")
        return self

    def _starts(self) -> tuple[Floats, Floats]:
        """Each step's rate, and Λ at each step's start."""
        rates = np.asarray(self.rates, dtype=np.float64)
        starts = self.step_s * np.concatenate(([0.0], np.cumsum(rates[:-1])))
        return rates, starts

    def _cumulative(self, t: Floats, duration_s: float) -> Floats:
        rates, starts = self._starts()
        step = np.minimum(np.floor(t / self.step_s), len(rates) - 1).astype(np.intp)
        return starts[step] + rates[step] * (t - step * self.step_s)

    def _inverse(self, s: Floats, duration_s: float) -> Floats:
        rates, starts = self._starts()
        # side="right" skips zero-rate steps: they add nothing to Λ.
        step = np.searchsorted(starts, s, side="right") - 1
        return step * self.step_s + (s - starts[step]) / rates[step]


class DiurnalArrivals(_Varying):
    """A sinusoidal rate ``rate·(1 + amplitude·sin(2π(t + phase_s)/period_s))``."""

    kind: Literal["diurnal"] = "diurnal"
    rate: Rate = Field(description="mean requests per second over a whole period")
    amplitude: float = Field(ge=0, lt=1, description="swing as a fraction of rate, in [0, 1)")
    period_s: float = Field(
        gt=0,
        allow_inf_nan=False,
        validation_alias=AliasChoices("period_s", "period"),
        description="seconds per cycle",
    )
    phase_s: float = Field(
        0.0,
        allow_inf_nan=False,
        validation_alias=AliasChoices("phase_s", "phase"),
        description="seconds the cycle is shifted by",
    )

    def _rate(self, t: Floats) -> Floats:
        omega = 2.0 * math.pi / self.period_s
        return self.rate * (1.0 + self.amplitude * np.sin(omega * (t + self.phase_s)))

    def _cumulative(self, t: Floats, duration_s: float) -> Floats:
        omega = 2.0 * math.pi / self.period_s
        swing: Floats = np.cos(omega * self.phase_s) - np.cos(omega * (t + self.phase_s))
        return self.rate * (t + self.amplitude / omega * swing)

    def _inverse(self, s: Floats, duration_s: float) -> Floats:
        # Λ(t + period) = Λ(t) + rate·period, so one period tabulated finely gives a
        # close first guess; Newton then polishes it, kept inside the bracket that
        # |Λ(t) - rate·t| ≤ rate·amplitude·period/π gives.
        per_period = self.rate * self.period_s
        grid = np.linspace(0.0, self.period_s, _TABLE_POINTS)
        table = self._cumulative(grid, duration_s)
        cycles = np.floor(s / per_period)
        guess = cycles * self.period_s + np.interp(s - cycles * per_period, table, grid)
        reach = self.amplitude * self.period_s / math.pi
        lo = np.maximum(s / self.rate - reach, 0.0)
        hi = s / self.rate + reach
        cumulative = lambda t: self._cumulative(t, duration_s)  # noqa: E731
        return _unit.invert_monotone(cumulative, self._rate, s, guess, lo, hi)
