"""What a probe is asked (``ProbeConfig``) and what it answers (``ProbeResult``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._fields import Seconds
from ridgeline._kind_names import strategy_help
from ridgeline._same_named import same_named
from ridgeline.health.hysteresis import HysteresisConfig
from ridgeline.health.sampling import judged_quantile, needed_samples, tail_requests
from ridgeline.health.slo import SLOPolicy, SLOText, parse_slo
from ridgeline.health.warmup import WarmupConfig
from ridgeline.search.base import StepPlan, StepVerdict
from ridgeline.search.confirmation import DEFAULT_MARGIN, ConfirmMargin
from ridgeline.telemetry.summary import Percentiles, StepSummary

CONFIRM_TAIL = 100
"""A confirmation expects this many requests beyond the SLO's percentile (10,000 for a
p99): one long run's percentile rests on its tail, and 100 beyond leave it within about
±20 % of the proportion (a binomial's SD is √100)."""
BOUNDARY_TAIL = 30
"""An adaptive step near the boundary expects this many beyond (3,000 for a p99)."""


class ProbeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slo: SLOText = Field(
        parse_slo("p99<100ms,errors<1%"),
        description="the SLO, read once from its text, e.g. 'p99<100ms,errors<0.1%'",
    )
    strategy: str = Field("adaptive", description=strategy_help())
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
    budget_s: Seconds | None = Field(
        None,
        description="the seconds of load the whole probe may spend (warm-up, search and "
        "confirmation; a step's drain counted as it takes): the probe returns the best "
        "confirmed answer reachable in them and says what bound it; None: no budget",
    )
    sequential: bool | None = Field(
        None,
        description="end a confirmation as soon as its outcome is decided (looks of at "
        f"least {60:g} s, each at a share of the error rate: see probe.sequential); None: "
        "on with a budget, off without",
    )
    seed: int = Field(0, ge=0, description="seed of every step's schedule (≥ 0)")

    def looks(self) -> bool:
        """Whether confirmations end early once decided (``sequential``)."""
        return self.sequential if self.sequential is not None else self.budget_s is not None

    def policy(self) -> SLOPolicy:
        """The SLO (parsed once, when the config was made)."""
        return self.slo

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

    def sure_s(self, rate: float) -> float:
        """The seconds a run at ``rate`` needs before it can pass surely at all: none
        beyond its percentile bound and no error shown that rare at the boundary
        (``sampling.needed_samples`` with the error bound: ``errors<0.1%`` needs 2,995
        requests, where its p99 alone needs 299), three standard deviations of a
        Poisson count more: a look of exactly 2,995 / 20.49 s sent 2,935)."""
        n = needed_samples(self.policy(), self.confidence, errors=True)
        return (n + 3.0 * math.sqrt(n)) / rate

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


class AtCapacity(BaseModel):
    """What the step that set the capacity measured (its confirmation, when one held):
    the goodput and token rates a user of an LLM endpoint asks for beside the rate."""

    rate_rps: float = Field(description="the offered rate of that step")
    achieved_rps: float
    goodput_rps: float | None = Field(
        None, description="successful requests meeting every per-request bound, per second"
    )
    input_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    e2e_ms: Percentiles
    ttft_ms: Percentiles | None = None
    itl_ms: Percentiles | None = None
    tpot_ms: Percentiles | None = None

    @classmethod
    def of(cls, rate: float, s: StepSummary) -> AtCapacity:
        return same_named(cls, s, rate_rps=rate, e2e_ms=s.latency_ms)


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
    wall_s: float = 0.0
    """The probe's seconds as its budget counts them: each step's wall time on a real
    endpoint (connecting and draining included), its length in virtual time."""
    budget_s: float | None = None
    """The budget it was given (``ProbeConfig.budget_s``)."""
    warmup_s: float = 0.0
    """Seconds of the warm-up phase (its rounds until the p50 stopped falling)."""
    warmup_requests: int = 0
    """Requests the warm-up phase sent: a server warming by work needs its requests."""
    warmup_steady: bool | None = None
    """Whether the warm-up ended steady (False: its cap ended it still warming; None: no
    warm-up ran)."""
    valid: bool
    confirmed: bool | None
    reason: str
    slo: str
    target: str
    run_id: int | None = None
    status: str = "complete"
    gpu: str = "not monitored"
    """What watched the GPUs: NVML, a DCGM/Triton endpoint, or why none could."""
    at_capacity: AtCapacity | None = None
    """The step that held at the capacity found: goodput, tokens/s, TTFT/ITL/TPOT."""
    health_timeline: list[dict[str, Any]] = Field(default_factory=list)
    trajectory: list[dict[str, Any]] = Field(default_factory=list)


ProgressFn = Callable[[int, StepPlan, StepVerdict], None]
StartFn = Callable[[int, StepPlan], None]
"""Called as a step starts (its index and plan): a long step can say so."""


def verdict_dict(v: StepVerdict) -> dict[str, Any]:
    d = asdict(v)
    d["state"] = v.state.value
    return d


def strategy_step_s(cfg: ProbeConfig) -> float:
    return float(cfg.strategy_options.get("step_duration_s", 10.0))
