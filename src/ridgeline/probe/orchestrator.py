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
    NEAR_BOUNDARY,
    POOLED_CAPS,
    REACH,
    UNDECIDED_RERUNS,
    BudgetSpent,
    Run,
    Stopped,
    warmup,
)
from ridgeline.probe.assess import STEADY
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
from ridgeline.probe.sequential import (
    MIN_LOOK_S,
    Look,
    first_look_s,
    judge_look,
    look_lengths,
    sure_latency,
    sure_look_s,
    sure_pass,
)
from ridgeline.search import parse_strategy
from ridgeline.search.base import CapacityEstimate, StepPlan, StepVerdict, Strategy
from ridgeline.search.confirmation import Decision, below_failed, decide, deciding
from ridgeline.telemetry.gpu import GpuMonitor
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import StepSummary

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
        est = _with_confirmation(est, run.trajectory)
    except BudgetSpent:
        if not confirmed:  # a confirmed answer stands: the budget ended what came after
            est, confirmed, reason = _within_budget(run, strategy.result())
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
    if run.uncovered and confirmed:
        reason = f"{reason}; but {run.uncovered}"
    if run.warmed is not None and run.warmed.capped:
        reason = f"{reason}; but {run.warmed.note}"
    return run.finish(est, confirmed, status, reason)


FALLBACK_S = 2 * (MIN_LOOK_S + 5.0)
"""Under a budget, the confirmation at the estimate (and its back-offs) leaves this much
for two last looks at rates the search held (``_fallback``)."""


async def _fallback(
    run: Run, est: CapacityEstimate, ceiling: float | None, why: str, stop: asyncio.Event
) -> tuple[CapacityEstimate, bool | None, str]:
    """Under a budget, when the confirmations at the estimate did not decide a pass in
    their share of it: looks down a ladder of rates the search held, below every failure
    decided, until one holds surely (``sequential.sure_pass`` at the probe's
    confidence) or the budget ends. The ladder (``_ladder``): first the highest rate
    whose pass was sure (``sequential.sure_latency``, on its latency: a short step
    cannot show errors<0.1 % surely), then the rates held plainly inside the SLO (a
    score of ``NEAR_BOUNDARY`` or less), highest first, then halving; after a look
    fails, only rates ``LADDER_DROP`` or more below it. Each look lasts what a sure pass
    at its rate needs (``sequential.sure_look_s``: a minute at least, the SLO's errors
    too, and its requests as many more as the late requests seen near that rate came
    together); a rate the budget left cannot give that is passed over for a lower one;
    the last look takes all that is left. Near the
    boundary a minute holds surely only where late requests do not cluster (a stall, a
    busy period), and an answer over-estimated is worse than one too low."""
    cfg = run.cfg
    run.reserve_s = 0.0  # what was kept back is for these looks
    failed = [v.rate for v in run.trajectory if v.valid and not v.sustainable and v.decided]
    top = min([*failed, *([ceiling] if ceiling is not None else [])], default=math.inf)
    high = None if math.isinf(top) else top
    floor = float(cfg.strategy_options.get("min_rate", 0.0))
    ladder = _ladder(run, top)
    verdict: StepVerdict | None = None
    q = cfg.quantile()
    share = 1.0 - q if q is not None else 0.0
    while ladder:
        rate = ladder.pop(0)
        if rate < floor or (verdict is not None and rate > verdict.rate * (1 - LADDER_DROP)):
            continue
        left = run.remaining_s()
        if left < MIN_LOOK_S:
            break
        seen = run.time_scale(below=rate * REACH).dispersion
        look = sure_look_s(rate, share, 1.0 - cfg.confidence, seen, cfg.needed_s(rate))
        if look > left:  # no time to be sure here: lower, where late requests cluster less
            if not ladder:
                ladder.append(rate / 2)
            continue
        if left - look < MIN_LOOK_S:
            look = left  # no time for another: this one takes the rest
        plan = StepPlan(rate, look, "confirm")
        verdict = await run.step(plan, stop, settle=False, pool=False, capped=False)
        s, bound = run.judged[-1], run.policy.max_error_rate
        clustered = _as_clustered(run, verdict)
        if sure_pass(clustered, 1.0 - cfg.confidence, _failures(s), s.sent, bound):
            reason = (
                f"confirmed at {rate:g} req/s, a rate the search held, over "
                f"{verdict.duration_s:.0f} s ({verdict.beyond} of {verdict.samples} requests "
                f"beyond the bound): the budget of {cfg.budget_s:g} s left no time to "
                f"confirm nearer the boundary ({why}; raise --budget for a narrower answer)"
            )
            low = est.ci_low if est.ci_low is not None and est.ci_low <= rate else rate
            return replace(est, capacity_rps=rate, ci_low=low, ci_high=high), True, reason
        if verdict.valid and not verdict.sustainable:
            high = rate if high is None else min(high, rate)
        if not ladder:
            ladder.append(rate / 2)  # below every rate the search held: halving
    if verdict is None:
        raise BudgetSpent
    reason = (
        f"the budget of {cfg.budget_s:g} s ran out before any rate held a look surely "
        f"(the last, {verdict.rate:g} req/s: {verdict.reason}); raise --budget"
    )
    return replace(est, capacity_rps=None, ci_low=None, ci_high=high), None, reason


def _as_clustered(run: Run, look: StepVerdict) -> StepVerdict:
    """``look`` with its requests worth as many independent ones as the clustering the
    probe has seen near its rate says (``health.timescale``, steps offered up to
    ``REACH`` × its rate), when that is more than its own: a minute at 114 req/s over
    gRPC held 0 of 6,872 requests beyond the bound, where the steps had seen late
    requests come 91 together, and a 60 s check at that rate then failed (p99 447 ms
    against 400). Worth 75 independent requests, its pass was no evidence."""
    seen = run.time_scale(below=look.rate * REACH).dispersion
    return replace(look, dispersion=seen) if seen > look.dispersion else look


LADDER_DROP = 0.15
"""After a last look fails, the next is at least this far below it: a rate just under
one that failed is as doubtful (the largest calibrated back-off, ``MAX_CALIBRATED_BACKOFF``)."""


def _ladder(run: Run, top: float) -> list[float]:
    """The rates ``_fallback`` looks at, in order: the highest sure pass (when above the
    highest plain one), then the plain passes, highest first, all below ``top``."""
    level = 1.0 - run.cfg.confidence
    held = [v for v in run.trajectory if v.valid and v.sustainable and v.rate < top]
    sure = [v.rate for v in held if sure_latency(v, level)]
    inside = sorted({v.rate for v in held if v.score <= NEAR_BOUNDARY}, reverse=True)
    if sure and (not inside or max(sure) > inside[0]):
        return [max(sure), *inside]
    return inside


SEARCHED = 0.5
"""Under a budget, no search step starts once this share of it is spent (the warm-up's
``_run.WARMUP_SHARE`` included); the confirmation has the rest."""
STEP_SHARE = 0.15
"""Under a budget, no step is capped longer than this share of it (unless its
percentile needs more to decide): a search of several steps fits in its share."""


def _within_budget(run: Run, est: CapacityEstimate) -> tuple[CapacityEstimate, bool | None, str]:
    """The answer when the budget ran out before a confirmation decided: the highest rate
    a run of at least ``MIN_LOOK_S`` held surely (``sequential.sure_pass`` at the
    probe's confidence, shared among the runs it is chosen from), below every decided
    failure; the lowest of those bounds it above."""
    cfg = run.cfg
    budget = cfg.budget_s
    failed = [v.rate for v in run.trajectory if v.valid and not v.sustainable and v.decided]
    ceiling = min(failed, default=None)
    candidates = [
        (v, s)
        for v, s in zip(run.trajectory, run.judged, strict=True)
        if v.valid
        and v.sustainable
        and v.duration_s >= MIN_LOOK_S
        and (ceiling is None or v.rate < ceiling)
    ]
    level = (1.0 - cfg.confidence) / max(len(candidates), 1)
    max_error = run.policy.max_error_rate
    sure = [v for v, s in candidates if sure_pass(v, level, _failures(s), s.sent, max_error)]
    spent = f"the budget of {budget:g} s ran out before a confirmation decided"
    if not sure:
        reason = (
            f"{spent}, and no run of {MIN_LOOK_S:g} s or more held surely: no capacity "
            "to report (raise --budget)"
        )
        return replace(est, capacity_rps=None, ci_low=None, ci_high=ceiling), None, reason
    best = max(sure, key=lambda v: v.rate)
    above = f"; it fails at {ceiling:g} req/s" if ceiling is not None else ""
    reason = (
        f"{spent}: {best.rate:g} req/s is the highest rate a run of {MIN_LOOK_S:g} s or "
        f"more held surely ({best.duration_s:.0f} s, {best.beyond} of {best.samples} "
        f"requests beyond the bound){above} (raise --budget for a narrower answer)"
    )
    return replace(est, capacity_rps=best.rate, ci_low=best.rate, ci_high=ceiling), True, reason


def _failures(s: StepSummary) -> int:
    """A step's requests that count against the SLO's error bound."""
    return s.errors + s.timeouts + s.incomplete + s.dropped


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
            strategy.observe((await _looked(run, plan, stop))[0])
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


STALE = 0.5
"""A confirmation that lasted less than this share of what a covering one needs, by
everything the probe has seen, is run again: a run half as long as the server's
clusters ask for could have missed them all."""


async def _confirm(
    run: Run, est: CapacityEstimate, stop: asyncio.Event, *, contested: bool = False
) -> tuple[CapacityEstimate, bool | None, str]:
    """A stability run at the estimate, judged by ``confirmation.decide`` (a marginal run
    is repeated and the majority decides); if it fails, back off and try again
    (``confirm_retries`` times): the estimate must hold a long run to stand."""
    cfg = run.cfg
    rate = est.capacity_rps
    assert rate is not None
    ceiling = est.ci_high
    precision = float(cfg.strategy_options.get("precision", 0.02))
    reason = est.reason
    try:
        for attempt in range(cfg.confirm_retries + 1):
            duration = max(strategy_step_s(cfg) * cfg.confirm_factor, cfg.confirm_count() / rate)
            plan = _covering(run, StepPlan(rate, duration, "confirm"))
            if cfg.budget_s is not None:
                run.reserve_s = FALLBACK_S  # kept for the last look, whatever this one does
                if run.remaining_s() < min(plan.duration_s, MIN_LOOK_S):
                    raise BudgetSpent  # what is left is the fallback's
            runs: list[StepVerdict] = []
            invalid = 0
            decision = Decision.AGAIN
            while decision is Decision.AGAIN:
                if runs and run.remaining_s() < min(plan.duration_s, MIN_LOOK_S):
                    raise BudgetSpent  # no time for a run that could decide
                if cfg.looks():
                    verdict, early = await _looked(run, plan, stop)
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
    except BudgetSpent:
        if cfg.budget_s is None:
            raise
        return await _fallback(run, est, ceiling, reason, stop)
    if cfg.budget_s is not None:
        return await _fallback(run, est, ceiling, reason, stop)
    refuted = (
        f"no rate held a confirmation: {est.capacity_rps:g} req/s (the search's estimate) "
        f"and {cfg.confirm_retries} back-off(s) below it failed; the last: {reason}"
    )
    return replace(est, capacity_rps=None, ci_low=None, ci_high=ceiling), False, refuted


async def _looked(
    run: Run, plan: StepPlan, stop: asyncio.Event
) -> tuple[StepVerdict, Decision | None]:
    """One confirmation run in looks (``probe.sequential``): its verdict, and HELD or
    FAILED when a look decided it early; None when it ran its full length (or the
    budget's), judged then as one run would be."""
    cfg = run.cfg
    q = cfg.quantile()
    share = 1.0 - q if q is not None else 0.0
    cover = run.time_scale().cover_s(plan.rate, share) if q is not None else 0.0
    first = first_look_s(plan.rate, share, cfg.confidence, cover)
    lengths = look_lengths(first, plan.duration_s)
    first_plan = replace(plan, duration_s=lengths[0])
    verdict = await run.step(first_plan, stop, settle=False, pool=cfg.budget_s is None)
    max_error = run.policy.max_error_rate
    for look, length in enumerate(lengths):
        if look and run.pooled_s() < length:
            if run.remaining_s() < MIN_LOOK_S / 2:
                break  # the budget is spent: judged as it stands
            verdict = await run.longer(plan, length, stop)
        s = run.judged[-1]
        clustered = _as_clustered(run, verdict)
        outcome = judge_look(clustered, look, cfg.confidence, _failures(s), s.sent, max_error)
        if outcome is Look.HELD and look < len(lengths) - 1:
            return verdict, Decision.HELD
        if outcome is Look.FAILED:
            return verdict, Decision.FAILED
        if not verdict.valid:
            return verdict, None
    return run.settle(verdict), None


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
