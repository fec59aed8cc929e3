"""HdrHistogram of latencies in microseconds: exact merging across generator shards.

Values are recorded at 3 significant figures from 1 µs to 1 hour. Recording is
vectorised: the values are bucketed by numpy first, then each distinct value is
recorded once with its count, so a million latencies take milliseconds.

``latency_summary_ms`` reads the percentiles a histogram of the values would give
without building one: hdrh's ``get_value_at_percentile`` walks its ~30,000 buckets in
Python (about 7 ms for one window's five percentiles, most of a simulated probe's time);
the same answer is the top of the bucket of the k-th smallest value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache

import numpy as np
from hdrh.histogram import HdrHistogram
from numpy.typing import NDArray

LOWEST_US = 1
HIGHEST_US = 3_600_000_000
SIGNIFICANT_FIGURES = 3
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
"""The one key set of percentiles, everywhere: summaries, the run store, SLO bounds and
the plan simulator (``p999`` is p99.9: the SLO text reads both, tables show p99.9)."""
STATISTICS = (*PERCENTILES, "max", "mean")
"""Every statistic a summary holds and an SLO may bound."""


def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)


def histogram_of(seconds: NDArray[np.float64]) -> HdrHistogram:
    """A histogram of the finite values of ``seconds`` (NaN = no value, skipped)."""
    h = new_histogram()
    finite = seconds[np.isfinite(seconds)]
    us = np.clip(np.rint(finite * 1e6), LOWEST_US, HIGHEST_US).astype(np.int64)
    values, counts = np.unique(us, return_counts=True)
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        h.record_value(v, c)
    return h


def merge(histograms: Iterable[HdrHistogram]) -> HdrHistogram:
    out = new_histogram()
    for h in histograms:
        out.add(h)
    return out


def encode(h: HdrHistogram) -> str:
    return bytes(h.encode()).decode("ascii")


def decode(text: str) -> HdrHistogram:
    return HdrHistogram.decode(text.encode("ascii"))


def summary_ms(h: HdrHistogram, mean_ms: float | None = None) -> dict[str, float | None]:
    """p50 … p99.9 and max in milliseconds (None throughout for an empty histogram), and
    ``mean_ms`` as given: hdrh's own mean walks every bucket in Python (~60 ms), so
    callers that hold the raw values pass their exact mean instead."""
    if h.get_total_count() == 0:
        return {**dict.fromkeys(PERCENTILES), "max": None, "mean": None}
    out: dict[str, float | None] = {
        k: h.get_value_at_percentile(p) / 1000.0 for k, p in PERCENTILES.items()
    }
    out["max"] = h.get_max_value() / 1000.0
    out["mean"] = mean_ms
    return out


@cache
def _buckets() -> HdrHistogram:
    """An empty histogram, asked only for its bucket bounds (pure arithmetic)."""
    return new_histogram()


def latency_summary_ms(seconds: NDArray[np.float64]) -> dict[str, float | None]:
    """``summary_ms(histogram_of(seconds))`` with the exact mean, computed without the
    histogram: hdrh's value at percentile p is the highest value equivalent to the
    k-th smallest recorded one, k = max(1, int(p·n/100 + 0.5)), and its max the highest
    equivalent to the largest.

    NaN is no value (skipped); +inf is a sample beyond every bound (a request not
    answered OK, ``health.metrics``): it counts in n and ranks above every value, so a
    percentile whose rank falls among such samples, the max and the mean are +inf."""
    seconds = seconds[~np.isnan(seconds)]
    finite = seconds[np.isfinite(seconds)]
    n = int(seconds.size)
    if n == 0:
        return {**dict.fromkeys(PERCENTILES), "max": None, "mean": None}
    us = np.clip(np.rint(finite * 1e6), LOWEST_US, HIGHEST_US).astype(np.int64)
    m, top = int(us.size), _buckets().get_highest_equivalent_value
    ranks = {k: max(int(p * n / 100 + 0.5), 1) for k, p in PERCENTILES.items()}
    # only the order statistics asked for: a partition, not a sort (the same values)
    if m:
        us = np.partition(us, sorted({r - 1 for r in ranks.values() if r <= m} | {m - 1}))

    def at(k: int) -> float:
        return float(top(int(us[k - 1]))) / 1000.0 if k <= m else math.inf

    out: dict[str, float | None] = {k: at(r) for k, r in ranks.items()}
    out["max"] = at(n)
    out["mean"] = float(finite.mean()) * 1000.0 if m == n else math.inf
    return out
