"""Fixed-width windows over a step (default 1 s): the series the health engine reads.

Latency and error counts are attributed to the window in which a request was
*scheduled* (so a timeout counts where its load was offered); achieved throughput
counts successful answers in the window in which they *completed*. Token metrics
(TTFT, pooled ITL, TPOT) go with their request: every gap of a request counts in the
window it was scheduled in.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel

from ridgeline.telemetry.histogram import latency_summary_ms
from ridgeline.telemetry.records import FAILED, Outcome, Records
from ridgeline.telemetry.summary import Percentiles, token_percentiles, tpot_s


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
    ttft_ms: Percentiles | None = None
    """Time to first token from the scheduled send (streamed answers only)."""
    itl_ms: Percentiles | None = None
    """Every inter-chunk gap of the window's requests, pooled."""
    tpot_ms: Percentiles | None = None
    """Time per output token, one per successful request of two tokens or more."""
    server: dict[str, float] = {}
    """Server metrics scraped during the window (counter deltas, gauge values)."""
    state: str | None = None
    """Health state after hysteresis, when a probe assessed the window."""
    score: float | None = None
    """Combined distance to the SLO boundary (< 1 inside), when assessed."""
    excluded: bool = False
    """Before steady state (warmup): left out of the step's verdict."""


def windows(rec: Records, duration_s: float, width_s: float = 1.0) -> list[Window]:
    """Cut a step into windows; ``rec`` is in schedule order (as replays and merges are)."""
    if width_s <= 0:
        raise ValueError("window width must be > 0 s")
    count = max(1, math.ceil(duration_s / width_s - 1e-9))
    edges = np.arange(count + 1) * width_s
    bounds = np.searchsorted(rec.scheduled, edges, side="left")
    bounds[0], bounds[-1] = 0, len(rec)  # anything outside [0, duration) joins the ends
    outcome = rec.outcome
    ok = outcome == int(Outcome.OK)
    failed = np.isin(outcome, [int(o) for o in FAILED])
    dropped = outcome == int(Outcome.DROPPED)
    answered = outcome != int(Outcome.NOT_SENT)
    completed_ok, _ = np.histogram(rec.done[ok], bins=edges)
    latency = rec.latency_from_schedule
    lateness = rec.lateness
    tpot = tpot_s(rec) if np.isfinite(rec.first_token).any() else None
    out: list[Window] = []
    for w in range(count):
        a, b = int(bounds[w]), int(bounds[w + 1])
        mine_answered = answered[a:b]
        n_answered = int(mine_answered.sum())
        n_failed = int(failed[a:b].sum())
        late = lateness[a:b][mine_answered]
        width = float(edges[w + 1] - edges[w])
        out.append(
            Window(
                index=w,
                start_s=float(edges[w]),
                end_s=float(edges[w + 1]),
                offered=b - a,
                ok=int(ok[a:b].sum()),
                failed=n_failed,
                dropped=int(dropped[a:b].sum()),
                completed_ok=int(completed_ok[w]),
                offered_rps=(b - a) / width,
                achieved_rps=float(completed_ok[w]) / width,
                error_rate=n_failed / n_answered if n_answered else 0.0,
                latency_ms=Percentiles(**latency_summary_ms(latency[a:b][mine_answered])),
                lateness_p99_ms=_p99_ms(late),
                **(_tokens(rec, a, b, tpot) if tpot is not None else {}),
            )
        )
    return out


def _tokens(
    rec: Records, a: int, b: int, tpot: NDArray[np.float64]
) -> dict[str, Percentiles | None]:
    tokens = token_percentiles(rec, a, b, tpot)
    del tokens["ttft_from_send_ms"]  # the step's, for peers that time so; not a window's
    return tokens


def _p99_ms(lateness_s: NDArray[np.float64]) -> float | None:
    """The p99 of a window's send lateness in ms (None: nothing sent). A window sent all
    on time (every simulated step) has 0 without ``np.percentile``'s ~75 µs a call, which
    over the ~40,000 windows of a low-rate probe is a fifth of its time."""
    if not lateness_s.size:
        return None
    if not lateness_s.any():
        return 0.0
    return float(np.percentile(lateness_s, 99)) * 1e3
