"""A plan checked in the simulator before it is returned: the planner's bound is a model
(the wait for a free instance assumes Poisson arrivals; fill, wait and execution are
added as if each were at its worst), so every plan is served in virtual time, under
Poisson arrivals and under a recorded trace's, and tightened until the simulation meets
the SLO.

``checked_plan`` plans at the demand; simulates the plan under each arrival process
(``CheckConfig.arrivals``) for ``requests`` requests (a trace, or any other process
than Poisson, in ``trace_windows`` runs of ``trace_requests`` from other starting
points or seeds); and if, under any process, a run
has ``violations`` or more of its requests late or dropped, or the 95 % upper bound on
that share over its runs (batch means, ``violation_bound``) reaches it, or (several
runs) the 95 % upper prediction bound on a fresh run's share (``window_bound``) does,
or a run's answered p99 passes the SLO, plans again for more:
the demand the instances are sized for rises by ``step`` (the plan's demand, what the
server expects and its controller watches, stays the real one; the first run that
fails ends the round, the runs after it are not simulated). That repeats
at most ``max_rounds`` times. The first plan that holds is returned with every run that
judged it; when none holds, or the GPUs run out first, ``PlanCheckFailed`` says so with
the best plan found and its runs, so nothing measured is lost.

A trace's bursts are what the rise buys. The bundled production trace (2.6 req/s, an
hour of a code-completion service) brought to 300 req/s as 117 copies overlaid has
seconds at 1.44 times the mean (the 99th percentile of 1 s counts; Poisson's: 1.13),
which a plan sized for the mean cannot serve within a tight SLO. The default check
simulates both Poisson arrivals and that trace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from ridgeline.errors import InfeasiblePlan, PlanCheckFailed
from ridgeline.loadgen.schedule import named_arrivals
from ridgeline.pipeline.choices import ALL_FEATURES, DEFAULT_OPTIONS
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.planned import to_plan
from ridgeline.pipeline.planner import Features, PlannerOptions, PlanResult, plan_pipeline
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.pipeline.spec import PipelineSpec
from ridgeline.plansim.api import SimConfig, simulate_plan
from ridgeline.plansim.result import PlanSimResult


@dataclass(frozen=True, slots=True)
class CheckConfig:
    arrivals: tuple[str, ...] = ("poisson", "trace:BUNDLED")
    """Each plan is simulated under each: an arrival spec (``workload.arrivals``:
    ``poisson``, ``gamma:cv=2``), or ``trace:NAME`` (a bundled trace, ``trace:BUNDLED``
    for the one shipped) / ``trace:PATH`` (a trace file), brought to the demand as that
    many times its users (copies overlaid at their own pace, from random starting
    points: ``loadgen.schedule.trace_overlaid``), or ``trace-speed:NAME`` / ``PATH``,
    the one trace sped up to the demand (every burst shortened: the stress case)."""
    requests: int = 20_000
    """Requests per simulated run: 100 expected past the bound at 0.5 %."""
    trace_windows: int = 6
    """Runs per trace, or per bursty process (any but Poisson: ``gamma:cv=3``), each of
    ``trace_requests`` from other random starting points or seeds (``seed``, ``seed +
    1``, ...); the plan must hold in every one, and over them all. Gamma arrivals of CV
    3 vary from run to run as a trace's windows do: plans checked in one 20,000-request
    run held there and failed a fresh one (the jigsaw study's social-media plan, no
    features, on 8 A100s at the spec's SLO: 1.00 % late or dropped at seed 7). A trace's
    windows differ far more than Poisson's binomial noise: one
    social-media plan under the bundled trace overlaid, twelve windows of 20,000
    requests, 0.00–2.08 % late or dropped (mean 0.35 %, three of the twelve at 0.5 % or
    more), where sized up once more, twelve windows of 10,000 all came to 0.00 %. A
    plan that held in three windows, pooled, failed in a fresh one. A fresh window is
    worse than every one of ``k`` checked with chance ``1/(k + 1)`` at most, and a
    longer one varies less."""
    trace_requests: int = 20_000
    """Requests per trace run: as long as a Poisson run. Shorter windows were once used so
    that more of them cost the same ("a shorter window varies more"); but near its
    capacity a plan's queues wander further the longer it serves, and the windows that
    matter are as long as the ones it will be judged on. A social-media plan at its
    plain maximum (8 H100, 400 ms, no features, the bundled trace overlaid to 825 req/s)
    in twenty windows of each length, seeds 1-20: 2 of 20 windows of 10,000 requests at
    0.5 % late or dropped or more, 9 of 20 of 20,000 (up to 8.0 %). Checked in six
    windows of 10,000, it held in all and missed 2.94 % in a fresh one of 20,000."""
    violations: float = 0.005
    """A plan fails when a run has this share of its requests late or dropped, or the
    95 % upper bound on that share under one arrival process (``violation_bound``, over
    that process's runs) reaches it, or when a run's answered p99 passes the SLO."""
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
        plan = to_plan(result).model_copy(
            update={"demand_rps": demand, "checked_arrivals": check.arrivals}
        )
        groups: list[tuple[str, tuple[PlanSimResult, ...]]] = []
        failing = []
        for a in check.arrivals:  # the first process, or run, that fails ends the round
            group = _judged(plan, table, demand, a, check)
            groups.append((a, group))
            if not _holds(group, check):
                failing.append((a, group))
                break
        runs = tuple(r for _, g in groups for r in g)
        verdict = "held" if not failing else "; ".join(_fault(a, g) for a, g in failing)
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


def _judged(
    plan: Plan, table: ProfileTable, demand: float, arrivals: str, check: CheckConfig
) -> tuple[PlanSimResult, ...]:
    """The runs under ``arrivals`` (several windows when ``_windowed``), stopping at the
    first that fails on its own: the plan fails there whatever the others show."""
    runs: list[PlanSimResult] = []
    for w in range(check.trace_windows if _windowed(arrivals) else 1):
        run = _simulate(plan, table, demand, arrivals, check, check.seed + w)
        runs.append(run)
        if not _run_holds(run, check):
            break
    return tuple(runs)


def _run_holds(run: PlanSimResult, check: CheckConfig) -> bool:
    return run.judgment.latency_held and run.violation_rate < check.violations


def _windowed(arrivals: str) -> bool:
    """Whether ``arrivals`` is checked in several shorter runs: a trace, or a bursty
    process (anything but Poisson)."""
    return arrivals != "poisson"


def _simulate(
    plan: Plan,
    table: ProfileTable,
    demand: float,
    arrivals: str,
    check: CheckConfig,
    seed: int,
) -> PlanSimResult:
    duration = (check.trace_requests if _windowed(arrivals) else check.requests) / demand
    schedule = named_arrivals(arrivals, demand, duration, seed)
    return simulate_plan(plan, schedule, SimConfig(seed=seed), table)


BATCHES_PER_RUN = 10
"""Each run is cut into this many stretches of consecutive arrivals (equal in count) for
the batch-means bound (``violation_bound``)."""


def violation_bound(runs: tuple[PlanSimResult, ...], confidence: float = 0.95) -> float:
    """A one-sided upper confidence bound on the long-run share of requests late or
    dropped, by batch means: each run cut into ``BATCHES_PER_RUN`` stretches of
    consecutive arrivals, the mean of the stretches' shares plus Student's ``t`` times
    their standard error. Violations come in runs (a burst drops many together), so the
    requests are not independent draws and a binomial bound would be far too narrow;
    stretches of a few thousand requests are nearly independent of each other."""
    shares: list[float] = []
    for r in runs:
        bad = ~r.judgment.good  # dropped, or answered late: the judge's, per request
        shares += [float(b.mean()) for b in np.array_split(bad, BATCHES_PER_RUN) if b.size]
    k = len(shares)
    if k < 2:
        return float(np.mean(shares)) if shares else 0.0
    mean = float(np.mean(shares))
    error = float(np.std(shares, ddof=1)) / math.sqrt(k)
    return mean + _t_quantile(confidence, k - 1) * error


def window_bound(runs: tuple[PlanSimResult, ...], confidence: float = 0.95) -> float:
    """A one-sided upper prediction bound on the share late or dropped of one fresh run
    like these (another window of the trace, other seeds): ``mean + t·sd·√(1 + 1/k)``
    over the ``k`` runs' own shares (``prediction_bound``). ``violation_bound`` bounds
    the long-run share; a plan at the edge meets that and still misses in a fresh window
    (the jigsaw study, at a7dac81: 8 trace cells of 286 held in all six windows checked
    and missed 0.51-2.94 % in a fresh one). A window is what a user serves: the plan
    must hold in the next one, not on average."""
    return prediction_bound([r.violation_rate for r in runs], confidence)


def prediction_bound(shares: Sequence[float], confidence: float = 0.95) -> float:
    """The one-sided ``confidence`` upper prediction bound for one more draw from the
    distribution ``shares`` were drawn from (normal theory: Student's ``t`` with ``k - 1``
    degrees of freedom, the spread widened by ``√(1 + 1/k)`` for the mean's own error);
    with fewer than two shares, their largest."""
    k = len(shares)
    if k < 2:
        return max(shares, default=0.0)
    mean = float(np.mean(shares))
    sd = float(np.std(shares, ddof=1))
    return mean + _t_quantile(confidence, k - 1) * sd * math.sqrt(1 + 1 / k)


def _t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish–Fisher expansion around the normal one (to
    0.002 at 9 degrees of freedom: 1.832 against 1.833 at p = 0.95)."""
    z = NormalDist().inv_cdf(p)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _holds(runs: tuple[PlanSimResult, ...], check: CheckConfig) -> bool:
    each = all(_run_holds(r, check) for r in runs)
    fresh = len(runs) < 2 or window_bound(runs) < check.violations
    return each and fresh and violation_bound(runs) < check.violations


def _fault(arrivals: str, runs: tuple[PlanSimResult, ...]) -> str:
    pooled = sum(r.violations for r in runs) / max(1, sum(r.requests for r in runs))
    p99s = [r.latency_ms.get("p99") for r in runs]
    shown = (
        "none answered"
        if all(p is None for p in p99s)
        else f"p99 up to {max(p for p in p99s if p is not None):.1f} ms"
    )
    over = f" in {len(runs)} runs" if len(runs) > 1 else ""
    fresh = f", a fresh run's {window_bound(runs):.2%}" if len(runs) > 1 else ""
    return (
        f"{arrivals}: {pooled:.2%} late or dropped{over} (95 % bound "
        f"{violation_bound(runs):.2%}{fresh}), {shown}"
    )


def _worst(runs: tuple[PlanSimResult, ...]) -> float:
    return max(r.violation_rate for r in runs)
