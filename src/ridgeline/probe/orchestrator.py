"""The probe: connect check → warmup → search → confirm → stop, everything stored as it
happens. The same orchestrator drives a real endpoint (real time) or a simulated server
(virtual time); only the driver differs.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._fields import Seconds
from ridgeline.errors import RidgelineError, TargetError, TargetUnreachableError
from ridgeline.health.hysteresis import HysteresisConfig
from ridgeline.health.sampling import judged_quantile, needed_samples, tail_requests
from ridgeline.health.slo import SLOPolicy, format_slo, parse_slo
from ridgeline.health.state import HealthState
from ridgeline.health.warmup import WarmupConfig, WarmupState, warmup_step
from ridgeline.loadgen.step import StepResult, joined
from ridgeline.probe.assess import assess_step
from ridgeline.probe.drivers import Driver
from ridgeline.search import parse_strategy
from ridgeline.search.base import CapacityEstimate, StepPlan, StepVerdict, Strategy
from ridgeline.search.confirmation import (
    DEFAULT_MARGIN,
    ConfirmMargin,
    Decision,
    below_failed,
    decide,
    deciding,
)
from ridgeline.telemetry.gpu import GpuMonitor, gpu_problems, mean_utilisation
from ridgeline.telemetry.store import RunStore

CONFIRM_TAIL = 100
"""A confirmation expects this many requests beyond the SLO's percentile (10,000 for a
p99): one long run's percentile rests on its tail, and 100 beyond leave it within about
±20 % of the proportion (a binomial's SD is √100)."""
BOUNDARY_TAIL = 30
"""An adaptive step near the boundary expects this many beyond (3,000 for a p99)."""


class ProbeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slo: str = Field("p99<100ms,errors<1%", description="the SLO, e.g. 'p99<100ms,errors<0.1%'")
    strategy: str = Field("adaptive", description="adaptive | binary | sweep | stability")
    strategy_options: dict[str, Any] = Field(
        default_factory=dict, description="fields of the strategy's config (min_rate, ...)"
    )
    warmup: bool = Field(True, description="explicit warmup phase and steady-state exclusion")
    warmup_config: WarmupConfig = Field(default_factory=WarmupConfig)
    hysteresis: HysteresisConfig = Field(default_factory=HysteresisConfig)
    confirm: bool = Field(True, description="a stability run at the estimate after the search")
    confirm_factor: float = Field(3.0, gt=0, description="confirmation length in step lengths")
    confirm_retries: int = Field(5, ge=0, le=10, description="back-offs when a confirmation fails")
    confirm_requests: int | None = Field(
        None,
        ge=0,
        description="a confirmation lasts long enough for this many requests; None: "
        f"{CONFIRM_TAIL} expected beyond the SLO's percentile (10,000 for a p99, "
        "100,000 for a p99.9), within the step caps",
    )
    confirm_margin: ConfirmMargin = DEFAULT_MARGIN
    confidence: float = Field(
        0.95,
        ge=0.5,
        lt=1,
        description="how sure a step's verdict must be: a failure on fewer requests than "
        "the percentile needs must be this sure, or the step runs again, longer; also the "
        "level of each step's percentile interval",
    )
    max_step_s: Seconds = Field(
        600.0, description="no step lasts longer (unless its rate needs more to decide)"
    )
    max_step_requests: int = Field(
        1_000_000, ge=1, description="no step sends more requests (unless needed to decide)"
    )
    seed: int = 0

    def policy(self) -> SLOPolicy:
        return parse_slo(self.slo)

    def quantile(self) -> float | None:
        """The quantile of the SLO's highest percentile bound (None: it has none)."""
        return judged_quantile(self.policy())

    def needed(self) -> int:
        """The requests a step needs to decide (``sampling.needed_samples``): 299 for a
        p99 or errors<1 % at 95 %, 2,995 for a p99.9 or errors<0.1 %."""
        return needed_samples(self.policy(), self.confidence)

    def needed_s(self, rate: float) -> float:
        """The seconds a step at ``rate`` needs to decide."""
        return self.needed() / rate

    def capped_s(self, rate: float, seconds: float) -> float:
        """``seconds`` within ``max_step_s`` and ``max_step_requests``; a cap never cuts a
        step below what its percentile needs to decide."""
        cap = min(self.max_step_s, self.max_step_requests / rate)
        return min(seconds, max(cap, self.needed_s(rate)))

    def confirm_count(self) -> int:
        """The requests a confirmation lasts for: ``confirm_requests``, or
        ``CONFIRM_TAIL`` expected beyond the SLO's percentile."""
        if self.confirm_requests is not None:
            return self.confirm_requests
        return self.tail_requests(CONFIRM_TAIL, 10_000)

    def confirm_effective(self) -> int:
        """The independent requests a confirmation's evidence must be worth when those
        beyond the bound come in clusters (``Tail.effective``): ``BOUNDARY_TAIL``
        expected beyond the percentile (3,000 for a p99), what a step at the boundary
        needs. Near the boundary a queue's late requests come in busy periods of tens to
        hundreds; a run of 10,000 is then worth a few hundred, and runs longer."""
        return min(self.confirm_count(), self.tail_requests(BOUNDARY_TAIL, 3_000))

    def tail_requests(self, tail: float, fallback: int) -> int:
        """Requests for ``tail`` expected beyond the SLO's percentile (``fallback`` when
        it bounds none)."""
        q = self.quantile()
        return fallback if q is None else tail_requests(q, tail)


class ProbeResult(BaseModel):
    capacity_rps: float | None
    ci_low: float | None
    ci_high: float | None
    strategy: str
    steps: int
    test_seconds: float
    """Seconds of load sent, every step counted: warmup, search and confirmations."""
    requests_sent: int = 0
    """Requests sent over the whole probe, warmup included: what it cost the server."""
    warmup_excluded_s: float
    valid: bool
    confirmed: bool | None
    reason: str
    slo: str
    target: str
    run_id: int | None = None
    status: str = "complete"
    gpu: str = "not monitored"
    """What watched the GPUs: NVML, a DCGM/Triton endpoint, or why none could."""
    health_timeline: list[dict[str, Any]] = Field(default_factory=list)
    trajectory: list[dict[str, Any]] = Field(default_factory=list)


ProgressFn = Callable[[int, StepPlan, StepVerdict], None]
StartFn = Callable[[int, StepPlan], None]
"""Called as a step starts (its index and plan): a long step can say so."""


def _verdict_dict(v: StepVerdict) -> dict[str, Any]:
    d = asdict(v)
    d["state"] = v.state.value
    return d


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


class _Stopped(Exception):
    """The stop event ended a step (Ctrl-C through ``run_probe``): the probe ends,
    interrupted, with what it measured. A caller's cancellation is not this: it is
    passed on, so a probe inside a larger job (verify, the demo) never swallows it."""


class _Run:
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
        self.trajectory: list[StepVerdict] = []
        self.t_s = 0.0
        self.index = 0
        self.warmup_s = 0.0
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

    async def measure(self, plan: StepPlan, seed: int, stop: asyncio.Event) -> StepResult:
        try:
            result = await self.driver.run(plan, seed, stop)
        except TargetUnreachableError as exc:
            if self.index == 0:
                raise  # the connect check: nothing measured, nothing stored
            raise TargetError(f"the server stopped answering at step {self.index}: {exc}") from exc
        self.opened()
        self.sent += result.summary.sent
        return result

    async def step(self, plan: StepPlan, stop: asyncio.Event) -> StepVerdict:
        """Run ``plan`` (its length within the caps, ``ProbeConfig.capped_s``), record
        its verdict in the trajectory and tell ``on_step``. A failure on too few requests
        to decide (``StepVerdict.decided``), or a confirmation whose clustered requests
        were worth too few independent ones, gets more of the same: another run at the
        rate, judged together with the runs before it as one step
        (``loadgen.step.joined``). Runs are added until the evidence decides, or at
        least ``UNDECIDED_RERUNS`` have been added and the pooled step holds a
        confirmation's requests, or it reaches ``POOLED_CAPS`` step caps. Each adds what
        the evidence says is missing (at least doubling the step); nothing measured is
        thrown away. The verdict returned is the pooled one."""
        plan = replace(plan, duration_s=self.cfg.capped_s(plan.rate, plan.duration_s))
        verdict = await self._assessed(plan, stop)
        total = plan.duration_s
        limit = POOLED_CAPS * self.cfg.capped_s(plan.rate, math.inf)
        for reruns in itertools.count():
            if verdict.decided:
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
            if more < 1e-6 * total:
                break  # the pooled step is as long as the caps allow
            verdict = await self._assessed(replace(plan, duration_s=more), stop, pool=self._last)
            total += more
        return verdict

    async def _assessed(
        self, plan: StepPlan, stop: asyncio.Event, pool: StepResult | None = None
    ) -> StepVerdict:
        if self.on_start is not None:
            self.on_start(self.index + 1, plan)
        verdict = await self._measured(plan, stop, pool)
        if self._interrupted:
            raise _Stopped  # stored, but a partial step is no verdict
        self.trajectory.append(verdict)
        if self.on_step is not None:
            self.on_step(self.index, plan, verdict)
        return verdict

    async def _measured(
        self, plan: StepPlan, stop: asyncio.Event, pool: StepResult | None = None
    ) -> StepVerdict:
        if self.gpu is not None:
            self.gpu.sample()  # the baseline: XID and ECC errors count from here
        result = await self.measure(plan, self.cfg.seed + self.index, stop)
        samples = self.gpu.sample() if self.gpu is not None else []
        judged, judged_plan, t0 = result, plan, self.t_s
        if pool is not None:  # judged with the run before it, as one step
            judged = joined(pool, result)
            judged_plan = replace(plan, duration_s=judged.summary.duration_s)
            t0 = self.t_s - pool.summary.duration_s
        a = assess_step(
            judged,
            judged_plan,
            self.policy,
            self.cfg.hysteresis,
            warmup=self.cfg.warmup,
            step_index=self.index,
            t0_s=t0,
            steady_from=None if pool is None else sum(w.excluded for w in pool.windows),
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
            and all(v.valid for v in self.trajectory[-1:])
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
        result = ProbeResult(
            capacity_rps=est.capacity_rps,
            ci_low=est.ci_low,
            ci_high=est.ci_high,
            strategy=est.strategy,
            steps=est.steps,
            test_seconds=self.t_s,  # every run once: pooled verdicts repeat their runs
            requests_sent=self.sent,
            warmup_excluded_s=self.warmup_s + self.excluded_s,
            valid=valid,
            confirmed=confirmed,
            reason=reason,
            slo=format_slo(self.policy),
            target=self.driver.describe(),
            run_id=self.run_id,
            status=status,
            gpu=self.gpu.describe() if self.gpu is not None else "not monitored",
            health_timeline=self.timeline,
            trajectory=[_verdict_dict(v) for v in self.trajectory],
        )
        if self.store is not None and self.run_id is not None:
            self.store.finish_run(self.run_id, status, reason or None, result.model_dump())
        return result


async def _warmup(run: _Run, first_rate: float, stop: asyncio.Event) -> None:
    """At the first step's rate (``rate_fraction`` of it, or ``rate``) until the server is
    steady and has had ``requests`` requests, or ``max_s`` has passed with its requests
    sent: excluded from every verdict."""
    wc = run.cfg.warmup_config
    rate = wc.rate if wc.rate is not None else max(first_rate * wc.rate_fraction, 1e-3)
    state = WarmupState()
    plan = StepPlan(rate, wc.window_s * wc.min_windows, "warmup")
    sent, wanted = 0, wc.requests or 0
    while run.warmup_s < wc.max_s or sent < wanted:
        result = await run.measure(plan, run.cfg.seed + 10_000 + run.index, stop)
        sent += result.summary.sent
        run.warmup_s += plan.duration_s
        run.t_s += plan.duration_s
        steady = False
        for w in result.windows:
            w.excluded = True
            if w.offered:  # a window nothing was sent in says nothing, either way
                steady, state = warmup_step(state, w.latency_ms.p50 or 0.0, wc)
            run.timeline.append(
                {
                    "t_s": run.t_s - plan.duration_s + w.start_s,
                    "step": -1,
                    "state": "warmup",
                    "score": 0.0,
                    "reason": "warmup",
                }
            )
        if run.store is not None and run.run_id is not None:
            run.store.add_step(run.run_id, run.index, result.summary, result.windows)
        run.index += 1  # with a store or without: every later step's seed follows from it
        if (steady and sent >= wanted) or result.interrupted:
            break


async def probe(
    driver: Driver,
    cfg: ProbeConfig,
    *,
    store: RunStore | None = None,
    stop: asyncio.Event | None = None,
    on_step: ProgressFn | None = None,
    gpu: GpuMonitor | None = None,
    on_start: StartFn | None = None,
) -> ProbeResult:
    """Find the maximum sustainable throughput of ``driver``'s endpoint under the SLO.
    ``on_step`` hears of each step as it ends; ``on_start`` as it starts."""
    stop = stop or asyncio.Event()
    options = dict(cfg.strategy_options)
    options.setdefault("decisive_requests", cfg.needed())
    if cfg.strategy == "adaptive":  # adaptive confirms itself: the same rule as ours
        options.setdefault("confirm_requests", cfg.confirm_count())
        options.setdefault("boundary_requests", cfg.tail_requests(BOUNDARY_TAIL, 3_000))
        options.setdefault("confirm_factor", cfg.confirm_factor)
        options.setdefault("confirm_margin", cfg.confirm_margin)
    strategy = parse_strategy(cfg.strategy, **options)
    run = _Run(driver, cfg, store, gpu, on_step, on_start)
    driver.judge_by(min((b.bound_ms for b in run.policy.latency), default=None))
    status, reason, confirmed = "complete", "", None
    try:
        pending = strategy.propose()
        if cfg.warmup and pending is not None:
            await _warmup(run, pending.rate, stop)
        est, confirmed, reason = await _search_and_confirm(run, strategy, stop)
        for _ in range(MAX_RESUMES if cfg.strategy != "stability" else 0):
            failed = _bounding_failure(run.trajectory, est) if confirmed else None
            if failed is None:
                break
            # was the failure that bounded the search the server's past (cold, warming
            # by work)? Its rate once more, now that the server has served the search
            plan = StepPlan(failed.rate, failed.duration_s, "recheck")
            recheck = await run.step(plan, stop)
            if not _changed(failed, recheck):
                break  # it fails still, or holds by a hair: the estimate stands
            above = failed.rate
            upward = {k: v for k, v in options.items() if k != "start_rate"}
            strategy = parse_strategy(cfg.strategy, **{**upward, "min_rate": above})
            again = await _search_and_confirm(run, strategy, stop)
            if not (again[1] and again[0].capacity_rps is not None):
                break  # nothing held a confirmation above: the estimate stands
            est, confirmed, reason = again
            reason = (
                f"{reason} (searched on above {above:g} req/s, which failed early and held "
                "once the server was warm)"
            )
        est = _with_confirmation(est, run.trajectory)
    except _Stopped:
        status, reason = "interrupted", "interrupted (Ctrl-C): partial search stored"
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
    return run.finish(est, confirmed, status, reason)


MAX_RESUMES = 2
CHANGED = math.log(1.25)
"""A recheck "holds clearly better" when its score is at least 25 % below the failed
step's, and by more than 2 standard errors of the two scores (from their quarters). A
lower bar than a confirmation's (4): a recheck wrongly taken as changed costs one more
search, which must itself be confirmed; it cannot report a wrong capacity."""


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
    cost of one step."""
    if not (recheck.sustainable and 0 < recheck.score < failed.score < math.inf):
        return False
    noise = 2 * math.hypot(failed.score_se, recheck.score_se)
    return math.log(failed.score / recheck.score) > max(CHANGED, noise)


async def _search_and_confirm(
    run: _Run, strategy: Strategy, stop: asyncio.Event
) -> tuple[CapacityEstimate, bool | None, str]:
    """Run ``strategy`` to its end, then confirm its estimate (unless it confirmed
    itself): the estimate, whether it held a confirmation (None: nothing to confirm),
    and why the search ended."""
    cfg = run.cfg
    while (plan := strategy.propose()) is not None:
        strategy.observe(await run.step(plan, stop))
    est = strategy.result()
    last = run.trajectory[-1] if run.trajectory else None
    if est.capacity_rps is None:
        return est, None, est.reason
    if last is not None and last.purpose == "confirm" and last.sustainable:
        return est, True, est.reason  # adaptive confirms itself by the same rule
    if not cfg.confirm:
        return est, True, est.reason
    return await _confirm(run, est, stop)


async def _confirm(
    run: _Run, est: CapacityEstimate, stop: asyncio.Event
) -> tuple[CapacityEstimate, bool, str]:
    """A stability run at the estimate, judged by ``confirmation.decide`` (a marginal run
    is repeated and the majority decides); if it fails, back off and try again
    (``confirm_retries`` times): the estimate must hold a long run to stand."""
    cfg = run.cfg
    rate = est.capacity_rps
    assert rate is not None
    ceiling = est.ci_high
    precision = float(cfg.strategy_options.get("precision", 0.02))
    reason = est.reason
    for attempt in range(cfg.confirm_retries + 1):
        duration = max(strategy_step_s(cfg) * cfg.confirm_factor, cfg.confirm_count() / rate)
        plan = StepPlan(rate, duration, "confirm")
        runs: list[StepVerdict] = []
        invalid = 0
        decision = Decision.AGAIN
        while decision is Decision.AGAIN:
            verdict = await run.step(plan, stop)
            if not verdict.valid and invalid < INVALID_CONFIRM_RETRIES:
                invalid += 1  # the generator's failure, not the server's: run it again
                continue
            runs.append(verdict)
            decision = decide(runs, cfg.confirm_margin, contested=attempt > 0)
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
    refuted = (
        f"no rate held a confirmation: {est.capacity_rps:g} req/s (the search's estimate) "
        f"and {cfg.confirm_retries} back-off(s) below it failed; the last: {reason}"
    )
    return replace(est, capacity_rps=None, ci_low=None, ci_high=ceiling), False, refuted


POOLED_CAPS = 2
"""An undecided step pools runs up to this many step caps (1,200 s by default): a server
whose late requests cluster in long busy periods gets twice the cap, never hours for one
point (see docs/probe.md)."""
UNDECIDED_RERUNS = 3
"""An undecided step gets at least this many more runs, each pooled with those before it
and at least doubling it, and more while it holds fewer requests than a confirmation
(errors at half their bound take some 10,000 requests to tell from it); then its verdict
stands as measured."""

INVALID_CONFIRM_RETRIES = 2
"""An invalid confirmation run (the generator fell behind, or failed itself) is run again
this many times before it counts as a failed run: it says nothing of the server."""


def strategy_step_s(cfg: ProbeConfig) -> float:
    return float(cfg.strategy_options.get("step_duration_s", 10.0))


def _with_confirmation(est: CapacityEstimate, trajectory: list[StepVerdict]) -> CapacityEstimate:
    """Every step counted in steps and test-seconds: the searches' (one, or more when a
    search resumed upward) and the confirmations'."""
    return replace(
        est,
        steps=len(trajectory),
        test_seconds=sum(v.duration_s for v in trajectory),
        trajectory=tuple(trajectory),
    )
