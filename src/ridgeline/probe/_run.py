"""One probe's bookkeeping (``Run``): each step measured, judged (pooled with the runs
before it while undecided), stored and told; the warm-up phase; the clock of
test-seconds."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

from ridgeline._same_named import same_named
from ridgeline.errors import TargetError, TargetUnreachableError
from ridgeline.health.metrics import METRICS
from ridgeline.health.sampling import QUANTILES, extrapolated_quantile
from ridgeline.health.slo import format_slo
from ridgeline.health.state import HealthState
from ridgeline.health.timescale import TimeScale, Window, time_scale
from ridgeline.loadgen.step import StepResult, joined
from ridgeline.probe.assess import assess_step
from ridgeline.probe.config import (
    AtCapacity,
    ProbeConfig,
    ProbeResult,
    ProgressFn,
    StartFn,
    verdict_dict,
)
from ridgeline.probe.drivers import Driver
from ridgeline.search.base import CapacityEstimate, StepPlan, StepVerdict
from ridgeline.telemetry.gpu import GpuMonitor, gpu_problems, mean_utilisation
from ridgeline.telemetry.records import Outcome
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import StepSummary, with_goodput

MIN_BUDGET_STEP_S = 5.0
"""Under a budget, a step is not started with fewer seconds than this left."""
FEWEST_CLUSTERS = 1
"""A confirmation that held counts only if it could hold this many clusters of late
requests as the probe has seen them come (``health.timescale``): one shorter passed or
not by whether it caught one. (Three, tried on the dev half, backed the slow servers off
15 % below their truth: at 3.7 req/s a p99's late requests come 25 together every
11 minutes, and two of them in a 20-minute run are evidence, if thin.)"""
REACH = 1.25
"""…as the steps offered at most this much more than it saw them come: late requests
from a queue's busy periods cluster near saturation, not at a rate far below it (a
p99.9 at 2.2 req/s came 7 together, and its service-time tail at 1.2 req/s, alone,
does not); a stall's clusters are seen at every rate, and near it too."""
NEAR_BOUNDARY = 0.8
"""…when it held near the boundary (its score this or more: within a fifth of it)."""
UNSURE_SCORE = 2.0
"""The score an unsure confirmation fails at, at most (its interval's end may be
unbounded): a clear failure's, so that it backs off by up to 15 %."""
POOLED_CAPS = 2
"""An undecided step pools runs up to this many step caps (1,200 s by default): a server
whose late requests cluster in long busy periods gets twice the cap, never hours for one
point (see docs/probe.md)."""
UNDECIDED_RERUNS = 3
"""An undecided step gets at least this many more runs, each pooled with those before it
and at least doubling it, and more while it holds fewer requests than a confirmation
(errors at half their bound take some 10,000 requests to tell from it); then its verdict
stands as measured."""


_TRANSPORT = (
    "connect",
    "connection",
    "disconnected",
    "unavailable",
    "timeout",
    "reset",
    "broken pipe",
    "incomplete",
)


def _server_died(result: StepResult) -> str | None:
    """The server stopped answering: nothing came back but transport failures (a server
    answering errors is alive, and simply not sustainable at this rate)."""
    s = result.summary
    transport = all(any(t in k.lower() for t in _TRANSPORT) for k in s.error_kinds)
    if (
        s.sent > 0
        and s.ok == 0
        and s.dropped == 0
        and transport
        and (s.errors + s.timeouts + s.incomplete >= s.sent)
    ):
        kinds = ", ".join(f"{k} ×{n}" for k, n in list(s.error_kinds.items())[:3])
        return f"no request answered at {s.offered_rps:.1f} req/s ({kinds})"
    return None


class BudgetSpent(Exception):
    """The probe's budget (``ProbeConfig.budget_s``) has too little left for the next
    step: the probe ends with the best answer its steps so far support
    (``orchestrator``)."""


class Stopped(Exception):
    """The stop event ended a step (Ctrl-C through ``run_probe``): the probe ends,
    interrupted, with what it measured. A caller's cancellation is not this: it is
    passed on, so a probe inside a larger job (verify, the demo) never swallows it."""


class Run:
    """One probe's bookkeeping: the store, the timeline, the clock of test-seconds."""

    def __init__(
        self,
        driver: Driver,
        cfg: ProbeConfig,
        store: RunStore | None,
        gpu: GpuMonitor | None,
        on_step: ProgressFn | None = None,
        on_start: StartFn | None = None,
    ) -> None:
        self.driver, self.cfg, self.store, self.gpu = driver, cfg, store, gpu
        self.on_step, self.on_start = on_step, on_start
        self.policy = cfg.policy()
        self.timeline: list[dict[str, Any]] = []
        self._scales: dict[float, TimeScale] = {}
        """``time_scale``'s readings of the timeline as far as ``_read``, by ``below``."""
        self._steady: list[tuple[float, Window]] = []
        """The timeline's windows of steps that kept up, each with its offered rate, as far
        as ``_read`` (``time_scale`` adds the rest when asked)."""
        self._read = 0
        self.trajectory: list[StepVerdict] = []
        self.judged: list[StepSummary] = []
        """The summary each verdict judged (pooled runs as one), goodput included."""
        self.t_s = 0.0
        self.spent_s = 0.0
        self.reserve_s = 0.0
        """Seconds of the budget kept back from the steps now running (for a last look:
        ``budget.fallback``)."""
        """Seconds the probe has cost so far: each run's length, or the wall time it took
        when longer (connecting, draining): what ``budget_s`` is counted in."""
        self.index = 0
        self.warmup_s = 0.0
        self.warmup_requests = 0
        """Seconds and requests of the warm-up phase (``warmup``)."""
        self.warmed: Warmed | None = None
        self.uncovered: str | None = None
        """Why the last confirmation could not last as long as the server's slow
        behaviour asked (``orchestrator._covering``), said in the answer."""
        """What the warm-up phase did, once it has run."""
        self.excluded_s = 0.0
        """Seconds the steady-state detector left out of the steps' verdicts."""
        self.sent = 0
        self.run_id: int | None = None
        self._interrupted = False
        self._last: StepResult | None = None
        """The last step as judged (pooled runs included): what a rerun pools with."""
        self.family = int(cfg.strategy_options.get("max_steps", 60))
        """The steps a probe may run: a failure on few requests must be too plain for
        chance in any of them (``StepVerdict.decided``)."""

    def opened(self) -> None:
        """The run is stored from its first measured step: an endpoint that fails its
        connect check leaves nothing behind but the error."""
        if self.store is not None and self.run_id is None:
            self.run_id = self.store.create_run(
                "probe", self.driver.describe(), self.cfg.model_dump()
            )

    def pooled_s(self) -> float:
        """The length of the last step as judged (its pooled runs together)."""
        return self._last.summary.duration_s if self._last is not None else 0.0

    def remaining_s(self) -> float:
        """Seconds of the budget left (infinite without one), less ``reserve_s``."""
        budget = self.cfg.budget_s
        return math.inf if budget is None else budget - self.spent_s - self.reserve_s

    def within_budget(self, plan: StepPlan, least_s: float = 0.0) -> StepPlan:
        """``plan`` cut to the budget left; ``BudgetSpent`` when less than ``least_s``
        (and ``MIN_BUDGET_STEP_S``) is left: a step too short to say anything is no
        step."""
        left = self.remaining_s()
        if left >= plan.duration_s:
            return plan
        if left < max(least_s, MIN_BUDGET_STEP_S):
            raise BudgetSpent
        return replace(plan, duration_s=left)

    async def measure(self, plan: StepPlan, seed: int, stop: asyncio.Event) -> StepResult:
        began = time.monotonic()
        try:
            result = await self.driver.run(plan, seed, stop)
        except TargetUnreachableError as exc:
            if self.index == 0:
                raise  # the connect check: nothing measured, nothing stored
            raise TargetError(f"the server stopped answering at step {self.index}: {exc}") from exc
        finally:
            # in virtual time a step costs its length; in real time, the wall time it
            # took when longer (connecting, draining)
            wall = time.monotonic() - began if self.driver.name != "sim" else 0.0
            self.spent_s += max(plan.duration_s, wall)
        self.opened()
        self.sent += result.summary.sent
        return result

    async def step(
        self,
        plan: StepPlan,
        stop: asyncio.Event,
        *,
        settle: bool = True,
        pool: bool = True,
        capped: bool = True,
    ) -> StepVerdict:
        """Run ``plan`` (its length within the caps, ``ProbeConfig.capped_s``), record
        its verdict in the trajectory and tell ``on_step``. A failure on too few requests
        to decide (``StepVerdict.decided``), or a confirmation whose clustered requests
        were worth too few independent ones, gets more of the same: another run at the
        rate, judged together with the runs before it as one step
        (``loadgen.step.joined``). Runs are added until the evidence decides, or at
        least ``UNDECIDED_RERUNS`` have been added and the pooled step holds a
        confirmation's requests, or it reaches ``POOLED_CAPS`` step caps. Each adds what
        the evidence says is missing (at least doubling the step); nothing measured is
        thrown away. The verdict returned is the pooled one. Under a budget, every run is
        cut to what is left of it (``within_budget``). ``settle``: a confirmation that
        held is checked for evidence enough (``settle``); a sequential look, which
        decides that itself, leaves it, and ``pool`` False leaves an undecided failure as
        it is (the look after it pools more, or the look's rule judges it); ``capped``
        False leaves the step caps to the budget (a last look takes what is left)."""
        if capped:
            plan = replace(plan, duration_s=self.cfg.capped_s(plan.rate, plan.duration_s))
        plan = self.within_budget(plan, self.cfg.needed_s(plan.rate))
        verdict = await self._assessed(plan, stop)
        total = plan.duration_s
        caps = POOLED_CAPS if self.cfg.budget_s is None else 1  # a budget has no time twice
        limit = caps * self.cfg.capped_s(plan.rate, math.inf)
        for reruns in itertools.count():
            if verdict.decided or not pool:
                break
            if reruns >= UNDECIDED_RERUNS and verdict.samples >= self.cfg.confirm_count():
                break  # as much as a confirmation: the verdict stands as measured
            # enough alone, though the steady-state detector may exclude a start; a
            # clustered confirmation as long as its dispersion says it needs
            wanted = max(
                total * 2,
                self.cfg.needed_s(plan.rate) * 1.25,
                total * verdict.shortfall * 1.25,
            )
            more = min(self.cfg.capped_s(plan.rate, wanted - total), limit - total)
            more = min(more, self.remaining_s())
            if more < max(1e-6 * total, MIN_BUDGET_STEP_S if self.cfg.budget_s else 0.0):
                break  # the pooled step is as long as the caps (or the budget) allow
            verdict = await self._assessed(replace(plan, duration_s=more), stop, pool=self._last)
            total += more
        if settle and plan.purpose == "confirm" and verdict.sustainable:
            verdict = self._unsure(verdict)
        return verdict

    def settle(self, held: StepVerdict) -> StepVerdict:
        """A confirmation's last verdict checked for evidence enough (``_unsure``)."""
        return self._unsure(held) if held.sustainable else held

    def time_scale(self, below: float = math.inf) -> TimeScale:
        """How the server's late requests have come so far, in the steps whose server
        kept up with their rate (``health.timescale``), offered at most ``below``."""
        # the timeline only grows: a reading stands until a step adds to it (a probe asks
        # for one after every step and confirmation, and a long probe has 100k windows)
        seen = len(self.timeline)
        if seen != self._read:
            self._scales.clear()  # readings of a shorter timeline
        elif (cached := self._scales.get(below)) is not None:
            return cached
        for e in self.timeline[self._read :]:
            if e.get("steady"):
                self._steady.append(
                    (float(e["rate"]), Window(float(e["t_s"]), int(e["step"]), int(e["late"])))
                )
        self._read = seen
        windows = [w for rate, w in self._steady if rate <= below]
        gaps = [g for a, b in itertools.pairwise(windows) if (g := b.t_s - a.t_s) > 0]
        scale = time_scale(windows, statistics.median(gaps) if gaps else 1.0)
        self._scales[below] = scale
        return scale

    def _unsure(self, held: StepVerdict) -> StepVerdict:
        """A confirmation that held on too little evidence — still undecided at the caps
        (its requests worth too few independent ones), or too few requests for its
        percentile's interval to have an upper end at all (a p99.9 at 2 req/s holds some
        3 beyond it in 20 minutes) — stands only if the upper end of that interval is
        within the bound: a pass its evidence cannot tell from a failure is not a
        capacity. Else it counts as failed at that end's score, and the confirmation
        backs off from it."""
        judged = next((b for b in self.policy.latency if b.name == held.judged), None)
        q = QUANTILES.get(judged.percentile) if judged is not None else None
        seen = self.time_scale(below=held.rate * REACH)
        spacing = seen.spacing_s(held.rate, 1.0 - q) if q is not None else 0.0
        near = held.score >= NEAR_BOUNDARY  # far inside, a cluster more changes nothing
        if near and spacing > 0 and held.duration_s < FEWEST_CLUSTERS * spacing:
            return self._failed(
                held,
                UNSURE_SCORE,
                f"unsure: it held ({held.reason}), but late requests come in clusters some "
                f"{spacing:.0f} s apart at this rate, and its {held.duration_s:.0f} s could "
                f"hold {held.duration_s / spacing:.1f} of them, fewer than {FEWEST_CLUSTERS} "
                "(raise --max-step-s for more)",
            )
        high = held.interval_ms[1] if held.interval_ms is not None else math.inf
        if judged is None or high <= judged.bound_ms or (held.decided and math.isfinite(high)):
            return held
        bound = judged.bound_ms
        if math.isinf(high) and self._last is not None:
            # too few requests to bound the percentile: its exponential tail, read from
            # the quantiles the run does place, says whether it held
            rec = self._last.records
            taken = METRICS[judged.metric].samples(rec, rec.outcome != int(Outcome.NOT_SENT))
            tail = extrapolated_quantile(taken.values, QUANTILES[judged.percentile]) * 1000.0
            if tail <= bound:
                return replace(
                    held,
                    reason=f"{held.reason}; its {held.judged} read from its tail: {tail:.1f} ms",
                )
            high = tail
        return self._failed(
            held,
            min(high / bound, UNSURE_SCORE),
            f"unsure: it held ({held.reason}), but on {held.samples} requests worth "
            f"{held.samples / held.dispersion:.0f} independent ones its {held.judged}'s "
            f"{self.cfg.confidence:.0%} interval reaches "
            + ("beyond every latency" if math.isinf(high) else f"{high:.1f} ms")
            + f" > {bound:g} ms within the step caps (raise --max-step-s for more)",
        )

    def _failed(self, held: StepVerdict, score: float, reason: str) -> StepVerdict:
        """``held`` counted as failed, at ``score``, for ``reason``, in the trajectory too."""
        failed = replace(
            held, state=HealthState.UNHEALTHY, score=score, decided=True, reason=reason
        )
        self.trajectory[-1] = failed
        return failed

    async def longer(
        self, plan: StepPlan, seconds: float, stop: asyncio.Event, *, capped: bool = True
    ) -> StepVerdict:
        """The step just run at ``plan``'s rate made ``seconds`` long in all: one more run,
        judged together with it and any runs pooled into it (``loadgen.step.joined``);
        the run within the step caps unless ``capped`` is False (the budget bounds it)."""
        assert self._last is not None, "longer() extends a step already run"
        more = seconds - self._last.summary.duration_s
        if capped:
            more = self.cfg.capped_s(plan.rate, more)
        more_plan = self.within_budget(replace(plan, duration_s=more))
        return await self._assessed(more_plan, stop, pool=self._last)

    async def _assessed(
        self, plan: StepPlan, stop: asyncio.Event, pool: StepResult | None = None
    ) -> StepVerdict:
        if self.on_start is not None:
            self.on_start(self.index + 1, plan)
        verdict = await self._measured(plan, stop, pool)
        if self._interrupted:
            raise Stopped  # stored, but a partial step is no verdict
        assert self._last is not None
        self.trajectory.append(verdict)
        self.judged.append(self._last.summary)
        if self.on_step is not None:
            self.on_step(self.index, plan, verdict)
        return verdict

    async def _measured(
        self, plan: StepPlan, stop: asyncio.Event, pool: StepResult | None = None
    ) -> StepVerdict:
        if self.gpu is not None:
            self.gpu.sample()  # the baseline: XID and ECC errors count from here
        result = await self.measure(plan, self.cfg.seed + self.index, stop)
        result.summary = with_goodput(result.summary, result.records, self.policy.latency)
        samples = self.gpu.sample() if self.gpu is not None else []
        judged, judged_plan, t0 = result, plan, self.t_s
        if pool is not None:  # judged with the run before it, as one step
            judged = joined(pool, result)
            judged.summary = with_goodput(judged.summary, judged.records, self.policy.latency)
            judged_plan = replace(plan, duration_s=judged.summary.duration_s)
            t0 = self.t_s - pool.summary.duration_s
        a = assess_step(
            judged,
            judged_plan,
            self.policy,
            self.cfg.hysteresis,
            step_index=self.index,
            t0_s=t0,
            gpu_problems=gpu_problems(samples),
            gpu_utilisation=mean_utilisation(samples),
            confidence=self.cfg.confidence,
            family=self.family,
            confirm_requests=self.cfg.confirm_effective(),
        )
        if pool is not None:  # this run's windows as the pooled judgement marked them
            marked = judged.windows[len(pool.windows) :]
            result.windows = [
                w.model_copy(update={"state": m.state, "score": m.score, "excluded": m.excluded})
                for w, m in zip(result.windows, marked, strict=True)
            ]
        if self.store is not None and self.run_id is not None:
            self.store.add_step(self.run_id, self.index, result.summary, result.windows)
        self.timeline += [e for e in a.timeline if float(e["t_s"]) >= self.t_s]  # type: ignore[arg-type]
        self._last = judged
        verdict = a.verdict
        if pool is not None:  # it keeps its first run's steady state: none excluded here
            verdict = replace(verdict, pooled_s=pool.summary.duration_s)
        else:
            self.excluded_s += verdict.excluded_warmup_s
        self.t_s += plan.duration_s
        self.index += 1
        self._interrupted = result.interrupted
        died = _server_died(result)
        if died is not None:
            raise TargetError(f"the server stopped answering at step {self.index}: {died}")
        return verdict

    def finish(
        self, est: CapacityEstimate, confirmed: bool | None, status: str, reason: str
    ) -> ProbeResult:
        valid = (
            status == "complete"
            and est.capacity_rps is not None
            and confirmed is not False
            and all(v.valid for v in self._standing(est.capacity_rps))
        )
        held = [v for v in self.trajectory if v.purpose == "confirm" and v.sustainable]
        if confirmed and est.capacity_rps is not None and held and not held[-1].decided:
            v = held[-1]
            reason += (
                f"; less sure than it reads: the confirmation's late requests came in "
                f"clusters (dispersion {v.dispersion:.1f}), so its {v.samples} requests "
                f"are worth {v.samples / v.dispersion:.0f} independent ones of the "
                f"{self.cfg.confirm_effective()} wanted, within {v.duration_s:g} s "
                f"(raise --max-step-s for more)"
            )
        result = same_named(
            ProbeResult,
            est,  # capacity_rps, ci_low, ci_high, strategy, steps
            test_seconds=self.t_s,  # every run once: pooled verdicts repeat their runs
            requests_sent=self.sent,
            wall_s=self.spent_s,
            budget_s=self.cfg.budget_s,
            warmup_excluded_s=self.warmup_s + self.excluded_s,
            warmup_s=self.warmup_s,
            warmup_requests=self.warmup_requests,
            warmup_steady=None if self.warmed is None else self.warmed.steady,
            valid=valid,
            confirmed=confirmed,
            reason=reason,
            slo=format_slo(self.policy),
            target=self.driver.describe(),
            run_id=self.run_id,
            status=status,
            gpu=self.gpu.describe() if self.gpu is not None else "not monitored",
            at_capacity=self._at(est.capacity_rps),
            health_timeline=self.timeline,
            trajectory=[verdict_dict(v) for v in self.trajectory],
        )
        if self.store is not None and self.run_id is not None:
            self.store.finish_run(self.run_id, status, reason or None, result.model_dump())
        return result

    def _standing(self, rate: float | None) -> list[StepVerdict]:
        """The step the answer stands on: the last confirmation at ``rate``, else the last
        step. A recheck above a confirmed capacity that the generator could not send
        (over HTTP at 38 req/s on two cores) leaves the confirmation as measured."""
        held = [v for v in self.trajectory if v.purpose == "confirm" and v.rate == rate]
        return held[-1:] or self.trajectory[-1:]

    def _at(self, rate: float | None) -> AtCapacity | None:
        """The last step that held at ``rate`` (a confirmation, when one held there)."""
        held = [
            (v, s)
            for v, s in zip(self.trajectory, self.judged, strict=True)
            if v.rate == rate and v.sustainable
        ]
        if rate is None or not held:
            return None
        _, summary = max(reversed(held), key=lambda vs: vs[0].purpose == "confirm")
        return AtCapacity.of(rate, summary)


@dataclass(frozen=True, slots=True)
class Warmed:
    """What the warm-up phase did: how long, how many requests, at what rate it ended,
    and whether the server was warm by then (``steady``) or the cap ended it."""

    seconds: float = 0.0
    requests: int = 0
    windows: int = 0
    healthy_rate: float | None = None
    """The highest rate a whole round was well inside the SLO at (None: none was)."""
    rate: float = 0.0
    """The rate it held at its end, req/s."""
    steady: bool = False
    """The p50 at the held rate had stopped trending (and ``requests`` were sent)."""
    capped: bool = False
    """``max_s`` ended it with the p50 still falling: the server may not be warm."""
    fall: float = 0.0
    """The p50's fitted fall across the last trend span tested, as a fraction of its
    mean (negative: it rose); ``fall_windows`` windows at one rate (0: none tested)."""
    fall_windows: int = 0
    note: str = ""
    """What the probe's reason should say when ``capped``; empty otherwise."""
