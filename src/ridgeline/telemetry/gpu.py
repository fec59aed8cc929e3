"""GPU health beside the load: is the accelerator itself the reason a step failed?

A ``GpuMonitor`` samples every GPU it sees (``GpuSample``); ``gpu_problems`` turns the
samples into the short texts an ``Observation`` carries, and which the health engine
acts on: a throttling or overheating GPU makes a window Unhealthy, an XID or a
double-bit ECC error makes it Critical (``fatal_gpu_problem``).

Monitors: ``NvmlMonitor`` (local GPUs, nvidia-ml-py), ``PrometheusGpuMonitor`` (a DCGM
exporter or Triton's metrics endpoint), ``NoGpu`` (nothing to watch: health is judged on
latency, errors and throughput alone). ``detect_gpu_monitor`` picks the first that works.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ridgeline.errors import GpuUnavailableError
from ridgeline.telemetry._gpu_base import (
    HARMFUL_THROTTLES,
    THROTTLE_REASONS,
    GpuSample,
    throttle_names,
)
from ridgeline.telemetry._gpu_prom import PrometheusGpuMonitor
from ridgeline.telemetry._nvml import NvmlMonitor

__all__ = [
    "HARMFUL_THROTTLES",
    "THROTTLE_REASONS",
    "GpuMonitor",
    "GpuSample",
    "GpuUnavailableError",
    "NoGpu",
    "NvmlMonitor",
    "PrometheusGpuMonitor",
    "detect_gpu_monitor",
    "fatal_gpu_problem",
    "gpu_problems",
    "mean_utilisation",
    "throttle_names",
]

_XID = " XID error"
_ECC = " ECC double-bit error"


class GpuMonitor(Protocol):
    def sample(self) -> list[GpuSample]:
        """Every GPU now; XID/ECC counts since the previous call."""
        ...

    def describe(self) -> str:
        """What is watched, in a line (for the run's report)."""
        ...


class NoGpu:
    """Nothing to watch; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def sample(self) -> list[GpuSample]:
        return []

    def describe(self) -> str:
        return (
            f"no GPU found ({self.reason}); health is judged on latency, errors and throughput only"
        )


def detect_gpu_monitor(metrics_url: str | None = None) -> GpuMonitor:
    """NVML when nvidia-ml-py imports and sees a device; else the Prometheus endpoint at
    ``metrics_url`` when given; else ``NoGpu`` saying why NVML could not be used."""
    try:
        return NvmlMonitor()
    except GpuUnavailableError as e:
        reason = e.reason
    if metrics_url:
        return PrometheusGpuMonitor(metrics_url)
    return NoGpu(reason)


def gpu_problems(
    samples: Sequence[GpuSample], *, max_temperature_c: float = 87.0
) -> tuple[str, ...]:
    """What is wrong with the GPUs, one text each: harmful throttling, a temperature
    above ``max_temperature_c`` (87 °C: where data-centre GPUs begin to slow down), new
    XID errors, new double-bit ECC errors. Empty when all is well."""
    out: list[str] = []
    for s in samples:
        harmful = [r for r in s.throttle_reasons if r in HARMFUL_THROTTLES]
        if harmful:
            out.append(f"GPU {s.index} throttling: {', '.join(harmful)}")
        if s.temperature_c is not None and s.temperature_c > max_temperature_c:
            out.append(f"GPU {s.index} at {s.temperature_c:.0f} °C > {max_temperature_c:g} °C")
        if s.xid_errors:
            last = f" (last {s.last_xid})" if s.last_xid is not None else ""
            out.append(f"GPU {s.index}: {_count(s.xid_errors, _XID)}{last}")
        if s.ecc_dbe_errors:
            out.append(f"GPU {s.index}: {_count(s.ecc_dbe_errors, _ECC)}")
    return tuple(out)


def fatal_gpu_problem(problem: str) -> bool:
    """Whether a ``gpu_problems`` text is an XID or double-bit ECC error: the GPU is
    failing, not merely slow."""
    return _XID in problem or _ECC in problem


def mean_utilisation(samples: Sequence[GpuSample]) -> float | None:
    """Mean busy fraction over the GPUs that report one (``Observation.gpu_utilisation``)."""
    known = [s.utilisation for s in samples if s.utilisation is not None]
    return sum(known) / len(known) if known else None


def _count(n: int, what: str) -> str:
    return f"{n}{what}{'s' if n != 1 else ''}"
