"""The probe: connect check → warmup → search → confirm → stop, everything stored as it
happens. The same orchestrator drives a real endpoint (real time) or a simulated server
(virtual time); only the driver differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ridgeline.errors import RidgelineError, TargetError, TargetUnreachableError
from ridgeline.health.hysteresis import HysteresisConfig
from ridgeline.health.slo import SLOPolicy, format_slo, parse_slo
from ridgeline.health.state import HealthState
from ridgeline.health.warmup import WarmupConfig, WarmupState, warmup_step
from ridgeline.loadgen.step import StepResult
from ridgeline.probe.assess import assess_step
from ridgeline.probe.drivers import Driver
from ridgeline.search import parse_strategy
from ridgeline.search.base import CapacityEstimate, StepPlan, StepVerdict
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
    confirm_requests: int = Field(
        10_000,
        ge=0,
        description="a confirmation lasts long enough for this many requests "
        "(the p99 tail needs samples: 10,000 leave 100 beyond it)",
    )
    confirm_margin: ConfirmMargin = DEFAULT_MARGIN
    seed: int = 0

    def policy(self) -> SLOPolicy:
        return parse_slo(self.slo)


class ProbeResult(BaseModel):
    capacity_rps: float | None
    ci_low: float | None
    ci_high: float | None
    strategy: str
    steps: int
    test_seconds: float
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


class _Run:
    """One probe's bookkeeping: the store, the timeline, the clock of test-seconds."""

    def __init__(
        self, driver: Driver, cfg: ProbeConfig, store: RunStore | None, gpu: GpuMonitor | None
    ) -> None:
        self.driver, self.cfg, self.store, self.gpu = driver, cfg, store, gpu
        self.policy = cfg.policy()
        self.timeline: list[dict[str, Any]] = []
        self.trajectory: list[StepVerdict] = []
        self.t_s = 0.0
        self.index = 0
        self.warmup_s = 0.0
        self.run_id: int | None = None

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
        return result

    async def step(self, plan: StepPlan, stop: asyncio.Event, *, warmup: bool) -> StepVerdict:
        if self.gpu is not None:
            self.gpu.sample()  # the baseline: XID and ECC errors count from here
        result = await self.measure(plan, self.cfg.seed + self.index, stop)
        samples = self.gpu.sample() if self.gpu is not None else []
        a = assess_step(
            result,
            plan,
            self.policy,
            self.cfg.hysteresis,
            warmup=warmup and self.cfg.warmup,
            step_index=self.index,
            t0_s=self.t_s,
            gpu_problems=gpu_problems(samples),
            gpu_utilisation=mean_utilisation(samples),
        )
        if self.store is not None and self.run_id is not None:
            self.store.add_step(self.run_id, self.index, result.summary, result.windows)
        self.timeline += a.timeline
        self.t_s += plan.duration_s
        self.index += 1
        if result.interrupted:
            raise asyncio.CancelledError
        died = _server_died(result)
        if died is not None:
            raise TargetError(f"the server stopped answering at step {self.index}: {died}")
        return a.verdict

    def finish(
        self, est: CapacityEstimate, confirmed: bool | None, status: str, reason: str
    ) -> ProbeResult:
        valid = (
            status == "complete"
            and est.capacity_rps is not None
            and confirmed is not False
            and all(v.valid for v in self.trajectory[-1:])
        )
        result = ProbeResult(
            capacity_rps=est.capacity_rps,
            ci_low=est.ci_low,
            ci_high=est.ci_high,
            strategy=est.strategy,
            steps=est.steps,
            test_seconds=est.test_seconds,
            warmup_excluded_s=self.warmup_s + sum(v.excluded_warmup_s for v in self.trajectory),
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
    """Low rate until the server is steady (or max_s): excluded from every verdict."""
    wc = run.cfg.warmup_config
    rate = wc.rate if wc.rate is not None else max(first_rate * wc.rate_fraction, 1e-3)
    state = WarmupState()
    plan = StepPlan(rate, wc.window_s * wc.min_windows, "warmup")
    while run.warmup_s < wc.max_s:
        result = await run.measure(plan, run.cfg.seed + 10_000 + run.index, stop)
        run.warmup_s += plan.duration_s
        run.t_s += plan.duration_s
        steady = False
        for w in result.windows:
            w.excluded = True
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
            run.index += 1
        if steady or result.interrupted:
            break


async def probe(
    driver: Driver,
    cfg: ProbeConfig,
    *,
    store: RunStore | None = None,
    stop: asyncio.Event | None = None,
    on_step: ProgressFn | None = None,
    gpu: GpuMonitor | None = None,
) -> ProbeResult:
    """Find the maximum sustainable throughput of ``driver``'s endpoint under the SLO."""
    stop = stop or asyncio.Event()
    options = dict(cfg.strategy_options)
    if cfg.strategy == "adaptive":  # adaptive confirms itself: the same rule as ours
        options.setdefault("confirm_requests", cfg.confirm_requests)
        options.setdefault("confirm_factor", cfg.confirm_factor)
        options.setdefault("confirm_margin", cfg.confirm_margin)
    strategy = parse_strategy(cfg.strategy, **options)
    run = _Run(driver, cfg, store, gpu)
    status, reason, confirmed = "complete", "", None
    try:
        pending = strategy.propose()
        if cfg.warmup and pending is not None:
            await _warmup(run, pending.rate, stop)
        while True:
            plan = pending or strategy.propose()
            pending = None
            if plan is None:
                break
            verdict = await run.step(plan, stop, warmup=True)
            run.trajectory.append(verdict)
            strategy.observe(verdict)
            if on_step is not None:
                on_step(run.index, plan, verdict)
        est = strategy.result()
        reason = est.reason
        last = run.trajectory[-1] if run.trajectory else None
        if (
            cfg.confirm
            and est.capacity_rps is not None
            and not (last and last.purpose == "confirm" and last.sustainable)
        ):
            est, confirmed, reason = await _confirm(run, est, stop, on_step)
        elif est.capacity_rps is not None:
            confirmed = True
        est = _with_confirmation(est, run.trajectory)
    except asyncio.CancelledError:
        status, reason = "interrupted", "interrupted (Ctrl-C): partial search stored"
        est = strategy.result()
    except TargetUnreachableError:
        if run.run_id is None:
            raise  # failed its connect check before anything was measured
        status, reason = "failed", "critical: the server stopped answering"
        est = strategy.result()
    except RidgelineError as exc:
        status, reason = "failed", f"{HealthState.CRITICAL.value}: {exc}"
        est = strategy.result()
    return run.finish(est, confirmed, status, reason)


async def _confirm(
    run: _Run, est: CapacityEstimate, stop: asyncio.Event, on_step: ProgressFn | None
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
        duration = max(strategy_step_s(cfg) * cfg.confirm_factor, cfg.confirm_requests / rate)
        plan = StepPlan(rate, duration, "confirm")
        runs: list[StepVerdict] = []
        decision = Decision.AGAIN
        while decision is Decision.AGAIN:
            verdict = await run.step(plan, stop, warmup=True)
            run.trajectory.append(verdict)
            if on_step is not None:
                on_step(run.index, plan, verdict)
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
    return est, False, reason


def strategy_step_s(cfg: ProbeConfig) -> float:
    return float(cfg.strategy_options.get("step_duration_s", 10.0))


def _with_confirmation(est: CapacityEstimate, trajectory: list[StepVerdict]) -> CapacityEstimate:
    """Count the confirmation steps in steps and test-seconds."""
    extra = trajectory[est.steps :]
    return replace(
        est,
        steps=est.steps + len(extra),
        test_seconds=est.test_seconds + sum(v.duration_s for v in extra),
        trajectory=tuple(trajectory),
    )
