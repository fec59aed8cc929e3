"""Fixed-width windows over a step (default 1 s): the series the health engine reads.

Latency and error counts are attributed to the window in which a request was
*scheduled* (so a timeout counts where its load was offered); achieved throughput
counts successful answers in the window in which they *completed*.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel

from ridgeline.loadgen.records import FAILED, Outcome, Records
from ridgeline.telemetry.histogram import histogram_of, summary_ms
from ridgeline.telemetry.summary import Percentiles


class Window(BaseModel):
    index: int
    start_s: float
    end_s: float
    offered: int
    ok: int
    failed: int
    dropped: int
    completed_ok: int
    offered_rps: float
    achieved_rps: float
    error_rate: float
    latency_ms: Percentiles
    lateness_p99_ms: float | None
    server: dict[str, float] = {}
    """Server metrics scraped during the window (counter deltas, gauge values)."""
    state: str | None = None
    """Health state after hysteresis, when a probe assessed the window."""
    score: float | None = None
    """Combined distance to the SLO boundary (< 1 inside), when assessed."""
    excluded: bool = False
    """Before steady state (warmup): left out of the step's verdict."""


def windows(rec: Records, duration_s: float, width_s: float = 1.0) -> list[Window]:
    if width_s <= 0:
        raise ValueError("window width must be > 0 s")
    count = max(1, math.ceil(duration_s / width_s - 1e-9))
    edges = np.arange(count + 1) * width_s
    by_sched = np.clip(np.searchsorted(edges, rec.scheduled, side="right") - 1, 0, count - 1)
    ok = rec.outcome == int(Outcome.OK)
    failed = np.isin(rec.outcome, [int(o) for o in FAILED])
    dropped = rec.outcome == int(Outcome.DROPPED)
    answered = rec.outcome != int(Outcome.NOT_SENT)
    done_ok = rec.done[ok]
    completed_ok, _ = np.histogram(done_ok, bins=edges)
    latency = rec.latency_from_schedule
    lateness = rec.lateness
    out: list[Window] = []
    for w in range(count):
        mine = by_sched == w
        n_answered = int((mine & answered).sum())
        n_failed = int((mine & failed).sum())
        late = lateness[mine & answered]
        width = float(edges[w + 1] - edges[w])
        out.append(
            Window(
                index=w,
                start_s=float(edges[w]),
                end_s=float(edges[w + 1]),
                offered=int(mine.sum()),
                ok=int((mine & ok).sum()),
                failed=n_failed,
                dropped=int((mine & dropped).sum()),
                completed_ok=int(completed_ok[w]),
                offered_rps=float(mine.sum()) / width,
                achieved_rps=float(completed_ok[w]) / width,
                error_rate=n_failed / n_answered if n_answered else 0.0,
                latency_ms=Percentiles(**summary_ms(histogram_of(latency[mine & answered]))),
                lateness_p99_ms=float(np.percentile(late, 99)) * 1e3 if late.size else None,
            )
        )
    return out
