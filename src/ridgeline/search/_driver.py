"""The shell every strategy shares: the ledger, the budgets and the invalid-step rule.

A strategy is a *policy* — three pure functions over its own frozen state — held by
``Search``, which keeps what every strategy keeps alike:

* the trajectory: every verdict observed, in order, valid or not;
* ``steps`` and ``test_seconds``: the count and the summed durations of those verdicts;
* invalid verdicts (the generator could not hold the step) are never shown to the
  policy, so its next proposal is the same step again; a second invalid verdict in a
  row ends the search, unconverged, with a reason that says how to fix it;
* the budgets ``max_steps`` and ``max_test_seconds`` end the search unconverged, with
  the policy's best estimate so far.

``Search.propose`` is a pure function of that state: asking twice gives the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from ridgeline.search.base import CapacityEstimate, StepPlan, StepVerdict

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Finished:
    """A policy's answer when it has no step left to propose."""

    reason: str
    converged: bool = True


@dataclass(frozen=True, slots=True)
class Bounds:
    """A policy's estimate: the capacity and the interval the boundary lies in."""

    capacity: float | None
    low: float | None
    high: float | None


class Policy(Protocol[S]):
    """A strategy's decisions, as pure functions of its state."""

    def plan(self, state: S) -> StepPlan | Finished:
        """The next step, or why the search is over."""
        ...

    def update(self, state: S, verdict: StepVerdict) -> S:
        """The state after a valid verdict."""
        ...

    def bounds(self, state: S) -> Bounds:
        """The estimate the state supports."""
        ...


@dataclass(frozen=True, slots=True)
class Budget:
    max_steps: int
    max_test_seconds: float | None


class Search(Generic[S]):
    """The ask/tell object around a policy (meets ``ridgeline.search.base.Strategy``)."""

    name: str

    def __init__(self, name: str, policy: Policy[S], state: S, budget: Budget) -> None:
        self.name = name
        self._policy = policy
        self._state = state
        self._budget = budget
        self._trajectory: tuple[StepVerdict, ...] = ()
        self._invalid_in_a_row = 0

    @property
    def state(self) -> S:
        """The policy's state (read-only; the policy returns a new one per verdict)."""
        return self._state

    def propose(self) -> StepPlan | None:
        decision = self._decide()
        return decision if isinstance(decision, StepPlan) else None

    def observe(self, verdict: StepVerdict) -> None:
        self._trajectory = (*self._trajectory, verdict)
        if not verdict.valid:
            self._invalid_in_a_row += 1
            return
        self._invalid_in_a_row = 0
        self._state = self._policy.update(self._state, verdict)

    def result(self) -> CapacityEstimate:
        decision = self._decide()
        bounds = self._policy.bounds(self._state)
        finished = decision if isinstance(decision, Finished) else None
        return CapacityEstimate(
            capacity_rps=bounds.capacity,
            ci_low=bounds.low,
            ci_high=bounds.high,
            strategy=self.name,
            steps=len(self._trajectory),
            test_seconds=self._test_seconds(),
            converged=finished is not None and finished.converged,
            reason=finished.reason if finished is not None else "",
            trajectory=self._trajectory,
        )

    def _test_seconds(self) -> float:
        return math.fsum(v.duration_s for v in self._trajectory)

    def _decide(self) -> StepPlan | Finished:
        if self._invalid_in_a_row >= 2:
            rate = self._trajectory[-1].rate
            return Finished(
                f"the load generator could not hold {rate:g} req/s (two tries); "
                "add generator processes or lower the rate",
                converged=False,
            )
        decision = self._policy.plan(self._state)
        if isinstance(decision, Finished):
            return decision
        steps, limit = len(self._trajectory), self._budget.max_steps
        if steps >= limit:
            return Finished(
                f"stopped by the step budget (max_steps={limit}) before converging; "
                "raise max_steps or loosen precision",
                converged=False,
            )
        spent, seconds = self._test_seconds(), self._budget.max_test_seconds
        if seconds is not None and spent + decision.duration_s > seconds:
            return Finished(
                f"stopped by the time budget (max_test_seconds={seconds:g}): {spent:g} s "
                f"spent and the next step needs {decision.duration_s:g} s; raise "
                "max_test_seconds, shorten step_duration_s or loosen precision",
                converged=False,
            )
        return decision


def no_sustainable_rate(rate: float) -> Finished:
    """The answer when even the lowest rate tried is unsustainable."""
    return Finished(f"no sustainable rate at or above {rate:g} req/s")


def round_rate(
    rate: float, precision: float, direction: Literal["nearest", "down", "up"] = "nearest"
) -> float:
    """``rate`` to the significant digits the precision needs, and two more (4 for 0.02):
    readable proposals, and a rounding error 20× finer than the precision."""
    digits = 2 + max(1, math.ceil(-math.log10(precision)))
    if direction != "nearest":
        unit = 10.0 ** (math.floor(math.log10(rate)) - digits + 1)
        # 1e-9: 80 × 1.02 is 81.6, not 81.59
        whole = (
            math.floor(rate / unit + 1e-9) if direction == "down" else math.ceil(rate / unit - 1e-9)
        )
        rate = whole * unit
    return float(f"{rate:.{digits}g}")


def clamp(rate: float, low: float, high: float | None) -> float:
    return max(low, rate if high is None else min(high, rate))


def bracket(points: tuple[StepVerdict, ...]) -> tuple[StepVerdict | None, StepVerdict | None]:
    """(the highest sustainable point below the lowest unsustainable one, that one).

    Each is None when no such point exists. Sustainable points above the lowest
    unsustainable one are contradicted and ignored."""
    failed = [p for p in points if not p.sustainable]
    hi = min(failed, key=lambda p: p.rate) if failed else None
    held = [p for p in points if p.sustainable and (hi is None or p.rate < hi.rate)]
    lo = max(held, key=lambda p: p.rate) if held else None
    return lo, hi


@dataclass(frozen=True, slots=True)
class Points:
    """The state of a bracketing search: every valid verdict, in order."""

    points: tuple[StepVerdict, ...] = ()


class BracketPolicy:
    """``update`` and ``bounds`` of a policy over ``Points`` whose estimate is the
    bracket's low end, the boundary inside the bracket (the binary search, the sweep)."""

    __slots__ = ()

    def update(self, state: Points, verdict: StepVerdict) -> Points:
        return Points((*state.points, verdict))

    def bounds(self, state: Points) -> Bounds:
        lo, hi = bracket(state.points)
        return Bounds(
            capacity=lo.rate if lo else None,
            low=lo.rate if lo else None,
            high=hi.rate if hi else None,
        )


class BracketSearch(Search[Points]):
    """A bracketing strategy (the binary search, the sweep): its policy over ``Points``,
    from no points."""

    def __init__(self, name: str, policy: Policy[Points], budget: Budget) -> None:
        super().__init__(name, policy, Points(), budget)
