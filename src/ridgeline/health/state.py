"""The vocabulary of health: five states, a window's observation, an assessment.

Plain data only: the health engine (``health/engine.py``), the warmup detector, the
search strategies and the report all speak it; none of it reads a clock or a socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ridgeline.health.metrics import DEFAULT


class HealthState(StrEnum):
    HEALTHY = "healthy"
    """Every metric comfortably inside its bound."""
    WARN = "warn"
    """Inside every bound, but near one: the sustainable edge."""
    UNHEALTHY = "unhealthy"
    """A bound is broken (latency percentile, error rate), but the system is stable."""
    CRITICAL = "critical"
    """Badly broken: errors dominate, the server is dying or dead, or the GPU is failing."""
    OVERLOADED = "overloaded"
    """Demand exceeds capacity: throughput falls short of the offered rate, or latency
    and queue grow without bound."""

    @property
    def sustainable(self) -> bool:
        """Whether a rate in this state can be served within the SLO."""
        return self in (HealthState.HEALTHY, HealthState.WARN)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the health engine reads from one window (a ``telemetry.windows.Window`` plus
    server and GPU metrics when present). Latencies in ms; None when not measured."""

    start_s: float
    end_s: float
    offered_rps: float
    achieved_rps: float
    error_rate: float
    latency_ms: dict[str, float | None]
    """End-to-end latency percentiles by name: p50, p90, p95, p99, p999, max, mean."""
    answered: int = 0
    queue_length: float | None = None
    mean_batch_size: float | None = None
    token_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Token-level latency percentiles of streamed answers, by metric (``ttft``, ``itl``,
    ``tpot``), each keyed like ``latency_ms``; a metric not measured is absent."""
    kv_cache_usage: float | None = None
    """The server's KV-cache use, 0..1, at its highest in the window (vLLM's gauge)."""
    preemptions: float | None = None
    """Requests the server preempted in the window (vLLM's counter)."""
    gpu_utilisation: float | None = None
    """0..1 when a GPU monitor is present."""
    gpu_problems: tuple[str, ...] = ()
    """Throttle reasons, XID or ECC errors seen in the window; empty when healthy or absent."""

    def statistic(self, metric: str, percentile: str) -> float | None:
        """``percentile`` of ``metric`` (e2e, ttft, itl, tpot), ms; None when not measured."""
        values = self.latency_ms if metric == DEFAULT else self.token_ms.get(metric, {})
        return values.get(percentile)


@dataclass(frozen=True, slots=True)
class Assessment:
    """One window's verdict before hysteresis."""

    state: HealthState
    score: float
    """Combined, weighted distance to the SLO boundary: < 1 inside it, 1 on it, > 1 past."""
    metric_scores: dict[str, float] = field(default_factory=dict)
    """Per metric: its value over its bound (1.0 = on the bound)."""
    reason: str = ""
    all_failed: bool = False
    """Every answered request in the window failed: the server is dying or dead
    (hysteresis moves to Critical at once on such a window)."""
