"""The probe: connect check → warmup → search → confirm → stop, everything stored as it
happens. The same orchestrator drives a real endpoint (real time) or a simulated server
(virtual time); only the driver differs. What it is asked and answers is in
``probe.config``; each step's bookkeeping (pooling, storing, the clock) in ``probe._run``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import replace

from ridgeline.aio import signal_name
from ridgeline.errors import RidgelineError, TargetUnreachableError
from ridgeline.health.metrics import METRICS
from ridgeline.health.state import HealthState
from ridgeline.health.timescale import CLUSTERS
from ridgeline.probe._run import (
    POOLED_CAPS,
    UNDECIDED_RERUNS,
    BudgetSpent,
    Run,
    Stopped,
)
from ridgeline.probe._warmup import warmup
from ridgeline.probe.assess import STEADY
from ridgeline.probe.budget import (
    LAST_LOOK_S,
    SEARCHED,
    STEP_SHARE,
    bisected,
    fallback,
    fallback_s,
    last_look_s,
    looked,
    within_budget,
)
from ridgeline.probe.config import (
    BOUNDARY_TAIL,
    CONFIRM_TAIL,
    ProbeConfig,
    ProbeResult,
    ProgressFn,
    StartFn,
    strategy_step_s,
)
from ridgeline.probe.drivers import Driver
from ridgeline.probe.evidence import decided_ceiling, unslowed
from ridgeline.probe.sequential import MIN_LOOK_S
from ridgeline.search import parse_strategy
from ridgeline.search.base import CapacityEstimate, StepPlan, StepVerdict, Strategy
from ridgeline.search.confirmation import Decision, below_failed, decide, deciding
from ridgeline.telemetry.gpu import GpuMonitor
from ridgeline.telemetry.store import RunStore

__all__ = [
    "BOUNDARY_TAIL",
    "CONFIRM_TAIL",
    "POOLED_CAPS",
    "UNDECIDED_RERUNS",
    "ProbeConfig",
    "ProbeResult",
    "ProgressFn",
    "StartFn",
    "probe",
]


async def probe(
    driver: Driver,
    cfg: ProbeConfig,
    *,
    store: RunStore | None = None,
    stop: asyncio.Event | None = None,
    on_step: ProgressFn | None = None,
    gpu: GpuMonitor | None = None,
    on_start: StartFn | None = None,
    signals: Sequence[int] = (),
) -> ProbeResult:
    """Find the maximum sustainable throughput of ``driver``'s endpoint under the SLO.
    ``on_step`` hears of each step as it ends; ``on_start`` as it starts. ``signals``:
    the signals that set ``stop``, as ``aio.stopping_on_signal`` appends them (the
    reason an interrupted probe is stored with names the last)."""
    stop = stop or asyncio.Event()
    options = dict(cfg.strategy_options)
    options.setdefault("decisive_requests", cfg.needed())
    if cfg.budget_s is not None:  # the search's share; the confirmation has the rest
        cfg = cfg.model_copy(update={"max_step_s": min(cfg.max_step_s, STEP_SHARE * cfg.budget_s)})
    if cfg.strategy == "adaptive":  # adaptive confirms itself: the same rule as ours
        options.setdefault("confirm_requests", cfg.confirm_count())
        options.setdefault("boundary_requests", cfg.tail_requests(BOUNDARY_TAIL, 3_000))
        options.setdefault("confirm_factor", cfg.confirm_factor)
        options.setdefault("confirm_margin", cfg.confirm_margin)
    strategy = parse_strategy(cfg.strategy, **options)
    run = Run(driver, cfg, store, gpu, on_step, on_start)
    # a late send moves the latencies timed from the schedule (e2e, TTFT), not the gaps
    late = [b.bound_ms for b in run.policy.latency if METRICS[b.metric].from_schedule]
    driver.judge_by(min(late, default=None))
    status, reason, confirmed = "complete", "", None
    est = strategy.result()
    try:
        pending = strategy.propose()
        if cfg.warmup and pending is not None:
            warmed = await warmup(run, pending.rate, stop)
            if cfg.budget_s is not None and "start_rate" not in options:
                # no time to climb from min_rate again: from the rate the warm-up held
                start = warmed.healthy_rate
                top = options.get("max_rate")
                if start is not None and start > pending.rate and (top is None or start <= top):
                    options["start_rate"] = start
                    strategy = parse_strategy(cfg.strategy, **options)
        est, confirmed, reason = await _search_and_confirm(run, strategy, stop)
        # a budget leaves no time for a search resumed upward and its confirmation
        resumes = MAX_RESUMES if cfg.strategy != "stability" and cfg.budget_s is None else 0
        for _ in range(resumes):
            failed = _bounding_failure(run.trajectory, est) if confirmed else None
            if failed is None:
                break
            # was the failure that bounded the search the server's past (cold, warming
            # by work)? Its rate once more, now that the server has served the search,
            # for as long as a step needs to decide: a server that has changed holds it
            # clearly, and one that has not need not fail a confirmation's length again
            plan = StepPlan(failed.rate, _recheck_s(cfg, failed), "recheck")
            recheck = await run.step(plan, stop)
            if _changed(failed, recheck) and recheck.duration_s < failed.duration_s:
                # a short run that holds may have caught a quiet stretch: as long as the
                # failure, pooled with it, before the search goes on above
                recheck = await run.longer(plan, failed.duration_s, stop)
            if not _changed(failed, recheck):
                break  # it fails still, or holds by a hair: the estimate stands
            above = failed.rate
            upward = {k: v for k, v in options.items() if k != "start_rate"}
            strategy = parse_strategy(cfg.strategy, **{**upward, "min_rate": above})
            again = await _search_and_confirm(run, strategy, stop)
            if not (again[1] and again[0].capacity_rps is not None):
                break  # nothing held a confirmation above: the estimate stands
            est, confirmed, reason = again
            why = (
                "whose failures never decided (late requests in too few clusters)"
                if not (failed.decided or recheck.decided)
                else "which failed early and held once the server was warm"
            )
            reason = f"{reason} (searched on above {above:g} req/s, {why})"
        if confirmed:
            est, confirmed, reason = await _still_covered(run, est, reason, stop)
        if confirmed and cfg.budget_s is not None:
            est, confirmed, reason = await _rechecked(run, est, reason, stop)
        est = _with_confirmation(est, run.trajectory)
    except BudgetSpent:
        if not confirmed:  # a confirmed answer stands: the budget ended what came after
            est, confirmed, reason = within_budget(run, strategy.result())
        else:
            reason = f"{reason}; the budget ended the checks above it"
        est = _with_confirmation(est, run.trajectory)
    except Stopped:
        status, reason = (
            "interrupted",
            f"interrupted by {signal_name(list(signals))}: partial search stored",
        )
        est = _with_confirmation(strategy.result(), run.trajectory)
    except asyncio.CancelledError:  # the caller's: store what was measured, stay cancelled
        reason = "cancelled by its caller: partial search stored"
        run.finish(
            _with_confirmation(strategy.result(), run.trajectory), None, "interrupted", reason
        )
        raise
    except TargetUnreachableError:
        if run.run_id is None:
            raise  # failed its connect check before anything was measured
        status, reason = "failed", "critical: the server stopped answering"
        est = _with_confirmation(strategy.result(), run.trajectory)
    except RidgelineError as exc:
        status, reason = "failed", f"{HealthState.CRITICAL.value}: {exc}"
        est = _with_confirmation(strategy.result(), run.trajectory)
    if cfg.budget_s is not None:  # the interval a user is told, from decided evidence
        est, confirmed, reason = unslowed(run, est, confirmed, reason)
        ceiling, note = decided_ceiling(run, est)
        est, reason = replace(est, ci_high=ceiling), f"{reason}{note}"
    if run.uncovered and confirmed:
        reason = f"{reason}; but {run.uncovered}"
    if run.warmed is not None and run.warmed.capped:
        reason = f"{reason}; but {run.warmed.note}"
    return run.finish(est, confirmed, status, reason)


MAX_RESUMES = 2
CHANGED = math.log(1.25)
"""A recheck "holds clearly better" when its score is at least 25 % below the failed
step's, and by more than 2 standard errors of the two scores (from their quarters). A
lower bar than a confirmation's (4): a recheck wrongly taken as changed costs one more
search, which must itself be confirmed; it cannot report a wrong capacity."""


def _recheck_s(cfg: ProbeConfig, failed: StepVerdict) -> float:
    """How long a recheck of ``failed`` runs first: a search step's length, or what its
    rate needs to decide (``ProbeConfig.needed_s``) if longer, but no longer than
    ``failed``. One that looks changed is then made as long as ``failed``."""
    return min(failed.duration_s, max(strategy_step_s(cfg), cfg.needed_s(failed.rate)))


def _bounding_failure(trajectory: list[StepVerdict], est: CapacityEstimate) -> StepVerdict | None:
    """The failed step that set the estimate's upper bound (the last valid, unsustainable
    one at ``ci_high``), or None."""
    if est.ci_high is None:
        return None
    for v in reversed(trajectory):
        if v.valid and not v.state.sustainable and v.rate == est.ci_high:
            return v
    return None


def _changed(failed: StepVerdict, recheck: StepVerdict) -> bool:
    """Whether the server holds now, clearly, a rate at which it failed earlier in the
    probe: a server that warms by work fails its first steps cold and holds them warm,
    and those cold failures would set the capacity. A recheck that fails again, or holds
    by a hair (a noisy server at its boundary), leaves the estimate as it is, at the
    cost of one step. A failure that never decided (it stood as measured once its reruns
    ran out: 16 errors in 15,708 requests under errors<0.1 %, a coin toss against the
    bound) is no evidence against a recheck that holds, decided: the search goes on. Nor
    is it when its recheck did not decide either, whichever way it leaned: a GC pause
    every 40 s failed 80 s steps at 127 req/s by the luck of their phase (144 late
    requests in clusters of some 40, worth 4 against 2.6 allowed), just above a
    confirmation of 600 s that held with 0.84 % late, and ended a search 70 % low."""
    if not failed.decided and (recheck.sustainable or not recheck.decided):
        return True  # the failure stood only because its reruns ran out: a coin toss
    if not (recheck.sustainable and 0 < recheck.score < failed.score < math.inf):
        return False
    noise = 2 * math.hypot(failed.score_se, recheck.score_se)
    return math.log(failed.score / recheck.score) > max(CHANGED, noise)


async def _search_and_confirm(
    run: Run, strategy: Strategy, stop: asyncio.Event
) -> tuple[CapacityEstimate, bool | None, str]:
    """Run ``strategy`` to its end, then confirm its estimate (unless it confirmed
    itself): the estimate, whether it held a confirmation (None: nothing to confirm),
    and why the search ended."""
    cfg, cut = run.cfg, False
    while (plan := strategy.propose()) is not None:
        if cfg.budget_s is not None and run.spent_s >= SEARCHED * cfg.budget_s:
            cut = True  # the search's share is spent: its estimate so far is confirmed
            break
        plan = _covering(run, plan)
        if plan.purpose == "confirm" and cfg.looks():  # the adaptive search's own
            strategy.observe((await looked(run, plan, stop))[0])
        else:
            strategy.observe(await run.step(plan, stop))
    est = strategy.result()
    if cut:
        est = replace(
            est,
            reason=f"the search's share of the budget ({SEARCHED:.0%} of {cfg.budget_s:g} s, "
            "the warm-up's included) ended it unconverged",
        )
    if est.capacity_rps is None:
        return est, None, est.reason
    if any(
        v.purpose == "confirm" and v.sustainable and v.rate == est.capacity_rps
        for v in run.trajectory
    ):
        return est, True, est.reason  # adaptive confirms itself by the same rule
    if not cfg.confirm:
        return est, True, est.reason
    return await _confirm(run, est, stop)


async def _still_covered(
    run: Run, est: CapacityEstimate, reason: str, stop: asyncio.Event
) -> tuple[CapacityEstimate, bool | None, str]:
    """The confirmation that stands, judged by all the probe has seen of the server's
    slow behaviour (``_covering``), not only what it had seen when that confirmation
    ran: a run of 30 s early in a probe that later finds a stall every 90 s (a search
    resumed upward, whose long confirmations all caught it) held by the luck of its
    phase. One that lasted less than ``STALE`` of what a covering confirmation needs now
    (within the caps) is run again at that length, with ``_confirm``'s back-offs. Called
    with a confirmed estimate."""
    rate = est.capacity_rps
    held = [
        v for v in run.trajectory if v.purpose == "confirm" and v.sustainable and v.rate == rate
    ]
    if rate is None or not held:
        return est, True, reason
    longest = max(v.duration_s for v in held)
    wanted = _covering(run, StepPlan(rate, longest, "confirm")).duration_s
    needed = run.cfg.capped_s(rate, wanted)
    if longest >= STALE * needed:
        return est, True, reason
    est, confirmed, reason = await _confirm(run, est, stop, contested=True)
    why = (
        f"its confirmation of {longest:g} s ran before the probe had seen the server's "
        f"slow behaviour, which asks for {needed:.0f} s"
    )
    return est, confirmed, f"{reason} ({why})"


async def _rechecked(
    run: Run, est: CapacityEstimate, reason: str, stop: asyncio.Event
) -> tuple[CapacityEstimate, bool | None, str]:
    """Under a budget, a confirmed answer kept at its rate for the budget left, less
    one last look below it (``budget.last_look_s``): the time is the user's, and a slow cycle the
    probe has not seen yet (a neighbour busy every few minutes, a reload) shows only in a
    longer run. Under ``--budget 5m`` every probe of a server with a neighbour on a 180 s
    cycle confirmed within 175 s, before the neighbour's busy phase, and answered 1.7-6.7
    % above its capacity with two minutes of the budget left. The confirmation, when it
    was the last step, is made longer and judged with it as one run; else the rate is run
    afresh. A recheck that fails refutes the answer, and the last look takes a rate the
    search held below it (``budget.fallback``); one that holds, or that the budget has no
    minute for, leaves it."""
    rate = est.capacity_rps
    run.reserve_s = last_look_s(run.cfg, rate) if rate is not None else LAST_LOOK_S
    left = run.remaining_s()
    if rate is None or left < MIN_LOOK_S:
        return est, True, reason
    last = run.trajectory[-1] if run.trajectory else None
    plan = StepPlan(rate, left, "confirm")
    if last is not None and last.purpose == "confirm" and last.rate == rate:
        verdict = await run.longer(plan, run.pooled_s() + left, stop, capped=False)
    else:
        verdict = (await looked(run, plan, stop, early_pass=False))[0]
    if not verdict.valid:
        return est, True, f"{reason}; its recheck in the budget left was invalid ({verdict.reason})"
    if not verdict.sustainable:
        why = (
            f"it held a confirmation, then failed a recheck of {left:.0f} s more: {verdict.reason}"
        )
        return await fallback(run, est, rate, why, stop)
    return est, True, f"{reason}; held again over {left:.0f} s more, the budget left"


STALE = 0.5
"""A confirmation that lasted less than this share of what a covering one needs, by
everything the probe has seen, is run again: a run half as long as the server's
clusters ask for could have missed them all."""


async def _confirm(
    run: Run, est: CapacityEstimate, stop: asyncio.Event, *, contested: bool = False
) -> tuple[CapacityEstimate, bool | None, str]:
    """A stability run at the estimate, judged by ``confirmation.decide`` (a marginal run
    is repeated and the majority decides); if it fails, back off and try again
    (``confirm_retries`` times): the estimate must hold a long run to stand. Under a
    budget each back-off goes at least halfway down to the highest rate the search held
    (``budget.bisected``), and the first run starts there when a confirmation at or
    below the estimate failed already: a back-off of 2-4 % at a time, each run a minute
    and more, reaches no rate that holds within 15 minutes (an LLM endpoint under
    ``tpot_p95<40ms``, its truth 19.9 req/s: confirmations at 21.4, 21.6 and 21.1 failed,
    then the last look dropped 15 %, to 18.2 or 16)."""
    cfg = run.cfg
    rate = est.capacity_rps
    assert rate is not None
    ceiling = est.ci_high
    precision = float(cfg.strategy_options.get("precision", 0.02))
    reason = est.reason
    if cfg.budget_s is not None:
        # a confirmation at or below the estimate failed already (the adaptive search's
        # own, undecided: the search went on above it): no time to fail another there
        failed = [
            v.rate
            for v in run.trajectory
            if v.purpose == "confirm" and v.valid and not v.sustainable and v.rate <= rate
        ]
        if failed:
            ceiling = min(failed) if ceiling is None else min(ceiling, *failed)
            rate = min(rate, bisected(run, min(failed)))
    try:
        for attempt in range(cfg.confirm_retries + 1):
            duration = max(strategy_step_s(cfg) * cfg.confirm_factor, cfg.confirm_count() / rate)
            plan = _covering(run, StepPlan(rate, duration, "confirm"))
            if cfg.budget_s is not None:
                run.reserve_s = fallback_s(cfg, rate)  # for the last looks, whatever this does
                if run.remaining_s() < min(plan.duration_s, MIN_LOOK_S):
                    raise BudgetSpent  # what is left is the fallback's
            runs: list[StepVerdict] = []
            invalid = 0
            decision = Decision.AGAIN
            while decision is Decision.AGAIN:
                if runs and run.remaining_s() < min(plan.duration_s, MIN_LOOK_S):
                    raise BudgetSpent  # no time for a run that could decide
                if cfg.looks():
                    verdict, early = await looked(run, plan, stop)
                else:
                    verdict, early = await run.step(plan, stop), None
                if not verdict.valid and invalid < INVALID_CONFIRM_RETRIES:
                    invalid += 1  # the generator's failure, not the server's: run it again
                    continue
                runs.append(verdict)
                decision = early or decide(
                    runs, cfg.confirm_margin, contested=contested or attempt > 0
                )
            verdict = deciding(runs, decision)
            if decision is Decision.HELD:
                if attempt:
                    reason = (
                        f"confirmed at {rate:g} req/s after {attempt} back-off(s) from "
                        f"{est.capacity_rps:g}"
                    )
                low = est.ci_low if est.ci_low is not None and est.ci_low <= rate else rate
                return replace(est, capacity_rps=rate, ci_low=low, ci_high=ceiling), True, reason
            ceiling = rate
            reason = f"the estimate did not hold a confirmation run: {verdict.reason}"
            rate = below_failed(verdict, [v for v in run.trajectory if v.valid], precision)
            if cfg.budget_s is not None:
                rate = min(rate, bisected(run, ceiling))
    except BudgetSpent:
        if cfg.budget_s is None:
            raise
        return await fallback(run, est, ceiling, reason, stop)
    if cfg.budget_s is not None:
        return await fallback(run, est, ceiling, reason, stop)
    refuted = (
        f"no rate held a confirmation: {est.capacity_rps:g} req/s (the search's estimate) "
        f"and {cfg.confirm_retries} back-off(s) below it failed; the last: {reason}"
    )
    return replace(est, capacity_rps=None, ci_low=None, ci_high=ceiling), False, refuted


VARYING = 1.1
"""A server that held a rate in one step and, in another at that rate or above, kept up
with only ``1/VARYING`` of it has a throughput that moves with time (a neighbour, a
background job): a stationary server does not serve less when offered more…"""
NEAR = 1.2
"""…in a step offered at most this much more than the rate that held: far above it,
timeouts and a queue that never drains make the throughput what the step did, not what
the server could."""


def throughput_varied(trajectory: Sequence[StepVerdict], needed: int) -> tuple[float, float] | None:
    """(a rate that held, the lowest throughput of a step offered at least as much) when
    the second is below the first by ``VARYING`` or more; None when the steps agree.
    A rate held counts only on the ``needed`` requests a step needs to decide: a short
    step that held by luck says nothing of what the server serves."""
    held = [v.rate for v in trajectory if v.valid and v.sustainable and v.samples >= needed]
    worst: tuple[float, float] | None = None
    for v in trajectory:
        missing = (v.rate - v.achieved_rps) * v.duration_s
        if not v.valid or v.sustainable or v.achieved_rps >= STEADY * v.rate or missing < 100:
            continue  # only steps whose server fell behind say what it could serve
        top = max((r for r in held if r <= v.rate <= NEAR * r), default=0.0)
        if top >= VARYING * v.achieved_rps and (
            worst is None or top / v.achieved_rps > worst[0] / worst[1]
        ):
            worst = (top, v.achieved_rps)
    return worst


def _covering(run: Run, plan: StepPlan) -> StepPlan:
    """A confirmation made long enough for the server's slow behaviour seen so far.

    Its late requests: a confirmation holds ``CLUSTERS`` clusters of them at its rate, as
    the steps that kept up have seen them come (``health.timescale``): a stall every
    45 s is then judged at its long-run share, not by the luck of a run's phase. Its
    throughput: when it has varied between steps (``throughput_varied``: a neighbour's
    busy phase), as long as the caps allow, and its own windows then say how long the
    phases are. The step caps still apply (``ProbeConfig.capped_s``); a confirmation
    they cut short is named in the answer (``Run.uncovered``)."""
    q = run.cfg.quantile()
    if plan.purpose != "confirm" or q is None:
        return plan
    seen = run.time_scale()
    wanted = seen.cover_s(plan.rate, 1.0 - q)
    why = seen.describe(plan.rate, 1.0 - q)
    varied = throughput_varied(run.trajectory, run.cfg.needed())
    if varied is not None:
        wanted = max(wanted, run.cfg.capped_s(plan.rate, math.inf))
        why = (
            f"the server's throughput varied between steps (it held {varied[0]:g} req/s "
            f"and, offered as much or more, kept up with {varied[1]:.0f} req/s); {why}"
        )
    if wanted <= plan.duration_s:
        return plan
    capped = run.cfg.capped_s(plan.rate, wanted)
    if capped < wanted:
        run.uncovered = (
            f"{why}; a confirmation holding {CLUSTERS} clusters of late requests needs "
            f"{wanted:.0f} s, and the step caps allow {capped:.0f} s (raise "
            "--max-step-s): this capacity may be optimistic"
        )
    return replace(plan, duration_s=wanted)


INVALID_CONFIRM_RETRIES = 2
"""An invalid confirmation run (the generator fell behind, or failed itself) is run again
this many times before it counts as a failed run: it says nothing of the server."""


def _with_confirmation(est: CapacityEstimate, trajectory: list[StepVerdict]) -> CapacityEstimate:
    """Every step counted in steps and test-seconds: the searches' (one, or more when a
    search resumed upward) and the confirmations'."""
    return replace(
        est,
        steps=len(trajectory),
        test_seconds=sum(v.duration_s for v in trajectory),
        trajectory=tuple(trajectory),
    )
