"""How the server's late requests come and go, read from a probe's windows: the time a
run must last to hold enough of them to judge the server's long-run share.

A step of 10 s at a server that stalls every 45 s sees a stall or does not, by the luck
of its phase; a confirmation of 30 s judged alone can pass for the same reason, and a
neighbour busy for 36 s of every 90 s makes any run shorter than its cycle a draw.
Within one step nothing shows it: a step that caught no stall has no late request to
be clustered. Across the probe's steps, though, the stalls are there to count.

Their measure is the index of dispersion of counts (IDC: the variance of the late
requests counted in bins of one length, over their mean), the measure of burstiness of
teletraffic (Gusella 1991). Late requests that come one by one give an IDC near 1 at
every length; late requests that come in clusters (a queue's busy period, a stall and
its drain, a neighbour's busy phase) give an IDC that grows with the bin length until a
bin holds a whole cluster and then stays near the clusters' mean size (or falls, when
they come regularly). Its largest value over the lengths, ``dispersion``, is how many
late requests come together: at a rate where ``1 − q`` of the requests are late, a
cluster comes every ``dispersion / ((1 − q)·rate)`` seconds (``spacing_s``), and a run
that must hold ``CLUSTERS`` of them lasts that many times as long (``cover_s``): 45 s
apart for a 500 ms stall every 45 s, 90 s for the neighbour, a second or two for a
heavy-tailed server whose late requests come in short busy periods.

Only windows of steps whose answers kept up with their rate are read (past the
throughput ceiling, late requests are a queue's, growing through the step), and bins
never span two steps: steps run at different rates, and their counts would differ for
that alone. The IDC at a length is the average over the steps long enough to hold two
bins of it, weighted by their bins. With fewer than ``MIN_LATE`` late requests, or
fewer than ``MIN_BINS`` bins at a length, nothing is read at that length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

MIN_LATE = 30
"""Late requests the windows must hold before any time scale is read from them."""
MIN_BINS = 8
"""Bins a length must fill, over all steps, for its IDC to count."""
CLUSTERS = 10
"""A confirmation holds at least this many clusters of late requests (module docstring):
their count then varies by about a third of itself, not by all of it."""


@dataclass(frozen=True, slots=True)
class Window:
    """One window of a step that kept up, in probe time (seconds from the probe's start)."""

    t_s: float
    step: int
    late: int
    """Its requests beyond the SLO's tightest latency bound, or lost."""


@dataclass(frozen=True, slots=True)
class TimeScale:
    """What the windows say of how the server's late requests come and go."""

    dispersion: float
    """How many late requests come together: the largest IDC over the bin lengths read
    (module docstring); 0 when none could be read."""
    idc: tuple[tuple[float, float], ...] = ()
    """(bin length s, IDC) at every length read, shortest first."""
    late: int = 0
    watched_s: float = 0.0

    def spacing_s(self, rate: float, share: float) -> float:
        """Seconds between clusters of late requests at ``rate`` when ``share`` of the
        requests are late (``1 − q`` at a ``pq`` bound's boundary); 0 when unread."""
        return self.dispersion / (share * rate) if self.dispersion and share * rate > 0 else 0.0

    def cover_s(self, rate: float, share: float, clusters: float = CLUSTERS) -> float:
        """How long a run at ``rate`` must last to hold ``clusters`` clusters."""
        return clusters * self.spacing_s(rate, share)

    def describe(self, rate: float, share: float) -> str:
        if not self.dispersion:
            return f"no clustering read ({self.late} late requests in {self.watched_s:.0f} s)"
        return (
            f"late requests came {self.dispersion:.0f} together ({self.late} late in "
            f"{self.watched_s:.0f} s of steps that kept up): at {rate:g} req/s a cluster "
            f"every {self.spacing_s(rate, share):.0f} s"
        )


def time_scale(windows: Sequence[Window], width_s: float) -> TimeScale:
    """The clustering of the late requests of ``windows`` (in time order, each
    ``width_s`` wide)."""
    if not windows:
        return TimeScale(0.0)
    steps = [np.array([w.late for w in step], dtype=np.float64) for step in _steps(windows)]
    late = sum(w.late for w in windows)
    watched = len(windows) * width_s
    if late < MIN_LATE:
        return TimeScale(0.0, late=late, watched_s=watched)
    idc: list[tuple[float, float]] = []
    size = 1
    while (found := _idc(steps, size)) is not None:
        idc.append((size * width_s, found))
        size *= 2
    if not idc:
        return TimeScale(0.0, late=late, watched_s=watched)
    return TimeScale(max(v for _, v in idc), tuple(idc), late, watched)


def _idc(steps: Sequence[NDArray[np.float64]], size: int) -> float | None:
    """The IDC of the late counts (one array a step, a count a window) in bins of
    ``size`` windows, within each step (steps run at different rates: their counts
    differ for that alone; a step's last windows that fill no bin are left out),
    averaged over the steps by their bins; None with fewer than ``MIN_BINS`` bins in
    all."""
    weighted, bins = 0.0, 0
    for late in steps:
        n = len(late) // size
        if n < 2:
            continue
        counts = late[: n * size].reshape(n, size).sum(axis=1)
        mean = float(counts.mean())
        if mean > 0:
            weighted += n * float(counts.var()) / mean
            bins += n
    return weighted / bins if bins >= MIN_BINS else None


def _steps(windows: Sequence[Window]) -> list[list[Window]]:
    """``windows`` grouped by step, in order."""
    out: list[list[Window]] = []
    for w in windows:
        if not out or out[-1][-1].step != w.step:
            out.append([])
        out[-1].append(w)
    return out
