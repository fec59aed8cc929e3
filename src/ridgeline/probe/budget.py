"""A probe under a budget (``ProbeConfig.budget_s``), and confirmations run in looks
(``ProbeConfig.looks``): the shares of the budget the search and its steps may take,
the confirmation run in sequential looks (``looked``, the rules in ``probe.sequential``),
and what a probe answers when its confirmations did not decide in time: a ladder of last
looks at rates the search held (``fallback``), or the best sure pass measured
(``within_budget``); what the answer and its interval rest on is ``probe.evidence``'s.
Called by ``probe.orchestrator``; each step measured through ``probe._run.Run``.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

from ridgeline.probe._run import NEAR_BOUNDARY, REACH, BudgetSpent, Run
from ridgeline.probe.config import ProbeConfig
from ridgeline.probe.evidence import decided_failures
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
from ridgeline.search.base import CapacityEstimate, StepPlan, StepVerdict
from ridgeline.search.confirmation import Decision
from ridgeline.telemetry.summary import StepSummary

__all__ = [
    "LADDER_DROP",
    "LAST_LOOK_S",
    "SEARCHED",
    "STEP_SHARE",
    "as_clustered",
    "bisected",
    "clustering_read",
    "covered",
    "failures",
    "failures_at",
    "fallback",
    "fallback_s",
    "last_look_s",
    "looked",
    "within_budget",
]


LAST_LOOK_S = MIN_LOOK_S + 5.0
"""What one last look at a rate the search held (``fallback``) is kept at least: its
minute, and 5 s."""


def last_look_s(cfg: ProbeConfig, rate: float) -> float:
    """What one last look below ``rate`` is kept: ``LAST_LOOK_S``, or as long as a look
    at ``LADDER_DROP`` below it needs to pass surely at all (``ProbeConfig.sure_s``: an
    LLM endpoint at 20 req/s under ``errors<0.1%`` needs 2½ minutes with no error; a
    minute kept for it could never pass, and 14 of 21 probes under ``--budget 15m``
    answered nothing), at most half the confirmation's share of the budget."""
    need = max(LAST_LOOK_S, cfg.sure_s(rate * (1.0 - LADDER_DROP)) + LAST_LOOK_S - MIN_LOOK_S)
    return max(LAST_LOOK_S, min(need, _kept_most_s(cfg)))


def _kept_most_s(cfg: ProbeConfig) -> float:
    """The most a confirmation keeps back for last looks: half its share of the budget."""
    return (cfg.budget_s or 0.0) * (1.0 - SEARCHED) / 2


def fallback_s(cfg: ProbeConfig, rate: float) -> float:
    """Under a budget, what the confirmation at ``rate`` (and its back-offs) leaves for
    two last looks at rates the search held (``fallback``), within the confirmation's
    share of the budget."""
    return max(2 * LAST_LOOK_S, min(2 * last_look_s(cfg, rate), _kept_most_s(cfg)))


async def fallback(
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
    failed = decided_failures(run)
    top = min([*failed, *([ceiling] if ceiling is not None else [])], default=math.inf)
    high = None if math.isinf(top) else top
    floor = float(cfg.strategy_options.get("min_rate", 0.0))
    ladder = _ladder(run, top)
    verdict: StepVerdict | None = None
    q = cfg.quantile()
    share = 1.0 - q if q is not None else 0.0
    passed_over: tuple[float, float, float] | None = None  # the first: rate, look, left
    while ladder:
        rate = ladder.pop(0)
        if rate < floor or (verdict is not None and rate > verdict.rate * (1 - LADDER_DROP)):
            continue
        left = run.remaining_s()
        if left < MIN_LOOK_S:
            break
        seen = run.time_scale(below=rate * REACH).dispersion
        sent = failures_at(run, rate)[1]  # requests its error bound has at this rate
        least = max(cfg.needed_s(rate), cfg.sure_s(rate) - sent / rate)
        look = sure_look_s(rate, share, 1.0 - cfg.confidence, seen, least)
        if look > left:  # no time to be sure here: lower, where late requests cluster less
            passed_over = passed_over or (rate, look, left)
            if not ladder:
                ladder.append(rate / 2)
            continue
        if left - look < MIN_LOOK_S:
            look = left  # no time for another: this one takes the rest
        plan = StepPlan(rate, look, "confirm")
        verdict = await run.step(plan, stop, settle=False, pool=False, capped=False)
        if _surely(run, verdict):
            reason = (
                f"confirmed at {rate:g} req/s, a rate the search held, over "
                f"{verdict.duration_s:.0f} s ({verdict.beyond} of {verdict.samples} requests "
                f"beyond the bound): the budget of {cfg.budget_s:g} s left no time to "
                f"confirm nearer the boundary ({why}; raise --budget for a narrower answer)"
            )
            return _answered(est, rate, high, reason)
        if verdict.valid and not verdict.sustainable:
            high = rate if high is None else min(high, rate)
        if not ladder:
            ladder.append(rate / 2)  # below every rate the search held: halving
    extended = await _decided_longer(run, min(top, high or math.inf), stop)
    if extended is not None:
        reason = (
            f"confirmed at {extended.rate:g} req/s, its undecided last step run on for the "
            f"budget left ({extended.duration_s:.0f} s in all, {extended.beyond} of "
            f"{extended.samples} beyond the bound): no look at a lower rate could pass "
            f"surely in it ({why}; raise --budget for a narrower answer)"
        )
        return _answered(est, extended.rate, high, reason)
    if verdict is None and passed_over is not None:
        found, _, held_why = within_budget(run, est)
        if found.capacity_rps is not None:
            return found, True, held_why
        rate, look, left = passed_over
        reason = (
            f"no rate below the failures could be shown surely in the {left:.0f} s of the "
            f"budget left ({why}): a last look at {rate:g} req/s needs {look:.0f} s (the "
            "SLO's error bound and percentile, each shown with none beyond it), and no "
            "lower rate could be shown in it either; raise --budget"
        )
        tops = [t for t in (found.ci_high, high) if t is not None]
        return replace(found, ci_high=min(tops, default=None)), None, reason
    if verdict is None:
        raise BudgetSpent
    reason = (
        f"the budget of {cfg.budget_s:g} s ran out before any rate held a look surely "
        f"(the last, {verdict.rate:g} req/s: {verdict.reason}); raise --budget"
    )
    return replace(est, capacity_rps=None, ci_low=None, ci_high=high), None, reason


async def _decided_longer(run: Run, top: float, stop: asyncio.Event) -> StepVerdict | None:
    """When the last looks end with budget left that no look at a lower rate can use (it
    needs longer to pass surely than is left), the probe's last step, a confirmation or a
    last look that held short of surely, or ran undecided, below every failure, run on
    for the rest and judged with its earlier part as one run: the held verdict when it
    now passes surely, else None. (A look at 65.8 req/s held 34 of 3,886 beyond the
    bound, 38.9 allowed, short of sure; a look at half its rate needed 96 s of the 85
    left, and the probe ended with them unspent.)
    An LLM endpoint's last look at 22.23 req/s (its truth 22.68) stood undecided at
    84,294 token gaps worth 1,165 independent ones, and the probe ended with 105 s of
    its 900 unspent."""
    last = run.trajectory[-1] if run.trajectory else None
    left = run.remaining_s()
    if (
        last is None
        or last.purpose != "confirm"
        or not last.valid
        or (last.decided and not last.sustainable)
        or last.rate >= top
        or left < MIN_LOOK_S / 2
    ):
        return None
    plan = StepPlan(last.rate, left, "confirm")
    verdict = await run.longer(plan, run.pooled_s() + left, stop, capped=False)
    return verdict if verdict.sustainable and _surely(run, verdict) else None


def _surely(run: Run, look: StepVerdict) -> bool:
    """Whether ``look``, the step just run, passes surely at the probe's confidence: its
    latency counted as clustered as the probe has seen near its rate (``as_clustered``),
    its errors with every request sent at its rate (``failures_at``)."""
    errors, sent = failures_at(run, look.rate)
    level = 1.0 - run.cfg.confidence
    return sure_pass(as_clustered(run, look), level, errors, sent, run.policy.max_error_rate)


def _answered(
    est: CapacityEstimate, rate: float, high: float | None, reason: str
) -> tuple[CapacityEstimate, bool | None, str]:
    """The estimate confirmed at ``rate``: its interval from there (or below, where the
    search's already was) up to ``high``."""
    low = est.ci_low if est.ci_low is not None and est.ci_low <= rate else rate
    return replace(est, capacity_rps=rate, ci_low=low, ci_high=high), True, reason


def as_clustered(run: Run, look: StepVerdict) -> StepVerdict:
    """``look`` with its requests worth as many independent ones as the clustering the
    probe has seen near its rate says (``health.timescale``, steps offered up to
    ``REACH`` × its rate), when that is more than its own: a minute at 114 req/s over
    gRPC held 0 of 6,872 requests beyond the bound, where the steps had seen late
    requests come 91 together, and a 60 s check at that rate then failed (p99 447 ms
    against 400). Worth 75 independent requests, its pass was no evidence."""
    seen = run.time_scale(below=look.rate * REACH).dispersion
    return replace(look, dispersion=seen) if seen > look.dispersion else look


def covered(run: Run, rate: float, share: float) -> bool:
    """Whether the step just run at ``rate`` is as long as the server's slow behaviour
    seen so far asks (``TimeScale.cover_s`` for late requests at ``share``, read again
    with the look's own windows in)."""
    return share <= 0.0 or run.pooled_s() >= run.time_scale().cover_s(rate, share)


def clustering_read(run: Run, look: StepVerdict) -> bool:
    """Whether the run has read how late requests cluster near ``look``'s rate (a
    ``TimeScale`` with a dispersion, from the search's steps and the look's own windows):
    a look may pass a confirmation early only then. Without it, no late request among a
    minute's requests is no evidence: a queue's late requests come in its busy periods,
    and a server exactly at its boundary (one instance, 50 ms at CV 0.5, 12.6 req/s
    against p99<400ms) showed none, or one or two, in 19 of 40 first looks of a minute
    run alone, each then passed as sure (``tests/test_probe_budget.py``'s law on a
    simulated server)."""
    return run.time_scale(below=look.rate * REACH).dispersion > 0.0


def bisected(run: Run, failed: float) -> float:
    """Under a budget, the highest rate a confirmation after one that failed at ``failed``
    runs at: the geometric midpoint of it and the highest rate the search held below it
    (the last looks' first rung, ``_ladder``); ``failed`` when the search held none.
    Set on the development cases of ``benchmarks/llm_capacity.py --budget 900`` (the
    ``llm`` preset under its own SLO and under ``ttft_p95<300ms,tpot_p95<40ms``): a
    third of the way down answered lower in two of three probes there."""
    ladder = _ladder(run, failed)
    if not ladder:
        return failed
    return math.sqrt(ladder[0] * failed)


LADDER_DROP = 0.15
"""After a last look fails, the next is at least this far below it: a rate just under
one that failed is as doubtful (the largest calibrated back-off, ``MAX_CALIBRATED_BACKOFF``)."""


def _ladder(run: Run, top: float) -> list[float]:
    """The rates ``fallback`` looks at, in order: the highest sure pass (when above the
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
``_warmup.WARMUP_SHARE`` included); the confirmation has the rest."""
STEP_SHARE = 0.15
"""Under a budget, no step is capped longer than this share of it (unless its
percentile needs more to decide): a search of several steps fits in its share."""


def within_budget(run: Run, est: CapacityEstimate) -> tuple[CapacityEstimate, bool | None, str]:
    """The answer when the budget ran out before a confirmation decided: the highest rate
    a run of at least ``MIN_LOOK_S`` held surely (``sequential.sure_pass`` at the
    probe's confidence, shared among the runs it is chosen from), below every decided
    failure; the lowest of those bounds it above."""
    cfg = run.cfg
    budget = cfg.budget_s
    failed = decided_failures(run)
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
    sure = [v for v, s in candidates if sure_pass(v, level, failures(s), s.sent, max_error)]
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


def failures(s: StepSummary) -> int:
    """A step's requests that count against the SLO's error bound."""
    return s.errors + s.timeouts + s.incomplete + s.dropped


def failures_at(run: Run, rate: float) -> tuple[int, int]:
    """(failures, requests sent) over every valid step run at exactly ``rate``: a last
    look at a rate the search held has that step's requests for its error bound too (one
    rate, one server: nothing chosen by its errors). ``errors<0.1%`` needs 2,995 requests
    none of which failed, and at an LLM endpoint's 20 req/s a look of its own then
    needs 2½ minutes."""
    same: list[tuple[StepVerdict, StepSummary]] = []
    for v, s in zip(run.trajectory, run.judged, strict=True):
        if v.rate != rate:
            continue
        if v.pooled_s > 0.0 and same and same[-1][0].rate == rate:
            same.pop()  # judged again within this one (``Run.longer``): counted once
        same.append((v, s))
    kept = [s for v, s in same if v.valid]
    return sum(failures(s) for s in kept), sum(s.sent for s in kept)


async def looked(
    run: Run, plan: StepPlan, stop: asyncio.Event, *, early_pass: bool = True
) -> tuple[StepVerdict, Decision | None]:
    """One confirmation run in looks (``probe.sequential``): its verdict, and HELD or
    FAILED when a look decided it early; None when it ran its full length (or the
    budget's), judged then as one run would be. ``early_pass`` False runs a look that
    holds on to the full length (a failure still stops it at once).

    A look passes early only once the run covers the server's slow behaviour seen so far
    (``covered``). Under a budget the first look, at least that cover, is not cut to the
    search's step cap (``STEP_SHARE`` of the budget, meant for the search's many steps)
    but to the budget left (``Run.within_budget``): cut to 45 s under ``--budget 5m``, a
    look passed a server reloading every 240 s in a quiet stretch (+12.4 %)."""
    cfg = run.cfg
    q = cfg.quantile()
    share = 1.0 - q if q is not None else 0.0
    cover = run.time_scale().cover_s(plan.rate, share) if q is not None else 0.0
    first = first_look_s(plan.rate, share, cfg.confidence, cover)
    lengths = look_lengths(first, plan.duration_s)
    first_plan = replace(plan, duration_s=lengths[0])
    budgeted = cfg.budget_s is not None
    verdict = await run.step(first_plan, stop, settle=False, pool=not budgeted, capped=not budgeted)
    max_error = run.policy.max_error_rate
    for look, length in enumerate(lengths):
        if look and run.pooled_s() < length:
            if run.remaining_s() < MIN_LOOK_S / 2:
                break  # the budget is spent: judged as it stands
            verdict = await run.longer(plan, length, stop)
        s = run.judged[-1]
        clustered = as_clustered(run, verdict)
        outcome = judge_look(clustered, look, cfg.confidence, failures(s), s.sent, max_error)
        early = early_pass and outcome is Look.HELD and look < len(lengths) - 1
        if early and covered(run, plan.rate, share) and clustering_read(run, verdict):
            return verdict, Decision.HELD
        if outcome is Look.FAILED:
            return verdict, Decision.FAILED
        if not verdict.valid:
            return verdict, None
    return run.settle(verdict), None
