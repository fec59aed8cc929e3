"""``health.sampling.extrapolated_quantile``: a percentile read from an exponential tail
where the sample is too short to place it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ridgeline.health.sampling import TAIL_FIT, extrapolated_quantile

pytestmark = pytest.mark.timeout(30)


def test_enough_beyond_reads_the_quantile_plainly() -> None:
    values = np.arange(1, 10_001, dtype=float)  # 1 … 10,000: 100 beyond the p99
    assert extrapolated_quantile(values, 0.99) == 9_900.0


def test_an_exact_exponential_tail_is_read_exactly() -> None:
    """Quantiles placed on a line in ln(1/(1 − p)): 3,000 values whose sorted k-th is
    10 + 2·ln(3000/(3000 − k)) (k = 0 … 2,999); the fit through the 30th and 60th from
    the top reads the p99.9 on the same line: 10 + 2·ln(1000)."""
    n = 3_000
    k = np.arange(n)
    values = 10.0 + 2.0 * np.log(n / (n - k))
    got = extrapolated_quantile(values, 0.999)
    # the fitted points are the (n − 1 − 30)th and (n − 1 − 60)th: ln(n/31), ln(n/61)
    near, far = 10 + 2 * math.log(n / 31), 10 + 2 * math.log(n / 61)
    want = near + (near - far) * math.log(TAIL_FIT / (n * 0.001)) / math.log(2.0)
    assert got == pytest.approx(want)
    assert got == pytest.approx(10 + 2 * math.log(1000), rel=0.03)


def test_unanswered_requests_in_the_fit_are_beyond_every_latency() -> None:
    values = np.concatenate([np.ones(2_940), np.full(60, np.nan)])
    assert extrapolated_quantile(values, 0.999) == math.inf


def test_too_small_a_sample_cannot_be_fitted() -> None:
    assert extrapolated_quantile(np.ones(2 * TAIL_FIT), 0.999) == math.inf


def test_it_reads_a_queues_tail_from_a_short_run() -> None:
    """An M/M/1 waiting time at load 0.7 (service 1): P(W > t) = 0.7·e^(−0.3 t), so its
    p99.9 is ln(700)/0.3 = 21.84. From runs of 3,000 draws (three beyond it on average)
    the extrapolation is centred on it: the median of 101 seeded runs within 5 %, where
    the runs' own empirical p99.9 spreads far wider."""
    rng = np.random.default_rng(31)
    truth = math.log(700) / 0.3
    reads = []
    for _ in range(101):
        waiting = np.where(rng.random(3_000) < 0.7, rng.exponential(1 / 0.3, 3_000), 0.0)
        reads.append(extrapolated_quantile(waiting, 0.999))
    assert float(np.median(reads)) == pytest.approx(truth, rel=0.05)
