"""The ask/tell contract of every search strategy, and the data it exchanges.

A strategy proposes the next step (``propose``), is told the step's assessed result
(``observe``), and reports its estimate (``result``). It never runs load itself: the
orchestrator runs the step — over the network in real time or against a simulated server
in virtual time — and the health engine assesses it.

Strategies register themselves by kind (``@register("adaptive")`` on the class, whose
constructor takes its config) in ``STRATEGIES``, a ``Registry``; ``create`` builds the
one a config's ``kind`` names. This module never imports a strategy: ``ridgeline.search``
imports them, so they register.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ridgeline._registry import Registry
from ridgeline.health.state import HealthState


@dataclass(frozen=True, slots=True)
class StepPlan:
    rate: float
    """Offered rate, requests/s."""
    duration_s: float
    purpose: str = ""
    """Why this step: bracket, bisect, probe, confirm, sweep, stability, warmup."""


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """A step's assessed result, as a strategy sees it."""

    rate: float
    duration_s: float
    state: HealthState
    """The step's state after hysteresis over its (steady) windows."""
    score: float
    """Combined distance to the SLO boundary over the step: < 1 inside, > 1 past."""
    valid: bool = True
    """False when the generator could not hold the step: never an estimate."""
    achieved_rps: float = 0.0
    p99_ms: float | None = None
    excluded_warmup_s: float = 0.0
    reason: str = ""
    purpose: str = ""
    score_se: float = 0.0
    """Standard error of ln(score): how far another run of the same length could land."""
    quarters: tuple[float, ...] = ()
    """The scores of the step's consecutive quarters, each judged like the whole step
    (empty when a quarter has no finite score)."""
    samples: int = 0
    """Requests the verdict judged (sent, scheduled after steady state)."""
    beyond: int = 0
    """Of those, how many took longer than the SLO's tightest percentile bound."""
    allowed: float = 0.0
    """How many the percentile allows: samples × (1 − q); a p99 on 300 requests allows
    3. ``beyond`` near ``allowed`` on few samples is a coin toss, not a verdict."""
    judged: str = ""
    """The percentile bound the step was judged on (``p99``, ``itl_p99``): the SLO's
    tightest, whose ``beyond`` and ``interval_ms`` these are."""
    interval_ms: tuple[float, float] | None = None
    """The judged percentile's confidence interval (distribution-free, from order
    statistics), ms; ±inf at an end too few requests reach."""
    decided: bool = True
    """False when a failure rests on too few requests to tell from chance, or a
    confirmation's clustered requests are worth too few independent ones: the probe
    runs the step again, long enough to decide (``health.sampling``)."""
    dispersion: float = 1.0
    """How many requests one independent one was worth (``sampling.dispersion``): 1
    unless those beyond the bound came in clusters."""
    pooled_s: float = 0.0
    """Seconds of earlier runs at this rate judged with this one (an undecided step gets
    more of the same): the run itself lasted ``duration_s − pooled_s``."""
    shortfall: float = 1.0
    """An undecided confirmation's effective requests short of what it needs (a
    ratio ≥ 1): how much longer it must run."""

    @property
    def sustainable(self) -> bool:
        return self.valid and self.state.sustainable


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    capacity_rps: float | None
    """Highest sustainable rate found; None when none at or above the lowest rate tried."""
    ci_low: float | None
    ci_high: float | None
    strategy: str
    steps: int
    test_seconds: float
    converged: bool
    reason: str = ""
    trajectory: tuple[StepVerdict, ...] = field(default_factory=tuple)


class Strategy(Protocol):
    name: str

    def propose(self) -> StepPlan | None:
        """The next step to run, or None when the search is over."""
        ...

    def observe(self, verdict: StepVerdict) -> None:
        """The assessed result of the step last proposed."""
        ...

    def result(self) -> CapacityEstimate:
        """The estimate so far (final once ``propose`` returned None)."""
        ...


class _Configured(Protocol):
    @property
    def kind(self) -> str: ...


STRATEGIES: Registry[Callable[[Any], Strategy]] = Registry("search strategy")
"""Each strategy class (built from its config) by its kind."""
_T = TypeVar("_T", bound=Callable[[Any], Strategy])


def register(kind: str) -> Callable[[_T], _T]:
    """Register a strategy class (built from its config) under ``kind``."""

    def add(cls: _T) -> _T:
        STRATEGIES.add(kind, cls)
        return cls

    return add


def registered() -> tuple[str, ...]:
    """The kinds of every registered strategy, sorted."""
    return STRATEGIES.names()


def create(cfg: _Configured) -> Strategy:
    """A fresh strategy for ``cfg``, the one registered under ``cfg.kind``."""
    return STRATEGIES.get(cfg.kind)(cfg)
