"""Token-level SLOs through the step verdict and every search strategy: ITL's clustered
evidence, the bound a step is judged on, and probes of a streaming server in virtual
time whose capacity is known exactly (the engine's readings: tests/test_health.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest
from rich.console import Console

from ridgeline.aio import run_coroutine
from ridgeline.health import HealthState, parse_slo
from ridgeline.health.hysteresis import HysteresisConfig
from ridgeline.loadgen.step import StepResult
from ridgeline.probe.assess import assess_step, tail_count
from ridgeline.probe.orchestrator import ProbeConfig, probe
from ridgeline.report.terminal import probe_table
from ridgeline.search.base import StepPlan
from ridgeline.telemetry.records import Outcome, Records, gaps_from
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows

# --- the step verdict: ITL's gaps are evidence clustered by request -------------------


def llm_step(gaps_per_request: list[list[float]], duration_s: float) -> StepResult:
    n = len(gaps_per_request)
    sched = np.arange(n) * duration_s / n
    rec = Records.empty(sched)
    rec.sent[:] = sched
    rec.first_token[:] = sched + 0.01
    rec.done[:] = rec.first_token + [sum(g) for g in gaps_per_request]
    rec.output_tokens[:] = [len(g) + 1 for g in gaps_per_request]
    rec.outcome[:] = int(Outcome.OK)
    rec.gaps, rec.gap_start = gaps_from(gaps_per_request)
    return StepResult(
        summarize(rec, duration_s, valid=True, invalid_reason=None),
        windows(rec, duration_s),
        rec,
        interrupted=False,
    )


def test_itl_evidence_counts_requests_not_gaps_when_slow_gaps_come_by_request() -> None:
    """2 % of 1,000 requests decode slowly, all 50 of their gaps: 2 % of gaps beyond the
    bound, but 50,000 gaps are worth far fewer independent ones."""
    per = [[0.1] * 50 if i % 50 == 0 else [0.01] * 50 for i in range(1000)]
    result = llm_step(per, 10.0)
    policy = parse_slo("itl_p99<50ms")
    tail = tail_count(result, policy, 0.95)
    assert (tail.percentile, tail.samples, tail.beyond) == ("itl_p99", 50_000, 1_000)
    assert tail.dispersion > 40  # about the 50 gaps each slow request brings
    v = assess_step(
        result,
        StepPlan(100.0, 10.0, "probe"),
        policy,
        HysteresisConfig(),
        step_index=0,
        t0_s=0.0,
    ).verdict
    assert v.state is HealthState.UNHEALTHY and "itl p99 100.0 ms > 50 ms" in v.reason


def test_a_failing_ttft_bound_is_the_one_the_step_is_judged_on() -> None:
    per = [[0.01] * 5 for _ in range(500)]
    result = llm_step(per, 5.0)
    tail = tail_count(result, parse_slo("ttft_p99<5ms,itl_p99<50ms,p99<1s"), 0.95)
    assert (tail.percentile, tail.beyond, tail.samples) == ("ttft_p99", 500, 500)


# --- every strategy on a streaming server in virtual time -----------------------------


@dataclass
class ToyLLM:
    """A streaming server in virtual time with constant arrivals: prefill takes
    ``prefill_s`` per request, one at a time (FIFO); then ``tokens`` tokens come with a
    gap of ``gap_s × (1 + rate / knee_rps)`` (decode slows as the batch grows). Under
    ``itl_p99<b`` its capacity is exactly ``knee_rps × (b / gap_s − 1)``; under a TTFT
    bound above ``prefill_s``, ``1 / prefill_s``."""

    gap_s: float = 0.010
    knee_rps: float = 50.0
    prefill_s: float = 0.002
    tokens: int = 20
    name: str = "toy-llm"

    async def run(self, plan: StepPlan, seed: int, stop: asyncio.Event) -> StepResult:
        n = max(1, round(plan.rate * plan.duration_s))
        i = np.arange(n)
        sched = i / plan.rate
        rec = Records.empty(sched)
        rec.sent[:] = sched
        rec.first_token[:] = np.maximum(sched + self.prefill_s, (i + 1) * self.prefill_s)
        gap = self.gap_s * (1 + plan.rate / self.knee_rps)
        rec.done[:] = rec.first_token + gap * (self.tokens - 1)
        rec.output_tokens[:] = self.tokens
        rec.prompt_tokens[:] = 64
        rec.outcome[:] = int(Outcome.OK)
        rec.gaps, rec.gap_start = gaps_from([[gap] * (self.tokens - 1)] * n)
        summary = summarize(rec, plan.duration_s, valid=True, invalid_reason=None)
        return StepResult(summary, windows(rec, plan.duration_s), rec, interrupted=False)

    def describe(self) -> str:
        return "toy streaming server"

    def judge_by(self, latency_bound_ms: float | None) -> None:
        """Virtual time: never late."""


def toy_probe(slo: str, strategy: str, **options: object) -> object:
    cfg = ProbeConfig(
        slo=slo,
        strategy=strategy,
        strategy_options={"step_duration_s": 10.0, "precision": 0.02, **options},
    )
    return run_coroutine(probe(ToyLLM(), cfg))


@pytest.mark.parametrize("strategy", ["adaptive", "binary", "sweep"])
def test_every_search_finds_the_itl_capacity_within_5_percent(strategy: str) -> None:
    r = toy_probe("itl_p99<30ms,errors<1%", strategy, min_rate=20.0, max_rate=200.0, max_steps=100)
    cap = r.capacity_rps  # type: ignore[attr-defined]
    assert cap is not None and 95.0 <= cap <= 100.5, r.trajectory  # type: ignore[attr-defined]
    at = r.at_capacity  # type: ignore[attr-defined]
    assert at is not None and at.goodput_rps == pytest.approx(at.achieved_rps)
    assert at.output_tokens_per_s == pytest.approx(20 * at.achieved_rps, rel=0.01)
    assert at.input_tokens_per_s == pytest.approx(64 * at.achieved_rps, rel=0.01)
    assert at.itl_ms is not None and at.itl_ms.p99 <= 30.0 * 1.001


def test_a_binary_search_finds_the_ttft_knee_of_prefill() -> None:
    r = toy_probe("ttft_p99<10ms,errors<1%", "binary", min_rate=50.0, max_rate=1000.0)
    cap = r.capacity_rps  # type: ignore[attr-defined]
    assert cap is not None and 475.0 <= cap <= 500.5, r.trajectory  # type: ignore[attr-defined]


@pytest.mark.parametrize(("rate", "holds"), [(80.0, True), (120.0, False)])
def test_a_stability_run_holds_below_the_itl_capacity_and_fails_above(
    rate: float, holds: bool
) -> None:
    r = toy_probe("itl_p99<30ms", "stability", min_rate=rate, rate=rate)
    assert (r.capacity_rps == rate) is holds  # type: ignore[attr-defined]
    reasons = " ".join(v["reason"] for v in r.trajectory)  # type: ignore[attr-defined]
    assert holds or "itl p99" in reasons


def test_the_probe_table_shows_goodput_tokens_and_token_latencies_at_the_capacity() -> None:
    r = toy_probe("itl_p99<30ms,errors<1%", "binary", min_rate=20.0, max_rate=200.0)
    console = Console(width=200, record=True)
    console.print(probe_table(r))  # type: ignore[arg-type]
    text = console.export_text()
    for label in ("at it: goodput", "at it: tokens/s", "at it: ITL (every gap, pooled)"):
        assert label in text
    at = r.at_capacity  # type: ignore[attr-defined]
    assert f"in {at.input_tokens_per_s:,.1f}, out {at.output_tokens_per_s:,.1f}" in text
