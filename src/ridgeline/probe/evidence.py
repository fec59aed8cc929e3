"""What a budgeted probe's answer and its interval rest on (``ProbeConfig.budget_s``):
the failures decided at the probe's confidence (``decided_failures``), less those the
server outpaced later (``outpaced``: it got faster), bound the interval from above
(``decided_ceiling``, which names a failure so dropped); an answer above what the
server delivered after it slowed (``slowed``: a neighbour's busy minutes, a reload) is
set aside (``unslowed``). Pure functions of the steps measured; called by
``probe.orchestrator`` and ``probe.budget``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from statistics import NormalDist

from ridgeline.probe._run import Run
from ridgeline.search.base import CapacityEstimate, StepVerdict

__all__ = [
    "decided_ceiling",
    "decided_failure",
    "decided_failures",
    "outpaced",
    "slowed",
    "unslowed",
]


def decided_ceiling(run: Run, est: CapacityEstimate) -> tuple[float | None, str]:
    """The upper end of a budgeted answer's interval, and what the reason adds about it.
    The end: the lowest rate above the interval's lower end (or its answer) whose
    failure was decided (``StepVerdict.decided``: too many beyond the bound to be chance
    at the probe's confidence) and not outpaced later (``outpaced``), None when none
    was. A failure left undecided is no evidence the capacity lies below it: under a
    stall every 6.5 s a 45 s step at 141 req/s had 68 of 6,323 beyond (63 allowed) where
    the long-run share is 0.87 %, and an interval ending there missed a truth near 200
    req/s.

    Nor is any failure when the warm-up's cap ended it with its p50 seen still falling
    (``Warmed.capped`` after a trend was tested, ``fall_windows``): it was measured on a
    server that was getting faster. The answer stands (it held); above it, nothing is
    known. A cap reached before any trend was tested (a ramp that took the warm-up's
    share) saw no warming there; a failure the server outpaced later is dropped all the
    same.

    The note (empty when none): the lowest failure above the answer and below the end
    kept that was outpaced, what it delivered and the hold that outpaced it."""
    floor = est.ci_low if est.ci_low is not None else est.capacity_rps
    gone = outpaced(run.trajectory, run.cfg.confidence)
    above = [
        (i, v)
        for i, v in enumerate(run.trajectory)
        if decided_failure(v) and (floor is None or v.rate > floor)
    ]
    ceiling = min((v.rate for i, v in above if i not in gone), default=None)
    warmed = run.warmed
    if warmed is not None and warmed.capped and warmed.fall_windows > 0:
        ceiling = None
    top = math.inf if ceiling is None else ceiling
    dropped = [(v, gone[i]) for i, v in above if i in gone and v.rate < top]
    if not dropped:
        return ceiling, ""
    failure, later = min(dropped, key=lambda pair: pair[0].rate)
    return ceiling, (
        f"; the failure at {failure.rate:g} req/s bounds nothing: it delivered "
        f"{failure.achieved_rps:.4g} req/s, and the server held {later.rate:g} req/s "
        "after it (it got faster)"
    )


def outpaced(trajectory: Sequence[StepVerdict], confidence: float) -> dict[int, StepVerdict]:
    """The decided failures (by their index in ``trajectory``) that a later step
    outpaced, each with the first step that did: one that held a rate above the
    throughput the failure delivered (``achieved_rps``, answers a second), by more than
    that throughput's counting noise at ``confidence`` (one-sided; a count of ``samples``
    requests varies by its square root at most). A server that cannot keep up completes
    at its service rate, and a stationary one never holds more than that; holding more
    later says it got faster (warming over hundreds of thousands of requests, a compile
    finished, a neighbour gone quiet), and a failure measured before is no upper end of
    what it serves now.

    Set on the bank's development half under ``--budget 5m`` (``benchmarks/budget_bank.py
    --split dev``, 470 probes): 396 → 419 intervals hold the truth; 23 upper ends below
    it dropped, all on warming servers; 9 right ones moved up to a later failure, none
    lost (on neighbours of 120-270 s cycles, and a server slower by its batching delay).
    Without the noise term, 428 held, but a failure at 3,337 req/s that delivered 3,301
    was outpaced by a hold at 3,302: chance, not a faster server. A failure only on the
    tail (the server kept up, its p99 did not) is outpaced only by a hold above its own
    rate; a server warming that slowly is not seen this way."""
    gone: dict[int, StepVerdict] = {}
    for i, failure in enumerate(trajectory):
        if not decided_failure(failure):
            continue
        delivered = _at_most(failure, confidence)
        later = next((v for v in trajectory[i + 1 :] if v.sustainable and v.rate > delivered), None)
        if later is not None:
            gone[i] = later
    return gone


def slowed(
    trajectory: Sequence[StepVerdict], confidence: float, below: float
) -> tuple[StepVerdict, float] | None:
    """The first decided failure that delivered less than ``below`` and less than an
    earlier step had (its ``achieved_rps`` under both by more than its count's noise at
    ``confidence``), with what the earlier step delivered; None when none did. A server
    that warms only gets faster; one that slows again has phases (a neighbour's busy
    minutes, a reload), and a rate held in its fast phase says nothing of its slow one."""
    fastest = 0.0
    for v in trajectory:
        if decided_failure(v):
            delivered = _at_most(v, confidence)
            if delivered < min(fastest, below):
                return v, fastest
        if v.valid:
            fastest = max(fastest, v.achieved_rps)
    return None


def unslowed(
    run: Run, est: CapacityEstimate, confirmed: bool | None, reason: str
) -> tuple[CapacityEstimate, bool | None, str]:
    """A budgeted answer, unless the server slowed during the probe to less than the
    answer (``slowed``): then no capacity (the interval keeps no lower end, and its upper
    end is ``decided_ceiling``'s), and the reason says what the server delivered while
    slow. A budget covers a cycle of a few minutes at most; an answer held in a
    neighbour's quiet phase, above what the server delivered in its busy one, is an
    over-estimate as large as the neighbour's toll. The development half of the bank
    under ``--budget 5m`` (470 probes): 8 answers set aside, all above the truth by
    4-177 % (neighbours of 120-270 s cycles), none of the 232 at or below it."""
    answer = est.capacity_rps
    if answer is None:
        return est, confirmed, reason
    seen = slowed(run.trajectory, run.cfg.confidence, answer)
    if seen is None:
        return est, confirmed, reason
    failure, fastest = seen
    reason = (
        f"{reason}; but the server slowed during the probe: it delivered "
        f"{failure.achieved_rps:.4g} req/s failing at {failure.rate:g} after delivering "
        f"{fastest:.4g}, so {answer:g} req/s was held in a faster phase and says nothing "
        "of its slow one: no capacity to report (raise --budget to cover a slow phase)"
    )
    return replace(est, capacity_rps=None, ci_low=None), None, reason


def decided_failure(v: StepVerdict) -> bool:
    """A valid step that failed, decided (not a coin toss at the probe's confidence)."""
    return v.valid and not v.sustainable and v.decided


def decided_failures(run: Run) -> list[float]:
    """The rates of the valid steps that failed, decided (not a coin toss at the probe's
    confidence): the only failures a budgeted answer's bounds rest on."""
    return [v.rate for v in run.trajectory if decided_failure(v)]


def _at_most(failure: StepVerdict, confidence: float) -> float:
    """The most a failure's throughput (``achieved_rps``) may have been at ``confidence``
    (one-sided): a count of ``samples`` requests varies by its square root at most
    (Poisson arrivals; a server that fell behind completes more evenly)."""
    z = NormalDist().inv_cdf(confidence)
    return failure.achieved_rps * (1.0 + z / math.sqrt(max(failure.samples, 1)))
