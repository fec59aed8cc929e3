"""A schedule: every send time (and request size) of a step, made before it runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import ConfigError
from ridgeline.workload.arrivals import ArrivalSpec
from ridgeline.workload.payloads import RequestShape, shapes_from_trace
from ridgeline.workload.traces import Trace, read_trace


@dataclass(frozen=True)
class Schedule:
    times: NDArray[np.float64]
    """Seconds from the step's start, sorted."""
    shapes: list[RequestShape] | None
    """Per-request sizes, or None for the default shape throughout."""
    duration_s: float
    description: str

    @property
    def rate(self) -> float:
        return len(self.times) / self.duration_s if self.duration_s > 0 else 0.0


def from_arrival(spec: ArrivalSpec, duration_s: float, seed: int = 0) -> Schedule:
    if duration_s <= 0:
        raise ConfigError(f"duration must be > 0 s, got {duration_s}")
    times = spec.schedule(duration_s, seed)
    return Schedule(times, None, duration_s, f"{spec!r}, {duration_s:g} s, seed {seed}")


def from_trace(
    trace: Trace | str | Path,
    *,
    target_rate: float | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
) -> Schedule:
    """Replay a recorded trace at its own pace, or time-scaled to ``target_rate`` (the
    relative gaps kept); optionally a window [start_s, start_s + duration_s) of it,
    taken after scaling."""
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    if target_rate is not None:
        tr = tr.scaled_to_rate(target_rate)
    end = tr.duration + 1e-9 if duration_s is None else start_s + duration_s
    tr = tr.window(start_s, end)
    if len(tr) == 0:
        raise ConfigError(
            f"the trace window [{start_s:g}, {end:g}) s of {tr.source} holds no requests; "
            "widen --duration or move the window"
        )
    span = duration_s if duration_s is not None else float(tr.times[-1]) + _last_gap(tr.times)
    scaled = f", scaled to {target_rate:g}/s" if target_rate is not None else ""
    return Schedule(
        np.asarray(tr.times, dtype=np.float64),
        shapes_from_trace(tr),
        span,
        f"trace {tr.source}{scaled}, {span:g} s from {start_s:g} s",
    )


def trace_at_rate(trace: Trace, rate: float, duration_s: float) -> Schedule:
    """``duration_s`` of the trace's arrivals holding ``rate``: its first
    ``n = rate·duration_s`` requests (cycling from its start again when it holds fewer),
    time-scaled so that they fill the span, their gaps and sizes kept. The step offers
    exactly its labelled rate, with the trace's burstiness; every step and confirmation
    replays the same opening stretch, so steps at different rates differ by their rate
    and not by which part of the trace they saw. Scaling the whole trace to ``rate`` and
    cutting out the first ``duration_s`` would not hold the rate: a recorded trace's
    opening seconds are far from its mean (a "50 req/s" step offered 11.2 req/s)."""
    if not (np.isfinite(rate) and rate > 0):
        raise ConfigError(f"a step's rate must be finite and > 0 req/s, got {rate}")
    if not (np.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"a step's duration must be finite and > 0 s, got {duration_s}")
    n = max(1, round(rate * duration_s))
    if len(trace) < 2:
        raise ConfigError(f"trace {trace.source!r} holds one request: it has no gaps to replay")
    gaps = np.diff(trace.times)
    if not gaps.sum() > 0:
        raise ConfigError(f"trace {trace.source!r} spans no time: it has no gaps to replay")
    picked = np.resize(gaps, n)  # the first n gaps, cycling
    if not picked.sum() > 0:  # those arrivals came all at once: spread them evenly
        picked = np.ones(n)
    # shares first: a denormal gap (2e-313 s, found by Hypothesis) over its own sum is 1,
    # where duration / sum overflows
    ends = np.cumsum(picked / picked.sum()) * duration_s
    times = np.minimum(np.concatenate(([0.0], ends[:-1])), duration_s)  # the (n+1)-th at the end
    rows = np.resize(np.arange(len(trace)), n)
    sized = Trace(times, {k: c[rows] for k, c in trace.columns.items()}, trace.source)
    return Schedule(
        np.asarray(times, dtype=np.float64),
        shapes_from_trace(sized),
        duration_s,
        f"trace {trace.source}, its first {n} arrivals at {rate:g}/s over {duration_s:g} s",
    )


def _last_gap(times: NDArray[np.float64]) -> float:
    """A span for an open-ended replay: to the last arrival plus one mean gap."""
    if len(times) < 2:
        return 1.0
    return float(times[-1] - times[0]) / (len(times) - 1)
