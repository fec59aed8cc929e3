"""How many requests an SLO percentile needs, and what a step's count of them says.

A p99 bound is a statement about a proportion: at most 1 % of requests beyond the bound.
A step that sent ``n`` requests of which ``k`` took longer is a binomial draw, so the
evidence it carries is the binomial's (MLPerf LoadGen sizes its runs the same way, from
the percentile and a confidence):

* ``decisive_samples(q, c)`` — the fewest requests that can show a percentile held: with
  none beyond the bound, ``n ≥ ln(1 − c) / ln(q)`` (299 for a p99 at 95 %, 2,995 for a
  p99.9; the "rule of three"). Fewer requests cannot tell a held p99 from a missed one,
  whatever they measured.
* ``exceeds(n, k, q, c)`` — whether ``k`` beyond the bound in ``n`` shows, at confidence
  ``c``, that more than ``1 − q`` lie beyond: a failure that few requests decide anyway
  (30 of 40 beyond a p99 bound is no coin toss).
* ``tail_requests(q, tail)`` — requests for ``tail`` expected beyond the percentile: the
  length of a step that has to place the boundary, or of a confirmation.
* ``quantile_interval(values, q, c)`` — the distribution-free confidence interval of the
  ``q``-quantile from order statistics: what a step reports beside its p99.
* ``extrapolated_quantile(values, q)`` — the ``q``-quantile read from an exponential tail
  fitted where the sample still has ``TAIL_FIT`` and twice as many beyond: what a run too
  short to bound its percentile (a p99.9 on 3,000 requests) can still say of it.
* ``dispersion(beyond, totals, c)`` — how many requests one independent one is worth when
  requests beyond the bound come in clusters (a stall delays every request caught in
  it; near saturation a long busy period delays hundreds): the batch-means variance of
  the step's slices over the binomial's, when a χ² test at ``c`` shows it larger. Every
  count above is then a count of *effective* requests, ``n / dispersion``.

Pure functions of counts; the probe's assessment and orchestrator use them.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike

from ridgeline.health.slo import SLOPolicy
from ridgeline.telemetry.histogram import PERCENTILES

QUANTILES = {k: round(p / 100.0, 9) for k, p in PERCENTILES.items()}
"""The quantile of each percentile bound an SLO may hold (``max`` and ``mean`` have no
proportion to count)."""

_EXACT_BELOW = 2_000.0
"""Binomial tails are summed exactly while the expected count is below this; beyond it
the normal approximation is exact to far better than a request."""


def judged_quantile(policy: SLOPolicy) -> float | None:
    """The quantile of the SLO's highest percentile bound (0.99 for ``p99<50ms``), the
    one that needs the most requests; None when it bounds no percentile."""
    qs = [QUANTILES[b.percentile] for b in policy.latency if b.percentile in QUANTILES]
    return max(qs, default=None)


def needed_samples(policy: SLOPolicy, confidence: float, *, errors: bool = False) -> int:
    """The fewest requests that can show ``policy``'s tightest percentile bound held
    (its error bound when it has none, or with ``errors``: ``errors<0.1%`` is a
    proportion too, 2,995 requests at 95 %, and decides a failure by errors)."""
    qs = [QUANTILES[b.percentile] for b in policy.latency if b.percentile in QUANTILES]
    if errors or not qs:
        qs.append(1.0 - policy.max_error_rate)
    return max(decisive_samples(q, confidence) for q in qs if 0.0 < q < 1.0)


def decisive_samples(q: float, confidence: float) -> int:
    """The fewest requests in which none beyond the ``q``-quantile's bound shows, at
    ``confidence``, that at most ``1 − q`` lie beyond: ``⌈ln(1 − c) / ln(q)⌉``."""
    _check(q, confidence)
    return math.ceil(math.log(1.0 - confidence) / math.log(q))


def tail_requests(q: float, tail: float) -> int:
    """Requests in which ``tail`` are expected beyond the ``q``-quantile: ``tail/(1−q)``."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must lie in (0, 1), got {q}")
    return math.ceil(tail / (1.0 - q) - 1e-9)


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return 1.0 - binomial_cdf(k - 1, n, p)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, p): summed exactly for a small expected count, by the
    normal approximation (with continuity correction) for a large one."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p > 0.5:  # sum the smaller side: P(X ≤ k) = 1 − P(n − X ≤ n − k − 1)
        return 1.0 - binomial_cdf(n - k - 1, n, 1.0 - p)
    mean = n * p
    if mean >= _EXACT_BELOW:
        sd = math.sqrt(mean * (1.0 - p))
        return NormalDist(mean, sd).cdf(k + 0.5)
    if p <= 0.0:
        return 1.0
    log_pmf = n * math.log1p(-p)  # P(X = 0)
    ratio = p / (1.0 - p)
    total = 0.0
    for i in range(k + 1):
        term = math.exp(log_pmf)
        total += term
        if i > mean and term < 1e-17 * total:
            break  # the rest is below rounding
        log_pmf += math.log((n - i) / (i + 1) * ratio)
    return min(total, 1.0)


def exceeds(n: int, k: int, q: float, confidence: float) -> bool:
    """Whether ``k`` of ``n`` beyond the ``q``-quantile's bound show, at ``confidence``,
    that more than ``1 − q`` of all requests lie beyond it (a one-sided binomial test)."""
    _check(q, confidence)
    return n > 0 and binomial_sf(k, n, 1.0 - q) <= 1.0 - confidence


def quantile_interval(values: ArrayLike, q: float, confidence: float) -> tuple[float, float]:
    """The distribution-free ``confidence`` interval of the ``q``-quantile of ``values``
    (NaN, an unanswered request, sorts beyond every latency): the order statistics of
    ranks ``[l, u]`` with P(X < l) and P(X ≥ u) at most (1 − c)/2 each for X ~
    Binomial(n, q). An end no rank reaches (too few values) is ±inf."""
    _check(q, confidence)
    v = np.asarray(values, dtype=np.float64)
    v = np.where(np.isnan(v), np.inf, v)
    n = int(v.size)
    if n == 0:
        return -math.inf, math.inf
    alpha = (1.0 - confidence) / 2.0
    lo = _rank_at_most(n, q, alpha)
    hi = n - _rank_at_most(n, 1.0 - q, alpha)
    kth = [r for r in (lo - 1, hi) if 0 <= r < n]
    if kth:  # the two order statistics only: a partition, not a sort
        v = np.partition(v, kth)
    low = float(v[lo - 1]) if lo >= 1 else -math.inf
    high = float(v[hi]) if hi < n else math.inf
    return low, high


def _rank_at_most(n: int, q: float, alpha: float) -> int:
    """The largest r with P(X < r) ≤ alpha for X ~ Binomial(n, q), 0 when none: below
    the order statistic of rank r lie fewer than r values, with probability ≤ alpha."""
    mean = n * q
    lo, hi = 0, n + 1  # P(X < 0) = 0 ≤ alpha; P(X < n + 1) = 1 > alpha
    if min(mean, n - mean) >= _EXACT_BELOW:  # start near the normal's answer
        guess = int(mean + NormalDist().inv_cdf(alpha) * math.sqrt(mean * (1 - q)))
        lo, hi = max(0, guess - 3), min(n + 1, guess + 4)
        while lo > 0 and binomial_cdf(lo - 1, n, q) > alpha:
            lo = max(0, lo - 8)
        while hi <= n and binomial_cdf(hi - 1, n, q) <= alpha:
            hi = min(n + 1, hi + 8)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if binomial_cdf(mid - 1, n, q) <= alpha else (lo, mid)
    return lo


BATCHES = 10
"""Consecutive time slices a step's requests are batched into for ``dispersion``: enough
for a variance on 9 degrees of freedom, few enough that a slice of a short step still
holds a cluster (a 10 s step's slices are 1 s)."""


def dispersion(beyond: ArrayLike, totals: ArrayLike, confidence: float) -> float:
    """How much more the share beyond the bound varies between a step's time slices than
    it would if requests were independent (1 when it does not, or no test shows it).

    ``beyond[i]`` of ``totals[i]`` requests in slice ``i`` lay beyond the bound. Under
    independence the slices' counts are binomial, and ``R = Σ (kᵢ − p̂ nᵢ)² / (p̂(1 − p̂)
    n̄ (B − 1))`` is about 1 (``(B − 1)·R`` is χ² on ``B − 1`` degrees of freedom: the
    batch-means estimate of the variance over the binomial's). Clusters make ``R`` large:
    one stall putting 40 requests beyond the bound in a 10 s step makes its 7,800
    requests worth about 290 independent ones. ``R`` is taken only when it passes the χ²
    test's ``confidence`` quantile, so an independent server keeps its full count."""
    k = np.asarray(beyond, dtype=np.float64)
    n = np.asarray(totals, dtype=np.float64)
    keep = n > 0
    k, n = k[keep], n[keep]
    b = int(k.size)
    total = float(n.sum())
    if b < 2 or total <= 0:
        return 1.0
    p = float(k.sum()) / total
    if not 0.0 < p < 1.0:
        return 1.0
    ratio = float(((k - p * n) ** 2).sum()) / (p * (1.0 - p) * (total / b) * (b - 1))
    return ratio if ratio > chi2_quantile(b - 1, confidence) / (b - 1) else 1.0


def chi2_quantile(df: int, p: float) -> float:
    """The ``p``-quantile of χ² on ``df`` degrees of freedom (Wilson–Hilferty: within
    0.2 % of the exact value from 5 degrees of freedom up; 16.90 for 9 at 0.95, exactly
    16.92)."""
    z = NormalDist().inv_cdf(p)
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def _check(q: float, confidence: float) -> None:
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must lie in (0, 1), got {q}")
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must lie in [0.5, 1), got {confidence}")


TAIL_FIT = 30
"""``extrapolated_quantile`` fits the tail between the quantiles with this many and twice
this many of the sample beyond them: each is then placed to within about a fifth of its
proportion (a binomial's SD is √30)."""


def extrapolated_quantile(values: ArrayLike, q: float) -> float:
    """The ``q``-quantile of ``values`` (NaN or +inf: no answer, beyond every latency)
    from an exponential tail: a queue's waiting time has one (Kingman), so its quantiles
    grow linearly in ln(1/(1 − p)). The line is drawn through the empirical quantiles
    with ``TAIL_FIT`` and ``2·TAIL_FIT`` values beyond them and read at ``q``; where the
    sample holds enough beyond ``q`` itself, that quantile is read plainly. +inf when
    unanswered requests reach the fit, or the sample is too small for it."""
    v = np.asarray(values, dtype=np.float64)
    v = np.sort(np.where(np.isnan(v), np.inf, v))
    n = int(v.size)
    if n * (1.0 - q) >= TAIL_FIT:
        return float(v[min(n - 1, math.ceil(q * n) - 1)])
    if n < 2 * TAIL_FIT + 1:
        return math.inf
    near, far = float(v[n - 1 - TAIL_FIT]), float(v[n - 1 - 2 * TAIL_FIT])
    if not math.isfinite(near):
        return math.inf
    # ln(1/(1-p)) at the two fitted quantiles differ by ln 2
    return near + (near - far) * math.log(TAIL_FIT / (n * (1.0 - q))) / math.log(2.0)
