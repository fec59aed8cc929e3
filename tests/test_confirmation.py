"""Judging confirmations (``search.confirmation``), pure and exact, and its use by the
adaptive search and by the probe after any strategy."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from ridgeline.health.state import HealthState
from ridgeline.probe.drivers import SimDriver
from ridgeline.probe.orchestrator import ProbeConfig, probe
from ridgeline.search import parse_strategy
from ridgeline.search.base import StepVerdict
from ridgeline.search.confirmation import (
    MAX_BACKOFF,
    MAX_CALIBRATED_BACKOFF,
    Decision,
    below_failed,
    calibrated_backoff,
    decide,
    deciding,
    marginal,
    secant_boundary,
    unsure,
)
from ridgeline.sim import load_sim_preset


def run(score: float, *, se: float = 0.0, rate: float = 100.0, **kw: object) -> StepVerdict:
    state = HealthState.HEALTHY if score < 1 else HealthState.UNHEALTHY
    fields: dict[str, object] = {"purpose": "confirm", "score_se": se, **kw}
    return StepVerdict(rate=rate, duration_s=120.0, state=state, score=score, **fields)  # type: ignore[arg-type]


def test_a_clear_run_decides_alone() -> None:
    assert decide([run(0.8, se=0.02)]) is Decision.HELD
    assert decide([run(1.3, se=0.02)]) is Decision.FAILED


def test_the_band_is_four_quarter_standard_errors_or_the_margin() -> None:
    # |ln 1.1| = 0.0953: inside 4·0.025 = 0.1, outside 4·0.02 = 0.08
    assert marginal(run(1.1, se=0.025), 0.0) and not marginal(run(1.1, se=0.02), 0.0)
    assert marginal(run(1.1), 0.12) and not marginal(run(1.1), 0.08)
    assert not marginal(run(1.0001, valid=False), 0.5)  # an invalid run failed, full stop
    assert not marginal(run(math.inf, se=1.0), 0.5)


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([1.05], Decision.AGAIN),
        ([1.05, 1.08], Decision.FAILED),
        ([1.05, 0.95], Decision.AGAIN),
        ([1.05, 0.95, 0.97], Decision.HELD),
        ([1.02, 0.97, 1.4], Decision.FAILED),
        ([0.97], Decision.HELD),
    ],
)
def test_a_narrow_failure_goes_to_the_majority_of_three(
    scores: list[float], expected: Decision
) -> None:
    assert decide([run(s, se=0.05) for s in scores]) is expected


def counted(score: float, samples: int, beyond: int, **kw: object) -> StepVerdict:
    """A p99 run of ``samples`` requests, ``beyond`` of them past the bound."""
    return run(score, se=0.05, judged="p99", samples=samples, beyond=beyond,
               allowed=samples * 0.01, **kw)  # fmt: skip


def test_three_runs_that_disagree_are_judged_on_their_requests_together() -> None:
    """The issue's case: a long run past the bound (1,110 beyond where its 100,000
    requests allow 1,000: 11 % past it), two short ones that caught no stall (150 of
    20,000 each). The majority would hold; the requests, added up, are 1,410 beyond
    where 1,400 are allowed: failed."""
    runs = [counted(1.11, 100_000, 1_110), counted(0.9, 20_000, 150),
            counted(0.9, 20_000, 150)]  # fmt: skip
    assert decide(runs) is Decision.FAILED
    # the other way: two short runs' narrow failures do not outweigh a long pass
    # (130 + 120 + 900 = 1,150 beyond, 1,200 allowed)
    runs = [counted(1.3, 10_000, 130), counted(1.2, 10_000, 120),
            counted(0.9, 100_000, 900)]  # fmt: skip
    assert decide(runs) is Decision.HELD


def test_a_run_failed_by_more_than_its_tail_leaves_the_vote_to_the_majority() -> None:
    """A run that failed on its errors (its tail within what the percentile allows)
    says nothing its tail count could weigh: the majority decides, as before."""
    runs = [counted(1.2, 10_000, 50), counted(0.9, 10_000, 80), counted(0.9, 10_000, 80)]
    assert decide(runs) is Decision.HELD


def test_once_contested_a_narrow_pass_goes_to_the_majority_too() -> None:
    assert decide([run(0.95, se=0.05)]) is Decision.HELD
    assert decide([run(0.95, se=0.05)], contested=True) is Decision.AGAIN
    assert decide([run(0.95, se=0.05), run(1.1)], contested=True) is Decision.AGAIN
    assert decide([run(0.5, se=0.05)], contested=True) is Decision.HELD  # clear


def test_the_deciding_run_is_the_one_nearest_the_boundary() -> None:
    runs = [run(1.05, se=0.05), run(2.4, se=0.05)]
    assert deciding(runs, Decision.FAILED).score == 1.05
    runs = [run(0.98, se=0.05), run(1.2), run(0.7)]
    assert deciding(runs, Decision.HELD).score == 0.98


def test_calibrated_backoff_puts_the_boundary_on_the_line_to_the_ceiling() -> None:
    # ceiling 120, a long run at 100 scoring 1.25: 120 − 1.25·20 = 95, 5 % lower
    assert calibrated_backoff(100.0, 1.25, 120.0, 0.02) == pytest.approx(0.05)
    assert calibrated_backoff(100.0, 1.01, 120.0, 0.02) == 0.02  # the precision at least
    assert calibrated_backoff(100.0, 9.0, 120.0, 0.02) == MAX_CALIBRATED_BACKOFF


def overloaded(rate: float, achieved: float) -> StepVerdict:
    return StepVerdict(
        rate=rate, duration_s=10.0, state=HealthState.OVERLOADED, score=9.0, achieved_rps=achieved
    )


def test_below_failed_caps_near_failures_and_lets_clear_ones_go_further() -> None:
    search: Sequence[StepVerdict] = [overloaded(200.0, 120.0)]
    # near: calibrated says 5 %, capped at 4 %
    assert below_failed(run(1.25), search, 0.02) == pytest.approx(100 * (1 - MAX_BACKOFF))
    # clear (≥ 2): 120 − 2.5·20 = 70, capped at 15 %
    assert below_failed(run(2.5), search, 0.02) == pytest.approx(85.0)
    # no ceiling measured: (score − 1)/2 between the precision and 4 %
    assert below_failed(run(1.06), [], 0.02) == pytest.approx(97.0)


def test_a_pass_a_boundary_server_could_give_by_luck_is_run_again() -> None:
    """The held-out case: 206 beyond in 22,665 (0.91 %) under a p99 bound, clustered
    six together: worth 34 beyond in 3,778, where a server at the boundary gives 34 or
    fewer about a third of the time. Run again, though it held and nothing contested it;
    the same share on ten times the requests, unclustered, stands alone."""
    lucky = counted(0.95, 22_665, 206, dispersion=6.0)
    assert unsure(lucky) and decide([lucky]) is Decision.AGAIN
    sure = counted(0.95, 226_650, 2_060)
    assert not unsure(sure) and decide([sure]) is Decision.HELD
    assert not unsure(counted(1.2, 22_665, 300))  # a failure is never an unsure pass
    assert decide([lucky, sure]) is Decision.HELD  # the majority, as for a narrow failure


def failed_confirmation(rate: float, score: float) -> StepVerdict:
    return run(score, rate=rate)


def test_a_secant_through_failed_confirmations_reaches_a_boundary_far_below() -> None:
    """Long runs failing by a like margin over a wide span of rates (a stall every
    minute): the line through the lowest three, (1000, 1.6), (950, 1.55), (900, 1.5),
    reaches 1 at 400; the back-off goes there, at most halving the rate."""
    search = [
        failed_confirmation(r, s) for r, s in [(2000, 13.0), (1000, 1.6), (950, 1.55), (900, 1.5)]
    ]
    assert secant_boundary(search[-1], search) == pytest.approx(400.0)
    assert below_failed(search[-1], search, 0.02) == pytest.approx(450.0)  # halved
    # two failures, or three over less than 8 % of the rate: noise would set the slope
    assert secant_boundary(search[2], search[1:3]) is None
    close = [failed_confirmation(r, s) for r, s in [(1000, 1.6), (980, 1.55), (960, 1.5)]]
    assert secant_boundary(close[-1], close) is None
    flat = [failed_confirmation(r, 1.5) for r in (1000, 950, 900)]
    assert secant_boundary(flat[-1], flat) is None  # no slope: the 4 % back-off


def test_a_secant_over_a_convex_score_does_not_overshoot_the_boundary() -> None:
    """Over the M/M/1-like score (boundary 90 req/s), failed confirmations at 100, 96
    and 92: the secant lands at 91.2, above 90, and the back-off is the ordinary one
    (it only ever goes further down than that); from 110, 105 and 100 likewise."""
    search = [mm1(r) for r in (100.0, 96.0, 92.0)]
    assert secant_boundary(search[-1], search) == pytest.approx(91.2, abs=0.05)
    assert below_failed(search[-1], search, 0.02) == pytest.approx(92 * (1 - MAX_BACKOFF))
    search = [mm1(r) for r in (110.0, 105.0, 100.0)]
    assert below_failed(search[-1], search, 0.02) == pytest.approx(100 * (1 - MAX_BACKOFF))


def test_a_back_off_stays_between_a_held_confirmation_and_the_failure() -> None:
    """Held 7,704 over a long run, failed clearly at 8,986: a 15 % back-off (7,638)
    would end the search at 7,704; the geometric middle (8,320) is tried instead. Once
    the two are within the precision twice over, the back-off may fall to the held."""
    held = run(0.06, rate=7704.0)
    clear = run(math.inf, rate=8986.0)
    assert below_failed(clear, [held, clear], 0.02) == pytest.approx(math.sqrt(7704 * 8986))
    near = run(math.inf, rate=7704.0 * 1.03)
    assert below_failed(near, [held, near], 0.02) == pytest.approx(7704.0 * 1.03 * 0.85)


def mm1(rate: float) -> StepVerdict:
    """p99 = 20 ms/(1 − rate/112.5), bound 100 ms: the boundary is at 90 req/s."""
    if rate >= 112.5:
        return StepVerdict(rate, 10.0, HealthState.OVERLOADED, 10.0, achieved_rps=112.5)
    return run(0.2 / (1 - rate / 112.5), rate=rate)


def drive_adaptive(confirm_scores: list[float]) -> tuple[float | None, list[StepVerdict]]:
    """Adaptive search on ``mm1``, its confirmation runs scoring from a script instead
    (each with a quarter SE of 0.05: a band of ±0.2 in ln score)."""
    strategy = parse_strategy("adaptive", min_rate=10)
    scripted = iter(confirm_scores)
    for _ in range(1000):
        plan = strategy.propose()
        if plan is None:
            break
        v = mm1(plan.rate)
        if plan.purpose == "confirm":
            v = run(next(scripted), se=0.05, rate=plan.rate)
        strategy.observe(replace(v, duration_s=plan.duration_s, purpose=plan.purpose))
    result = strategy.result()
    return result.capacity_rps, list(result.trajectory)


def test_adaptive_reruns_a_marginal_confirmation_and_takes_the_majority() -> None:
    clean, clean_steps = drive_adaptive([0.9, 0.9, 0.9])
    first = next(v for v in clean_steps if v.purpose == "confirm")
    # narrow fail, pass, pass: held at the same rate after three runs
    held, steps = drive_adaptive([1.1, 0.95, 0.9])
    confirms = [v for v in steps if v.purpose == "confirm"]
    assert [v.rate for v in confirms] == [first.rate] * 3
    assert held == first.rate == clean
    # two marginal failures: failed, and the next confirmation is lower
    lower, steps = drive_adaptive([1.1, 1.15, 0.9, 0.9, 0.9])
    confirms = [v for v in steps if v.purpose == "confirm"]
    assert [v.rate for v in confirms[:2]] == [first.rate] * 2
    assert lower is not None and lower < first.rate and confirms[2].rate == lower


def test_a_clear_confirmation_decides_in_one_run() -> None:
    _, steps = drive_adaptive([0.5])  # |ln 0.5| = 0.69, far outside ±0.2
    assert sum(v.purpose == "confirm" for v in steps) == 1


def pooled(t: dict[str, object], after: dict[str, object] | None) -> bool:
    """Whether ``after`` pooled more of the same run with undecided ``t``."""
    return after is not None and not t["decided"] and float(after["pooled_s"]) > 0.0  # type: ignore[arg-type]


def test_the_probe_confirms_any_strategy_by_the_same_rule() -> None:
    """Binary search on the noisy nlp class, then the probe's confirmation: a narrow
    failure is run again and the majority of at most three decides; a pass or a clear
    failure decides alone. Checked on every confirmation rate the probe tried."""
    cfg = ProbeConfig(
        slo="p99<300ms,errors<0.1%",
        strategy="binary",
        warmup=False,
        confirm_requests=3000,
        strategy_options={"min_rate": 20.0, "max_rate": 160.0, "precision": 0.05},
    )
    result = asyncio.run(probe(SimDriver(load_sim_preset("nlp")), cfg))
    confirms = [t for t in result.trajectory if t["purpose"] == "confirm"]
    runs = [
        StepVerdict(
            rate=t["rate"],
            duration_s=t["duration_s"],
            state=HealthState(t["state"]),
            score=t["score"],
            valid=t["valid"],
            score_se=t["score_se"],
            purpose="confirm",
        )
        for t in confirms
    ]
    # an undecided run the next one pooled with (same rate, longer) is not a run of its own
    kept = [
        t for t, after in zip(confirms, [*confirms[1:], None], strict=True) if not pooled(t, after)
    ]
    runs = [r for r, t in zip(runs, confirms, strict=True) if t in kept]
    groups = [list(g) for _, g in itertools.groupby(runs, key=lambda v: v.rate)]
    assert groups, "the probe confirms binary search's estimate"
    for i, g in enumerate(groups):
        contested = i > 0  # a confirmation failed before this one
        assert decide(g, contested=contested) is not Decision.AGAIN  # ran until decided
        assert all(
            decide(g[:k], contested=contested) is Decision.AGAIN for k in range(1, len(g))
        )  # and no further
    last = decide(groups[-1], contested=len(groups) > 1)
    assert result.confirmed is (last is Decision.HELD)
    if result.confirmed:
        assert result.capacity_rps == groups[-1][0].rate
    assert len(groups) <= 1 + cfg.confirm_retries
