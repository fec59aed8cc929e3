"""The one judge: a step's records against an SLO policy.

``judge(records, policy)`` reads each bounded metric's samples from the metric table
(``health.metrics``), its statistics from the one percentile estimator
(``telemetry.histogram.latency_summary_ms``), and each request against every bound (the
good requests: goodput, and the plan simulator's violations). The probe's assessment,
``verify``, the plan simulator and goodput all judge through it; the health engine
(``engine.assess``) turns its statistics into scores and a state.

``study.truth`` stays apart on purpose: it is the independent ground truth the probe is
validated against, so it judges plainly, with code of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from ridgeline.health.metrics import DEFAULT, METRICS
from ridgeline.health.slo import LatencyBound, SLOPolicy
from ridgeline.telemetry.histogram import latency_summary_ms
from ridgeline.telemetry.records import FAILED, Outcome, Records
from ridgeline.telemetry.summary import good

Statistics = dict[str, float | None]


@dataclass(frozen=True)
class Judgment:
    """What ``judge`` found (the good requests are counted when first asked for)."""

    statistics: dict[str, Statistics]
    """By metric (``e2e`` always, and every metric the SLO bounds): its statistics, ms,
    keyed p50 … p999, max, mean (None throughout when it had no samples; +inf where the
    statistic falls among requests not answered OK, beyond every bound)."""
    answered: int
    """Judged requests that were sent."""
    error_rate: float
    """Of those, the share that failed (errors, timeouts, incomplete)."""
    policy: SLOPolicy
    records: Records = field(repr=False)
    judged: NDArray[np.bool_] = field(repr=False)
    """The requests judged: those asked for, that were sent."""

    @cached_property
    def good(self) -> NDArray[np.bool_]:
        """Per request: judged, succeeded and met every latency bound on its own values
        (``LatencyBound.meets``: a request meets ``ttft_p99<b`` if its TTFT ≤ b, and
        ``itl_p99<b`` if the p99 of its own gaps ≤ b)."""
        return self.judged & good(self.records, self.policy.latency)

    def value(self, bound: LatencyBound) -> float | None:
        """The bounded statistic, ms; None when the metric had no samples."""
        return self.statistics.get(bound.metric, {}).get(bound.percentile)

    @property
    def latency_held(self) -> bool:
        """Every latency bound's statistic measured and within its bound."""
        return all(
            (v := self.value(b)) is not None and v <= b.bound_ms for b in self.policy.latency
        )

    @property
    def passed(self) -> bool:
        """The latency held and the error rate is within its bound."""
        return self.latency_held and self.error_rate <= self.policy.max_error_rate


def judge(records: Records, policy: SLOPolicy, judged: NDArray[np.bool_] | None = None) -> Judgment:
    """``records`` against ``policy``, over the ``judged`` requests (default: every one
    sent)."""
    sent = records.outcome != int(Outcome.NOT_SENT)
    mask = sent if judged is None else judged & sent
    answered = int(mask.sum())
    failed = int((mask & np.isin(records.outcome, [int(o) for o in FAILED])).sum())
    metrics = dict.fromkeys([DEFAULT, *(b.metric for b in policy.latency)])
    return Judgment(
        statistics={
            m: latency_summary_ms(METRICS[m].samples(records, mask).values) for m in metrics
        },
        answered=answered,
        error_rate=failed / answered if answered else 0.0,
        policy=policy,
        records=records,
        judged=mask,
    )
