"""Drivers run one proposed step and hand back its records: over the network in real
time, or against a simulated server in virtual time. Everything after the records —
windows, health, warmup, the strategy — is the same code for both."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from ridgeline.errors import ConfigError
from ridgeline.loadgen.replayer import Progress
from ridgeline.loadgen.schedule import Schedule, TraceScale, build_schedule, shaped
from ridgeline.loadgen.step import StepConfig, StepResult, measure_step
from ridgeline.loadgen.validity import assess_validity
from ridgeline.probe.batching import batching_delay_s, window_for
from ridgeline.search.base import StepPlan
from ridgeline.sim import SimPreset, SimState, shapes_for, simulate_preset
from ridgeline.targets.options import TargetOptions
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows
from ridgeline.workload.llm import LlmWorkload
from ridgeline.workload.traces import Trace

STEP_TRACE_SCALES: tuple[TraceScale, ...] = ("overlay", "speed")
"""How a probe's step may bring a trace to its rate (``--trace-scale``)."""


def step_schedule(
    plan: StepPlan,
    seed: int,
    arrival: str,
    trace: Trace | None,
    trace_scale: TraceScale = "overlay",
) -> Schedule:
    """A step's schedule: the arrival process at the step's rate, or the trace brought to
    it. ``overlay``: that many times the trace's users, copies of it each replaying the
    step's length of the trace from a random point of it, the step's seed drawing the
    points (``trace_superposed``: the count drawn, its mean the rate, as the trace's
    counts over the step's length vary; every step, confirmations included, a fresh
    draw). ``speed``: the trace's opening arrivals time-scaled to hold the rate exactly
    (``trace_at_rate``: every step the same stretch, its bursts shortened). Sizes
    recorded in the trace travel with its arrivals either way."""
    if trace is not None:
        check_trace_scale(trace_scale)
    return build_schedule(
        arrival,
        rate=plan.rate,
        duration_s=plan.duration_s,
        seed=seed,
        trace=trace,
        trace_scale=trace_scale,
        drawn=True,
    )


def check_trace_scale(trace_scale: str) -> TraceScale:
    """``trace_scale`` if a probe's step can bring a trace to its rate so, else a
    ``ConfigError`` naming the choices."""
    if trace_scale not in STEP_TRACE_SCALES:
        raise ConfigError(
            f"--trace-scale must be {' or '.join(STEP_TRACE_SCALES)}, got {trace_scale!r}"
        )
    return trace_scale


class Driver(Protocol):
    name: str

    async def run(self, plan: StepPlan, seed: int, stop: asyncio.Event) -> StepResult:
        """Run one step at ``plan.rate`` for ``plan.duration_s``."""
        ...

    def describe(self) -> str:
        """One line: what is being probed."""
        ...

    def judge_by(self, latency_bound_ms: float | None) -> None:
        """The SLO's tightest latency bound, which a step's validity is judged against
        (``loadgen.validity``); None when the SLO bounds no latency."""
        ...


@dataclass
class NetworkDriver:
    """A real endpoint, in real time, through the open-loop replayer."""

    url: str
    step: StepConfig = field(default_factory=StepConfig)
    arrival: str = "poisson"
    target_options: TargetOptions = field(default_factory=TargetOptions)
    trace: Trace | None = None
    """When set, each step replays this trace brought to the step's rate."""
    trace_scale: TraceScale = "overlay"
    """How the trace is brought to a step's rate (``step_schedule``)."""
    batching_delay_s: float | None = None
    """The server's dynamic-batching delay, read from its model config at the first step
    (0 when it has none); windows are widened to many batching cycles."""
    progress: Progress | None = None
    """Counters of the step in flight (sent, answered, failed), for a live display."""
    workload: LlmWorkload | None = None
    """Each step's prompts and lengths (made afresh per step, from the step's seed)."""
    name: str = "network"

    def schedule(self, plan: StepPlan, seed: int) -> Schedule:
        sched = step_schedule(plan, seed, self.arrival, self.trace, self.trace_scale)
        return shaped(sched, self.workload, seed)

    async def run(self, plan: StepPlan, seed: int, stop: asyncio.Event) -> StepResult:
        if self.batching_delay_s is None:
            self.batching_delay_s = await batching_delay_s(self.url) or 0.0
            wide = window_for(self.batching_delay_s, self.step.window_s)
            self.step = self.step.model_copy(update={"window_s": wide})
        return await measure_step(
            self.url,
            self.schedule(plan, seed),
            self.step,
            target_options=self.target_options,
            stop=stop,
            progress=self._fresh_progress(),
        )

    def _fresh_progress(self) -> Progress | None:
        """The display's counters, zeroed for the next step (the replay sets its total)."""
        if self.progress is None:
            return None
        p = self.progress
        p.total = p.sent = p.answered = p.failed = 0
        p.outstanding_limited = p.client_failures = 0
        p.stopped = False
        return p

    def describe(self) -> str:
        return self.url

    def judge_by(self, latency_bound_ms: float | None) -> None:
        validity = self.step.validity
        if validity.latency_bound_ms is None and latency_bound_ms is not None:
            validity = validity.model_copy(update={"latency_bound_ms": latency_bound_ms})
            self.step = self.step.model_copy(update={"validity": validity})


@dataclass
class SimDriver:
    """A simulated server (virtual time): a whole search runs in seconds, exactly."""

    preset: SimPreset
    label: str = "sim"
    arrival: str = "poisson"
    window_s: float = 1.0
    timeout_s: float = 30.0
    state: SimState = field(default_factory=SimState.fresh)
    gap_s: float = 1.0
    """Idle server time between steps (the real driver's connect and set-up)."""
    trace: Trace | None = None
    trace_scale: TraceScale = "overlay"
    """How the trace is brought to a step's rate (``step_schedule``)."""
    workload: LlmWorkload | None = None
    """Each step's prompt and output lengths (the server simulated reads no text)."""
    name: str = "sim"

    async def run(self, plan: StepPlan, seed: int, stop: asyncio.Event) -> StepResult:
        sched = step_schedule(plan, seed, self.arrival, self.trace, self.trace_scale)
        times = sched.times
        shapes = sched.shapes or shapes_for(self.preset, len(times), seed)
        if self.workload is not None:  # its lengths over the preset's (or trace's) shapes
            shapes = self.workload.shapes(len(times), seed, shapes, text=False) or shapes
        records, self.state = simulate_preset(
            self.preset,
            times,
            shapes,
            state=self.state,
            seed=seed,
            timeout_s=self.timeout_s,
            span_s=plan.duration_s,
        )
        self.state = self.state.advance(self.gap_s)
        valid, reason = assess_validity(records, StepConfig().validity)
        summary = summarize(records, plan.duration_s, valid=valid, invalid_reason=reason)
        return StepResult(
            summary, windows(records, plan.duration_s, self.window_s), records, interrupted=False
        )

    def describe(self) -> str:
        return f"sim:{self.label} ({self.preset.description})"

    def judge_by(self, latency_bound_ms: float | None) -> None:
        """A simulated generator is never late: nothing to judge."""
