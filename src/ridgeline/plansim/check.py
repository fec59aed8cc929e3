"""A plan checked in the simulator before it is returned: the planner's bound is a model
(the wait for a free instance assumes Poisson arrivals; fill, wait and execution are
added as if each were at its worst), so every plan is served in virtual time, under
Poisson arrivals and under a recorded trace's, and tightened until the simulation meets
the SLO.

``checked_plan`` plans at the demand; simulates the plan under each arrival process
(``CheckConfig.arrivals``) for ``requests`` requests; and if any run has ``violations``
or more of its requests late or dropped, or its answered p99 past the SLO, plans again
for more: the demand the instances are sized for rises by ``step`` (the plan's demand,
what the server expects and its controller watches, stays the real one). That repeats
at most ``max_rounds`` times. The first plan that holds is returned with every run that
judged it; when none holds, or the GPUs run out first, ``PlanCheckFailed`` says so with
the best plan found and its runs, so nothing measured is lost.

A trace's bursts are what the rise buys: the bundled production trace, time-scaled to a
mean rate, has seconds at three times the mean and seconds with no arrival, which a plan
sized for the mean cannot serve within a tight SLO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ridgeline.errors import InfeasiblePlan, PlanCheckFailed
from ridgeline.pipeline.choices import ALL_FEATURES, DEFAULT_OPTIONS
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.planned import to_plan
from ridgeline.pipeline.planner import Features, PlannerOptions, PlanResult, plan_pipeline
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.pipeline.spec import PipelineSpec
from ridgeline.plansim.api import SimConfig, arrival_schedule, simulate_plan
from ridgeline.plansim.result import PlanSimResult
from ridgeline.workload.traces import bundled_trace_path

BUNDLED_TRACE = "azure_llm_2023_code"


@dataclass(frozen=True, slots=True)
class CheckConfig:
    arrivals: tuple[str, ...] = ("poisson",)
    """Each plan is simulated under each: an arrival spec (``workload.arrivals``:
    ``poisson``, ``gamma:cv=2``) or ``trace:NAME`` (a bundled trace, ``trace:BUNDLED``
    for the one shipped) / ``trace:PATH`` (a trace file). Add the trace your traffic
    looks like: the bundled one, time-scaled, needs about 8 times the mean's capacity."""
    requests: int = 20_000
    """Requests per simulated run: 100 expected past the bound at 0.5 %."""
    violations: float = 0.005
    """A run with this share of its requests late or dropped, or more, fails the plan."""
    step: float = 1.25
    """How much more demand the next plan is sized for when one fails."""
    max_rounds: int = 8
    seed: int = 1


@dataclass(frozen=True, slots=True)
class CheckedPlan:
    result: PlanResult
    """The plan as the MILP made it (sized for ``sized_for_rps``)."""
    plan: Plan
    """The Plan to serve: ``result``'s, at the real demand."""
    sized_for_rps: float
    runs: tuple[PlanSimResult, ...]
    """The simulated runs that passed it, one per arrival process."""
    rounds: tuple[tuple[float, str], ...] = field(default=())
    """Each plan tried: the demand it was sized for and how it fared."""

    @property
    def headroom(self) -> float:
        """The demand the plan is sized for over the real demand."""
        demand = self.plan.demand_rps
        return self.sized_for_rps / demand if demand else 1.0


def checked_plan(
    spec: PipelineSpec,
    table: ProfileTable,
    available: Mapping[str, float],
    features: Features = ALL_FEATURES,
    options: PlannerOptions = DEFAULT_OPTIONS,
    check: CheckConfig | None = None,
) -> CheckedPlan:
    """The least plan that the MILP returns and the simulator passes (module docstring);
    ``InfeasiblePlan`` if even the first cannot be made, ``PlanCheckFailed`` if none
    passes."""
    check = check or CheckConfig()
    demand = spec.demand_rps
    sized = demand
    rounds: list[tuple[float, str]] = []
    best: CheckedPlan | None = None
    for _ in range(check.max_rounds):
        try:
            result = plan_pipeline(
                spec.model_copy(update={"demand_rps": sized}), table, available, features, options
            )
        except InfeasiblePlan as e:
            if best is None and sized == demand:
                raise
            rounds.append((sized, f"no plan: {e}"))
            break
        plan = to_plan(result).model_copy(update={"demand_rps": demand})
        runs = tuple(_simulate(plan, table, demand, a, check) for a in check.arrivals)
        failing = [r for r in runs if not _holds(r, check)]
        verdict = "held" if not failing else "; ".join(_fault(r) for r in failing)
        rounds.append((sized, verdict))
        here = CheckedPlan(result, plan, sized, runs, tuple(rounds))
        if not failing:
            return here
        if best is None or _worst(runs) < _worst(best.runs):
            best = here
        sized *= check.step
    tried = "; ".join(f"sized for {d:,.1f} req/s: {v}" for d, v in rounds)
    raise PlanCheckFailed(
        f"no plan held the SLO {spec.slo_ms:g} ms in simulation at {demand:,.1f} req/s within "
        f"{len(rounds)} round(s) ({tried}); add GPUs, loosen the SLO or lower the demand",
        None if best is None else replace(best, rounds=tuple(rounds)),
    )


def _simulate(
    plan: Plan, table: ProfileTable, demand: float, arrivals: str, check: CheckConfig
) -> PlanSimResult:
    duration = check.requests / demand
    if arrivals.startswith("trace:"):
        name = arrivals.removeprefix("trace:")
        name = BUNDLED_TRACE if name == "BUNDLED" else name
        path = Path(name) if Path(name).suffix else bundled_trace_path(name)
        schedule = arrival_schedule(trace=path, target_rate=demand, duration_s=duration)
    else:
        schedule = arrival_schedule(arrivals, rate=demand, duration_s=duration, seed=check.seed)
    return simulate_plan(plan, schedule, SimConfig(seed=check.seed), table)


def _holds(run: PlanSimResult, check: CheckConfig) -> bool:
    p99 = run.latency_ms.get("p99")
    return run.violation_rate < check.violations and p99 is not None and p99 <= run.slo_ms


def _fault(run: PlanSimResult) -> str:
    p99 = run.latency_ms.get("p99")
    shown = "none answered" if p99 is None else f"p99 {p99:.1f} ms"
    return f"{run.arrivals}: {run.violation_rate:.2%} late or dropped, {shown}"


def _worst(runs: tuple[PlanSimResult, ...]) -> float:
    return max(r.violation_rate for r in runs)
