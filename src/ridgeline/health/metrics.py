"""The SLO's metrics, each declared once: how its samples come from a step's records,
its unit, how it is shown, and how one request meets a bound on it.

An SLO latency bound (``health.slo.LatencyBound``) names a metric of this table and a
statistic (``telemetry.histogram.STATISTICS``: p50, p90, p95, p99, p999, max, mean). The judge
(``health.judge``), the probe's tail count, goodput and the plan simulator all read the
table; none of them branches on a metric's name. A new metric is one entry in
``METRICS`` (and its test): the SLO text then reads ``<name>_p99<…>``. (The health
timeline's one-second windows carry end-to-end and token latencies only, summarised by
``telemetry.windows``; a step's verdict, which is what the search is told, reads every
metric of the table.)

Percentiles of every metric come from one estimator, ``telemetry.histogram
.latency_summary_ms``, under one key set (``p999``, the run store's key; the SLO text
also reads ``p99.9``, and tables show it so).

A judged request not answered OK — an error, a timeout, a refusal or early drop (a full
queue's instant 503), an answer the step stopped waiting for — is beyond every bound of
every metric, whatever time it took to fail: ``Metric.samples`` makes it a sample of
+inf (a pooled metric adds one beyond its gaps), and every reader inherits that — the
judge's percentiles, the probe's tail count and its intervals. A refusal in 0.2 ms is no
fast answer. ``study.truth`` judges the same way, with code of its own (one corner
apart: there a request that failed after its first token keeps its TTFT).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.summary import gap_statistic, tpot_s, ttft_s

DEFAULT = "e2e"
"""The metric a bare statistic (``p99<50ms``) bounds."""

Mask = NDArray[np.bool_]
Seconds = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Samples:
    """A metric's samples among some requests, seconds."""

    values: Seconds
    """+inf: a request not answered OK, beyond every bound (never NaN)."""
    when: Seconds
    """Each sample's request's scheduled time."""
    owner: NDArray[np.int64] | None = None
    """The request each sample came from, when one request gives many (ITL's gaps)."""


@dataclass(frozen=True, slots=True)
class Metric:
    """One SLO metric: a row of ``METRICS``."""

    name: str
    """Its prefix in the SLO text (``ttft`` in ``ttft_p99<200ms``); ``e2e`` needs none."""
    label: str
    """What it is, for help and error text."""
    per_request: Callable[[Records], Seconds]
    """Each request's value (NaN: it has none)."""
    missing_meets: bool = False
    """Whether a request without a value meets a bound (a one-token answer has no TPOT
    and no gaps) or not (no first token is no TTFT within any bound)."""
    from_schedule: bool = False
    """Timed from the scheduled send, so a late send moves it (the generator's lateness is
    judged against its bound) and a queue shows in it first."""
    unit: str = "ms"
    """The unit bounds and statistics are shown in (samples are in seconds)."""
    pooled: Callable[[Records, Mask], Samples] | None = None
    """Samples that are not one per request (ITL's gaps), when the metric has them."""
    own_statistic: Callable[[Records, str], Seconds] | None = None
    """A request's own statistic of its pooled samples (its p99 gap), for goodput."""

    def samples(self, rec: Records, judged: Mask) -> Samples:
        """The samples of the ``judged`` requests: each one not answered OK is +inf,
        beyond every bound; each answered OK gives its value, or none when it has none
        (an answer that did not stream has no TTFT, a one-token one no TPOT). A pooled
        metric gives the pooled samples of every judged request (the gaps that came),
        and one +inf for each not answered OK."""
        failed = judged & (rec.outcome != int(Outcome.OK))
        if self.pooled is not None:
            pooled, who = self.pooled(rec, judged), np.flatnonzero(failed)
            owner = None if pooled.owner is None else np.concatenate([pooled.owner, who])
            return Samples(
                np.concatenate([pooled.values, np.full(who.size, np.inf)]),
                np.concatenate([pooled.when, rec.scheduled[who]]),
                owner,
            )
        values = np.where(failed, np.inf, self.per_request(rec))
        taken = judged & ~np.isnan(values)
        return Samples(values[taken], rec.scheduled[taken])

    def each(self, rec: Records, statistic: str) -> Seconds:
        """Each request's value a bound on ``statistic`` judges it by (goodput)."""
        if self.own_statistic is not None:
            return self.own_statistic(rec, statistic)
        return self.per_request(rec)

    def meets(self, rec: Records, statistic: str, bound_ms: float) -> Mask:
        """Which requests meet ``statistic < bound_ms`` on their own values."""
        values = self.each(rec, statistic)
        limit = bound_ms / 1000.0
        held = ~(values > limit) if self.missing_meets else values <= limit
        return np.asarray(held, dtype=np.bool_)

    def bound_name(self, statistic: str) -> str:
        """How the SLO text names a statistic of it: ``p99``, ``ttft_p99``."""
        return statistic if self.name == DEFAULT else f"{self.name}_{statistic}"


def _gaps(rec: Records, judged: Mask) -> Samples:
    counts = np.where(judged, rec.gap_counts(), 0)
    owner = np.repeat(np.arange(len(rec)), counts)
    keep = np.repeat(judged, rec.gap_counts())
    return Samples(rec.gaps[keep], rec.scheduled[owner], owner)


def _e2e(rec: Records) -> Seconds:
    return rec.latency_from_schedule


def _no_value(rec: Records) -> Seconds:
    return np.full(len(rec), np.nan)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            DEFAULT,
            "end-to-end latency, from the scheduled send",
            _e2e,
            from_schedule=True,
        ),
        Metric("ttft", "time to first token, from the scheduled send", ttft_s, from_schedule=True),
        Metric(
            "itl",
            "inter-token latency: every gap between content chunks, pooled",
            _no_value,
            missing_meets=True,
            pooled=_gaps,
            own_statistic=gap_statistic,
        ),
        Metric(
            "tpot",
            "time per output token after the first: (e2e − ttft) / (tokens − 1)",
            tpot_s,
            missing_meets=True,
        ),
        Metric(
            "send",
            "latency from the actual send: the server's own time, the generator's lateness "
            "left out",
            lambda rec: rec.latency_from_send,
        ),
    )
}
"""Every SLO metric, by the name the SLO text prefixes a statistic with."""
