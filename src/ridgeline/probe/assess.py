"""From a step's records to its verdict: window health with
hysteresis (the timeline), and one step-level assessment (what the strategy is told).

The timeline is window by window: each window is assessed, then smoothed (a state moves
only after K agreeing windows; a short spike does not move it). The step's verdict rests
on the step as a whole — every request it scheduled, spike windows
included — so a p99 bound is judged on the step's own p99, not on the p99 of one-second
samples, and is the worse of that and the state the timeline settled in. Spike tolerance
smooths the *timeline*; it never takes requests out of the SLO: a stall every few
seconds is how the server behaves, not a transient to censor. A one-off hiccup of the
host is the search's to handle, by re-testing the step (its quarters are the evidence).

Token-level bounds (``ttft_p99``, ``itl_p99``, ``tpot_p99``) are judged as the
end-to-end ones are, each on its own samples: TTFT over the requests that produced a
first token, TPOT over the successful requests of two tokens or more, ITL over every
gap — samples that come clustered by request (one slow decode slows all its gaps), so
their dispersion is taken over requests as well as over time slices, and a step's
thousands of gaps count as the independent ones they are worth.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

import numpy as np

from ridgeline._same_named import same_named
from ridgeline.health.engine import assess, observation_from_window
from ridgeline.health.hysteresis import HysteresisConfig, HysteresisState, smooth
from ridgeline.health.judge import judge
from ridgeline.health.metrics import DEFAULT, METRICS
from ridgeline.health.sampling import (
    BATCHES,
    QUANTILES,
    binomial_sf,
    dispersion,
    needed_samples,
    quantile_interval,
)
from ridgeline.health.slo import LatencyBound, SLOPolicy
from ridgeline.health.state import HealthState, Observation
from ridgeline.loadgen.step import StepResult
from ridgeline.search.base import StepPlan, StepVerdict
from ridgeline.telemetry.records import Outcome, Records

_EPS = 1e-3


@dataclass
class StepAssessment:
    verdict: StepVerdict
    timeline: list[dict[str, object]] = field(default_factory=list)
    """One entry per window: t_s (from the probe's start), step, state, score, reason."""


def assess_step(
    result: StepResult,
    plan: StepPlan,
    policy: SLOPolicy,
    hysteresis: HysteresisConfig,
    *,
    step_index: int,
    t0_s: float,
    gpu_problems: tuple[str, ...] = (),
    gpu_utilisation: float | None = None,
    confidence: float = 0.95,
    family: int = 1,
    confirm_requests: int = 0,
) -> StepAssessment:
    """The step's verdict and its timeline. ``confidence`` sets the interval reported
    for the judged percentile and how sure a failure on few requests must be to decide
    (``Tail``). A confirmation that held decides only on the ``confirm_requests`` it was
    sized for, counted as effective requests (``Tail.effective``): one whose requests
    beyond the bound came in clusters ran too short and is undecided. Every request of
    the step is judged: the probe's warm-up phase is where a server warms, and nothing
    of a step is censored
    (a steady-state cut once dropped the first 5-65 s of a third of the steps and
    passed some that failed over all their requests)."""
    wins = result.windows
    obs = [
        observation_from_window(w, gpu_problems=gpu_problems, gpu_utilisation=gpu_utilisation)
        for w in wins
    ]
    hs = HysteresisState.initial()
    timeline: list[dict[str, object]] = []
    smoothed = HealthState.HEALTHY
    late = late_counts(result, policy)
    for k, (w, o) in enumerate(zip(wins, obs, strict=True)):
        a = assess(o, policy, obs[:k])
        smoothed, hs = smooth(hs, a, hysteresis)
        w.state, w.score = smoothed.value, a.score
        timeline.append(
            {
                "t_s": t0_s + w.start_s,
                "step": step_index,
                "state": smoothed.value,
                "score": a.score,
                "reason": a.reason,
                "late": late[k],
            }
        )
    grace = _grace_s(result, policy)
    step_obs = _step_observation(result, grace, policy)
    step_obs = replace(step_obs, gpu_problems=gpu_problems, gpu_utilisation=gpu_utilisation)
    # the verdict is the step's own: every request at once, the windows as its history
    # (the latency trend). The windows' smoothed states are the timeline only: a 1 s
    # window holding one stall, or one error under errors<0.1%, fails its own bounds on
    # a handful of requests, and no count of such windows is the SLO
    a = assess(step_obs, policy, obs)
    state = a.state
    score = a.score
    if not state.sustainable and score <= 1.0:
        score = 1.0 + _EPS
    elif state.sustainable and score > 1.0:
        score = 1.0
    s = result.summary
    reason = a.reason
    if not s.valid:
        reason = f"invalid step: {s.invalid_reason}"
    quarters = quarter_scores(result, grace, policy)
    tail = tail_count(result, policy, confidence)
    shortfall = 1.0
    decided = tail.decides(state.sustainable, step_obs, policy, confidence, family) or not s.valid
    if decided and s.valid and plan.purpose == "confirm" and not tail.plain(confidence, family):
        wanted = min(confirm_requests, tail.samples)
        decided = tail.effective >= wanted
        shortfall = wanted / max(tail.effective, 1e-9)
        if not decided:
            reason = (
                f"undecided: {reason}, but requests beyond the bound came in clusters "
                f"(dispersion {tail.dispersion:.1f}): its {tail.samples} requests are "
                f"worth {tail.effective:.0f} independent ones, and a confirmation needs "
                f"{confirm_requests}"
            )
    elif not decided:
        reason = (
            f"undecided: {reason}, but on {tail.samples} requests "
            f"({tail.beyond} beyond the bound, {tail.allowed:.1f} allowed) — "
            f"this SLO needs {tail.needed} to decide"
            + (
                f" (clustered: dispersion {tail.dispersion:.1f}, worth {tail.effective:.0f})"
                if tail.dispersion > 1.0
                else ""
            )
        )
    verdict = same_named(
        StepVerdict,
        plan,  # rate, duration_s, purpose
        tail,  # samples, beyond, allowed, interval_ms, dispersion
        state=state,
        score=score,
        valid=s.valid,
        achieved_rps=step_obs.achieved_rps,
        p99_ms=step_obs.latency_ms.get("p99"),
        reason=reason,
        score_se=score_se(quarters),
        quarters=quarters,
        judged=tail.percentile,
        decided=decided,
        shortfall=shortfall if not decided else 1.0,
    )
    steady = step_obs.achieved_rps >= STEADY * step_obs.offered_rps
    for entry in timeline:  # a step its server kept up with: its late requests come and
        entry["steady"] = steady  # go with the server's behaviour (``health.timescale``)
        entry["rate"] = step_obs.offered_rps
    return StepAssessment(verdict, timeline)


def _grace_s(result: StepResult, policy: SLOPolicy) -> float:
    """How long after the step's end an answer still counts in its throughput: the
    SLO's end-to-end bound, or (bounding token metrics only) the step's own p99 answer
    time: a long answer scheduled near the end is no shortfall."""
    e2e = [b.bound_ms for b in policy.latency if b.metric == DEFAULT]
    if e2e or not policy.latency:
        return max(e2e, default=0.0) / 1000.0
    return (result.summary.latency_ms.p99 or 0.0) / 1000.0


def _step_observation(result: StepResult, grace_s: float, policy: SLOPolicy) -> Observation:
    """The step as one observation: every request it scheduled;
    throughput from successful answers that came by the step's end plus ``grace_s`` (the
    SLO's latency bound: a request scheduled near the end may still answer in time)."""
    lo, end = _span(result)
    return _observation(result, lo, end, grace_s, policy)


def _span(result: StepResult) -> tuple[float, float]:
    wins = result.windows
    return (wins[0].start_s if wins else 0.0), result.summary.duration_s


def _observation(
    result: StepResult, lo: float, end: float, grace_s: float, policy: SLOPolicy
) -> Observation:
    """Every request scheduled in [lo, end), as one observation: the judge's statistics
    of every metric the SLO bounds, and end-to-end latency."""
    rec = result.records
    keep = (rec.scheduled >= lo) & (rec.scheduled < end)
    j = judge(rec, policy, keep)
    span = max(end - lo, 1e-9)
    ok = keep & (rec.outcome == int(Outcome.OK))
    in_span_ok = ok & (rec.done <= end + grace_s)
    return Observation(
        start_s=lo,
        end_s=end,
        offered_rps=float(keep.sum()) / span,
        achieved_rps=float(in_span_ok.sum()) / span,
        error_rate=j.error_rate,
        latency_ms=j.statistics[DEFAULT],
        answered=j.answered,
        token_ms={m: stats for m, stats in j.statistics.items() if m != DEFAULT},
    )


@dataclass(frozen=True, slots=True)
class Tail:
    """The step's requests against the SLO's tightest percentile bound."""

    samples: int
    """Requests judged (sent in the step)."""
    beyond: int
    """Of those, how many took longer than the bound (or got no answer)."""
    allowed: float
    """How many the percentile allows: samples × (1 − q)."""
    percentile: str = ""
    """The bound's name (``p99``, ``ttft_p99``); empty when the SLO bounds none."""
    needed: int = 0
    """The fewest requests that can decide the step (``sampling.needed_samples``: its
    percentile bound's, or its error bound's, whichever needs more)."""
    interval_ms: tuple[float, float] | None = None
    """The percentile's distribution-free confidence interval, ms."""
    dispersion: float = 1.0
    """How many requests one independent one is worth (``sampling.dispersion`` over the
    step's time slices): 1 unless those beyond the bound came in clusters."""

    @property
    def quantile(self) -> float | None:
        """The bound's quantile (0.99 for ``ttft_p99``); None when the SLO bounds none."""
        return QUANTILES.get(self.percentile.rpartition("_")[2])

    @property
    def effective(self) -> float:
        """The requests judged, as independent ones: ``samples / dispersion``."""
        return self.samples / self.dispersion

    def plain(self, confidence: float, family: int = 1) -> bool:
        """Whether the step failed too plainly for chance, counted in effective
        requests: more beyond the bound than ``1 − q`` of them at ``(1 − confidence) /
        family`` (``decides``' shortcut)."""
        q = self.quantile
        if q is None:
            return False
        d = self.dispersion
        beyond, samples = round(self.beyond / d), round(self.samples / d)
        return binomial_sf(beyond, samples, 1.0 - q) <= (1.0 - confidence) / max(family, 1)

    def decides(
        self,
        sustainable: bool,
        obs: Observation,
        policy: SLOPolicy,
        confidence: float,
        family: int = 1,
    ) -> bool:
        """Whether the step can decide: it had the requests its percentile needs (its
        error bound's, when only the errors failed it), or it failed so plainly that
        fewer settle it (``sampling.exceeds``: too many beyond
        the bound, or too many errors, to be chance). Requests are counted as effective
        ones (``effective``): when those beyond the bound came in clusters (one stall in a
        short step), a step of thousands is worth a few hundred, and a narrow failure on
        it is a draw of how many stalls the step caught. A pass on fewer requests is
        provisional, never the last word: a confirmation of its own length follows
        every estimate. A narrow failure on few requests is a coin toss, and the probe
        runs it again, long enough. The shortcut must hold across the ``family`` of steps
        a probe may run (Bonferroni: ``(1 − confidence)/family``): one error in the first
        5 requests under ``errors<0.1%`` is a 1-in-200 draw, which a probe of 60 steps
        meets often enough to end a search on it.

        With enough requests, a failure by the count beyond the bound (or by errors)
        still decides only when it is no coin toss at ``confidence`` (one-sided, this
        step alone): 51 beyond where 50.5 are allowed is a draw, and more of the same
        run (pooled) settles it. A failure by another metric (a rising latency trend)
        decides on the requests alone."""
        if sustainable:
            return True
        alpha = (1.0 - confidence) / max(family, 1)
        if self.plain(confidence, family):
            return True
        errors = round(obs.error_rate * obs.answered)
        if binomial_sf(errors, obs.answered, policy.max_error_rate) <= alpha:
            return True
        level = 1.0 - confidence
        if obs.error_rate > policy.max_error_rate and self.beyond <= self.allowed:
            # the latency held: the errors decide, and they need a count of their own
            return (
                self.samples >= needed_samples(policy, confidence, errors=True)
                and binomial_sf(errors, obs.answered, policy.max_error_rate) <= level
            )
        if self.beyond > self.allowed:
            return self.effective >= self.needed and self.plain(confidence)
        return self.effective >= self.needed


def tail_count(result: StepResult, policy: SLOPolicy, confidence: float) -> Tail:
    """The step's samples against the SLO's percentile bounds (a mean or max
    bound has no proportion to count), each bound counted on its own samples: the one a
    failure is plainest on (most beyond its allowance), else, of those with the highest
    percentile, the one whose samples are worth the fewest independent ones."""
    rec = result.records
    lo = _span(result)[0]
    judged = (rec.scheduled >= lo) & (rec.outcome != int(Outcome.NOT_SENT))
    bounds = [b for b in policy.latency if b.percentile in QUANTILES]
    needed = needed_samples(policy, confidence)
    if not bounds:
        return Tail(int(judged.sum()), 0, 0.0, needed=needed)
    tails = [
        _tail(rec, judged, lo, result.summary.duration_s, b, needed, confidence) for b in bounds
    ]
    failing = [t for t in tails if t.beyond > t.allowed]
    if failing:
        return max(failing, key=lambda t: t.beyond / max(t.allowed, 1e-9))
    top = max(t.quantile or 0.0 for t in tails)
    return min((t for t in tails if t.quantile == top), key=lambda t: t.effective)


def _tail(
    rec: Records,
    judged: np.ndarray,
    lo: float,
    end: float,
    bound: LatencyBound,
    needed: int,
    confidence: float,
) -> Tail:
    """One bound's samples counted: how many, how many beyond it, its interval and the
    dispersion of those beyond over the step's time slices (and over requests, for the
    gaps of ITL, which each request contributes many of)."""
    q = QUANTILES[bound.percentile]
    taken = METRICS[bound.metric].samples(rec, judged)
    values, when, owner = taken.values, taken.when, taken.owner
    late = ~(values <= bound.bound_ms / 1000.0)  # NaN (no answer) counts beyond
    samples = int(values.size)
    low, high = quantile_interval(values, q, confidence)
    edges = np.linspace(lo, max(end, lo + 1e-9), BATCHES + 1)[1:-1]
    slot = np.searchsorted(edges, when, side="right")
    spread = dispersion(
        np.bincount(slot, weights=late, minlength=BATCHES),
        np.bincount(slot, minlength=BATCHES),
        confidence,
    )
    if owner is not None and samples:
        spread = max(
            spread,
            dispersion(np.bincount(owner, weights=late), np.bincount(owner), confidence),
        )
    return Tail(
        samples,
        int(late.sum()),
        samples * (1.0 - q),
        bound.name,
        needed,
        (low * 1000.0, high * 1000.0),
        spread,
    )


def late_counts(result: StepResult, policy: SLOPolicy) -> list[int]:
    """Per window of ``result``, its requests (by scheduled send) that took longer than
    the SLO's tightest end-to-end bound or got no answer: what ``health.timescale`` reads
    the server's slowest time scale from. Zeros when the SLO bounds no end-to-end
    latency."""
    wins = result.windows
    bounds = [b.bound_ms for b in policy.latency if b.metric == DEFAULT]
    if not wins or not bounds:
        return [0] * len(wins)
    rec = result.records
    taken = METRICS[DEFAULT].samples(rec, rec.outcome != int(Outcome.NOT_SENT))
    late = taken.when[~(taken.values <= min(bounds) / 1000.0)]
    width = max(wins[0].end_s - wins[0].start_s, 1e-9)
    slot = np.clip((late // width).astype(np.int64), 0, len(wins) - 1)
    return [int(k) for k in np.bincount(slot, minlength=len(wins))]


STEADY = 0.97
"""A step whose answers kept up with this share of its offered rate kept its queue: its
late requests are the server's behaviour, not a queue growing through the step."""
QUARTERS = 4


def quarter_scores(result: StepResult, grace_s: float, policy: SLOPolicy) -> tuple[float, ...]:
    """The scores of the step's ``QUARTERS`` consecutive time slices,
    each judged like the whole step; empty when a slice has no finite score."""
    lo, end = _span(result)
    width = (end - lo) / QUARTERS
    scores = []
    for q in range(QUARTERS):
        a, b = lo + q * width, lo + (q + 1) * width
        score = assess(_observation(result, a, b, grace_s, policy), policy).score
        if not 0.0 < score < math.inf:
            return ()
        scores.append(score)
    return tuple(scores)


def score_se(quarters: tuple[float, ...]) -> float:
    """The standard error of ln(score) for the step, from the spread of its quarters'
    scores: how far another run of the same length could land. 0 without quarters."""
    if len(quarters) < 2:
        return 0.0
    return statistics.stdev(math.log(q) for q in quarters) / math.sqrt(len(quarters))
