"""How many requests a percentile needs (``health.sampling``), and the probe sizing its
steps by it: binomial laws checked against exact rational arithmetic, the interval's
coverage by simulation, and step lengths that follow the SLO's percentile."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.aio import run_coroutine
from ridgeline.health.sampling import (
    binomial_cdf,
    chi2_quantile,
    decisive_samples,
    dispersion,
    exceeds,
    needed_samples,
    quantile_interval,
    tail_requests,
)
from ridgeline.health.slo import parse_slo
from ridgeline.health.state import Observation
from ridgeline.probe.assess import Tail
from ridgeline.probe.drivers import SimDriver
from ridgeline.probe.orchestrator import (
    POOLED_CAPS,
    UNDECIDED_RERUNS,
    ProbeConfig,
    ProbeResult,
    probe,
)
from ridgeline.sim import load_sim_preset
from ridgeline.synthetic.model import LatencyModel


def exact_cdf(k: int, n: int, p: Fraction) -> float:
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1)))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    p=st.sampled_from([Fraction(1, 1000), Fraction(1, 100), Fraction(1, 20), Fraction(1, 2)]),
    data=st.data(),
)
def test_the_binomial_cdf_matches_exact_rational_arithmetic(
    n: int, p: Fraction, data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, n))
    assert binomial_cdf(k, n, float(p)) == pytest.approx(exact_cdf(k, n, p), abs=1e-12)
    # the upper side is summed through its complement: the same law
    assert binomial_cdf(k, n, float(1 - p)) == pytest.approx(exact_cdf(k, n, 1 - p), abs=1e-12)


def test_the_fewest_decisive_requests_are_where_a_clean_run_first_proves_the_bound() -> None:
    """None beyond in n requests shows at 95 % that ≤ 1 % lie beyond once 0.99ⁿ ≤ 0.05."""
    for q in (0.9, 0.99, 0.999):
        n = decisive_samples(q, 0.95)
        assert q**n <= 0.05 < q ** (n - 1)
    assert decisive_samples(0.99, 0.95) == 299  # the "rule of three": ≈ 3/(1 − q)
    assert tail_requests(0.99, 100) == 10_000 and tail_requests(0.999, 100) == 100_000
    # an error bound is a proportion too: what a failure by errors needs to decide
    assert needed_samples(parse_slo("p99<50ms,errors<0.1%"), 0.95) == 299
    assert needed_samples(parse_slo("p99<50ms,errors<0.1%"), 0.95, errors=True) == 2_995
    assert needed_samples(parse_slo("p99.9<50ms,errors<1%"), 0.95) == 2_995
    assert needed_samples(parse_slo("errors<0.1%"), 0.95) == 2_995


def test_a_plain_failure_on_few_requests_decides_and_a_narrow_one_does_not() -> None:
    assert exceeds(40, 30, 0.99, 0.95)  # 30 of 40 beyond a p99 bound: no coin toss
    assert exceeds(44, 3, 0.99, 0.95)  # P(X ≥ 3 | 44, 1 %) ≈ 0.0098
    assert not exceeds(44, 1, 0.99, 0.95)  # P(X ≥ 1) ≈ 0.36: chance
    assert not exceeds(10_000, 110, 0.99, 0.95)  # 1.1 % on 10,000: within noise


@pytest.mark.parametrize(("q", "n"), [(0.5, 41), (0.9, 300), (0.99, 1_000), (0.99, 20_000)])
def test_the_percentile_interval_covers_the_true_quantile_at_its_confidence(
    q: float, n: int
) -> None:
    """Exponential latencies (true q-quantile −ln(1 − q)), 400 seeded runs each: the 95 %
    interval holds the truth in at least 93 % of them (distribution-free and, being
    discrete, conservative)."""
    rng = np.random.default_rng(7)
    truth = -math.log(1 - q)
    hits = sum(
        lo <= truth <= hi
        for lo, hi in (quantile_interval(rng.exponential(1, n), q, 0.95) for _ in range(400))
    )
    assert hits / 400 >= 0.93


def test_an_interval_too_few_values_reach_is_open_at_its_top() -> None:
    lo, hi = quantile_interval(np.arange(100.0), 0.99, 0.95)
    assert hi == math.inf and 90 <= lo < 99
    assert quantile_interval([], 0.99, 0.95) == (-math.inf, math.inf)
    # an unanswered request (NaN) sorts beyond every latency
    assert quantile_interval([1.0, float("nan")] * 200, 0.5, 0.95)[1] == math.inf


def probed(slo: str, strategy: str = "binary", **options: object) -> ProbeResult:
    preset = load_sim_preset("vision")
    cfg = ProbeConfig(slo=slo, strategy=strategy, strategy_options={"min_rate": 20.0, **options})
    return run_coroutine(probe(SimDriver(preset, label="vision"), cfg))


@pytest.mark.parametrize(("slo", "tail"), [("p99<50ms", 10_000), ("p99.9<80ms", 100_000)])
def test_the_confirmation_follows_the_slo_percentile(slo: str, tail: int) -> None:
    """A confirmation expects 100 requests beyond the percentile: 10,000 for a p99,
    100,000 for a p99.9 (ten times the length at a like rate)."""
    r = probed(slo)
    confirms = [t for t in r.trajectory if t["purpose"] == "confirm"]
    assert confirms and r.confirmed, r.reason
    for t in confirms:
        assert t["duration_s"] * t["rate"] >= tail * (1 - 1e-9), t
        assert t["samples"] >= 0.5 * tail, t
        # a clustered confirmation pools more runs with the first: never shorter
        assert t["duration_s"] >= max(30.0, tail / t["rate"]) * (1 - 1e-9), t
    # sized by the percentile, or longer when the server's late requests came in
    # clusters the probe saw (``health.timescale``: a confirmation holds 10 of them)
    assert confirms[0]["duration_s"] >= max(30.0, tail / confirms[0]["rate"]) * (1 - 1e-9)


def test_a_cap_shortens_a_step_but_never_below_what_its_percentile_needs() -> None:
    cfg = ProbeConfig(slo="p99<50ms", max_step_s=60.0)
    assert cfg.capped_s(1_000.0, 300.0) == 60.0
    assert cfg.capped_s(1.0, 30.0) == 30.0  # short steps are left alone
    assert cfg.capped_s(1.0, 900.0) == 299.0  # capped, but 299 requests at 1 req/s
    assert ProbeConfig(slo="p99.9<50ms").capped_s(1.0, 5_000.0) == 2_995.0


def test_a_narrow_failure_on_few_requests_is_run_again_until_it_decides() -> None:
    """A slow server (one instance, ~190 ms a request, about 2 req/s at p99<600 ms) probed
    from 1 req/s with 10 s steps: a 10 s step near the boundary holds 40 requests, and
    one or two slow answers among them are chance. Such a failure never moves the
    search: it is run again, long enough for the 299 requests a p99 needs; every failure
    the search acts on had them, or failed too plainly for chance; and every step that
    places the boundary (bisecting) is that long from the start."""
    base = load_sim_preset("vision")
    slow = {
        **base.model.model_dump(),
        "base_ms": 190.0,
        "per_item_ms": 0.0,
        "instances": 1,
        "noise_cv": 0.1,
        "batching": {"max_batch_size": 1, "max_queue_delay_s": 0.0},
    }
    preset = base.model_copy(
        update={"model": LatencyModel.model_validate(slow), "slo": "p99<600ms"}
    )
    cfg = ProbeConfig(slo=preset.slo, strategy="binary", strategy_options={"min_rate": 1.0})
    r = run_coroutine(probe(SimDriver(preset, label="slow"), cfg))
    steps = r.trajectory
    undecided = [i for i, t in enumerate(steps) if not t["decided"]]
    assert undecided, "no narrow failure on few requests: the case does not test the rule"
    for i in undecided:
        chain = 1  # the runs at this rate so far, each pooled with those before
        while chain <= i and steps[i - chain]["rate"] == steps[i]["rate"]:
            chain += 1
        if chain > UNDECIDED_RERUNS or steps[i]["duration_s"] >= POOLED_CAPS * 600.0 - 1e-6:
            continue  # no more runs (or the pooled step is two caps long): it stands
        again = steps[i + 1]
        assert again["rate"] == steps[i]["rate"], again
        assert again["duration_s"] >= 1.25 * 299 / again["rate"], again
        assert again["duration_s"] >= 2 * steps[i]["duration_s"] - 1e-9, again
        # decided, unless its late requests came in clusters (near saturation)
        assert again["decided"] or again["dispersion"] > 1.0, again
    acted = [
        t for i, t in enumerate(steps) if t["decided"] and t["state"] not in ("healthy", "warn")
    ]
    for t in acted:
        assert t["samples"] >= 299 or exceeds(t["samples"], t["beyond"], 0.99, 0.95), t
    placing = [t for t in steps if t["purpose"] == "bisect"]
    assert placing and all(t["duration_s"] >= 299 / t["rate"] for t in placing)


def test_the_chi_square_quantile_matches_the_tables() -> None:
    # the published values: chi-square on 9 and 30 degrees of freedom
    for df, p, table in [(9, 0.95, 16.919), (9, 0.99, 21.666), (30, 0.95, 43.773)]:
        assert chi2_quantile(df, p) == pytest.approx(table, rel=2e-3)


def test_independent_slices_keep_their_count_and_a_cluster_is_worth_one_request() -> None:
    rng = np.random.default_rng(7)
    n = np.full(10, 800)
    independent = [dispersion(rng.binomial(n, 0.01), n, 0.95) for _ in range(400)]
    # a chi-square test at 95 %: about one step in twenty reads as clustered by chance
    assert 0.01 <= np.mean([d > 1.0 for d in independent]) <= 0.10
    # forty requests caught in one stall, none elsewhere: the 8,000 are worth about
    # 8,000 / 40 independent ones (the cluster counts about as one)
    stalled = np.zeros(10)
    stalled[3] = 40
    assert 30.0 <= dispersion(stalled, n, 0.95) <= 45.0
    # nothing beyond the bound, or no requests, is no evidence of clusters
    assert dispersion(np.zeros(10), n, 0.95) == 1.0
    assert dispersion([5], [100], 0.95) == 1.0


def test_a_narrow_failure_whose_late_requests_came_in_a_cluster_does_not_decide() -> None:
    """100 of 7,800 beyond a p99 bound (78 allowed) decides when they were independent
    (no coin toss at 95 %); when they came in clusters of about 27 (one stall caught twice
    in a short step) the step is worth 289 independent requests, fewer than the 299 a p99
    needs, and a failure on it is a draw of how many stalls the step caught. A plain one
    still decides; a narrow one (89) does not, independent or not."""
    policy = parse_slo("p99<60ms,errors<0.1%")
    obs = Observation(0.0, 10.0, 780.0, 780.0, 0.0, {"p99": 64.0}, answered=7_800)

    def tail(beyond: int, d: float) -> Tail:
        return Tail(7_800, beyond, 78.0, "p99", 299, dispersion=d)

    assert tail(100, 1.0).decides(False, obs, policy, 0.95, family=60)
    assert not tail(100, 27.0).decides(False, obs, policy, 0.95, family=60)
    assert not tail(89, 1.0).decides(False, obs, policy, 0.95, family=60)
    assert tail(89, 27.0).effective == pytest.approx(7_800 / 27)
    assert tail(2_000, 27.0).decides(False, obs, policy, 0.95, family=60)
    assert tail(2_000, 27.0).plain(0.95, family=60) and not tail(89, 27.0).plain(0.95, 60)
