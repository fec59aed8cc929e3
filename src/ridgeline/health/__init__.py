"""Health: is a window, a step, a server inside its SLO — and does it stay there?

``assess`` scores one window against an ``SLOPolicy`` (``parse_slo``); ``smooth`` applies
hysteresis across windows; the warm-up rounds say when a server is warm.
"""

from ridgeline.health.engine import assess, observation_from_window, severity
from ridgeline.health.hysteresis import HysteresisConfig, HysteresisState, smooth
from ridgeline.health.slo import (
    LatencyBound,
    ScoreWeights,
    SLOPolicy,
    format_slo,
    parse_slo,
)
from ridgeline.health.state import Assessment, HealthState, Observation
from ridgeline.health.warmup import (
    WarmupConfig,
    WarmupState,
    warmup_expired,
    warmup_step,
)

__all__ = [
    "Assessment",
    "HealthState",
    "HysteresisConfig",
    "HysteresisState",
    "LatencyBound",
    "Observation",
    "SLOPolicy",
    "ScoreWeights",
    "WarmupConfig",
    "WarmupState",
    "assess",
    "format_slo",
    "observation_from_window",
    "parse_slo",
    "severity",
    "smooth",
    "warmup_expired",
    "warmup_step",
]
