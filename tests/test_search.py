"""Capacity search strategies, driven in virtual time by oracles: pure functions from an
offered rate to a step verdict, standing in for a server and its health engine.

* ``MM1``: p99 = base/(1 − rate/C); score = p99/bound; Overloaded at rate ≥ C.
* ``Batching``: a batcher's queue delay makes latency fall as load rises, then the queue
  makes it rise again.
* ``Noisy``: another oracle's score times lognormal noise (fixed seed).
* ``Spike`` and ``Invalid``: another oracle with a one-off spike, or invalid verdicts,
  at given calls.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

import ridgeline.search as search
from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.health.state import HealthState
from ridgeline.search import (
    STRATEGY_KINDS,
    AdaptiveConfig,
    AdaptiveStrategy,
    BinaryConfig,
    CapacityEstimate,
    StabilityConfig,
    StepVerdict,
    Strategy,
    StrategyConfig,
    SweepConfig,
    parse_strategy,
    strategy_from_config,
    sweep_grid,
)

Oracle = Callable[[float], StepVerdict]


class System(Protocol):
    """An oracle that knows its true boundary."""

    @property
    def boundary(self) -> float: ...

    def __call__(self, rate: float) -> StepVerdict: ...


def verdict(rate: float, score: float, state: HealthState | None = None) -> StepVerdict:
    if state is None:
        state = (
            HealthState.HEALTHY
            if score < 0.8
            else HealthState.WARN
            if score < 1
            else HealthState.UNHEALTHY
        )
    return StepVerdict(rate=rate, duration_s=0.0, state=state, score=score)


@dataclass(frozen=True)
class MM1:
    capacity: float = 112.5
    base_ms: float = 20.0
    bound_ms: float = 100.0

    @property
    def boundary(self) -> float:
        return self.capacity * (1 - self.base_ms / self.bound_ms)

    def __call__(self, rate: float) -> StepVerdict:
        if rate >= self.capacity:
            return verdict(rate, 10.0, HealthState.OVERLOADED)
        return verdict(rate, self.base_ms / (1 - rate / self.capacity) / self.bound_ms)


@dataclass(frozen=True)
class Batching:
    """p99 = wait·half/(rate + half) + service/(1 − rate/C), bound 100 ms."""

    wait_ms: float = 60.0
    half: float = 20.0
    service_ms: float = 15.0
    capacity: float = 150.0

    def p99(self, rate: float) -> float:
        return self.wait_ms * self.half / (rate + self.half) + self.service_ms / (
            1 - rate / self.capacity
        )

    @property
    def boundary(self) -> float:
        lo, hi = 50.0, self.capacity  # p99 rises through 100 ms once past its minimum
        for _ in range(100):
            lo, hi = ((lo + hi) / 2, hi) if self.p99((lo + hi) / 2) < 100 else (lo, (lo + hi) / 2)
        return lo

    def __call__(self, rate: float) -> StepVerdict:
        if rate >= self.capacity:
            return verdict(rate, 10.0, HealthState.OVERLOADED)
        return verdict(rate, self.p99(rate) / 100)


@dataclass
class Noisy:
    inner: MM1
    sigma: float = 0.05
    seed: int = 7
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    @property
    def boundary(self) -> float:
        return self.inner.boundary

    def __call__(self, rate: float) -> StepVerdict:
        v = self.inner(rate)
        if v.state is HealthState.OVERLOADED:
            return v
        return verdict(rate, v.score * math.exp(self.sigma * self.rng.standard_normal()))


@dataclass
class Spike:
    """``inner``, but call ``at_call`` (0-based) fails with ``score``."""

    inner: Oracle
    at_call: int
    score: float = 1.1
    calls: int = 0

    def __call__(self, rate: float) -> StepVerdict:
        self.calls += 1
        if self.calls - 1 == self.at_call:
            return verdict(rate, self.score, HealthState.UNHEALTHY)
        return self.inner(rate)


@dataclass
class Invalid:
    """``inner``, but the calls in ``at_calls`` are invalid (and claim to be healthy)."""

    inner: Oracle
    at_calls: frozenset[int]
    calls: int = 0

    def __call__(self, rate: float) -> StepVerdict:
        self.calls += 1
        if self.calls - 1 in self.at_calls:
            return replace(verdict(rate, 0.1), valid=False)
        return self.inner(rate)


def drive(strategy: Strategy, oracle: Oracle) -> CapacityEstimate:
    """Run the ask/tell loop to its end in virtual time."""
    for _ in range(10_000):
        plan = strategy.propose()
        if plan is None:
            return strategy.result()
        v = oracle(plan.rate)
        strategy.observe(replace(v, duration_s=plan.duration_s, purpose=plan.purpose))
    raise AssertionError("the search did not end")


def steps_of(result: CapacityEstimate) -> list[tuple[float, float]]:
    return [(v.rate, v.duration_s) for v in result.trajectory]


SEARCHES: dict[str, dict[str, float]] = {
    "binary": {"min_rate": 10},
    "adaptive": {"min_rate": 10},
    "sweep": {"min_rate": 10, "max_rate": 200, "max_steps": 1000},
}


# --- configs ---------------------------------------------------------------------------


def test_config_defaults() -> None:
    cfg = BinaryConfig(min_rate=5)
    assert (cfg.start_rate, cfg.step_duration_s, cfg.precision) == (5, 10, 0.02)
    assert (cfg.max_steps, cfg.max_test_seconds, cfg.max_rate) == (60, None, None)
    stability = StabilityConfig(min_rate=5, step_duration_s=4)
    assert (stability.rate, stability.duration_s) == (5, 20)
    adaptive = AdaptiveConfig(min_rate=1, step_duration_s=8)
    assert (adaptive.explore_duration_s, adaptive.confirm_factor) == (4, 3)
    assert (adaptive.estimate_window, adaptive.cv_threshold, adaptive.max_growth) == (3, 0.01, 2)


def test_kinds_are_registered_by_name() -> None:
    assert sorted(STRATEGY_KINDS) == ["adaptive", "binary", "stability", "sweep"]
    for kind in STRATEGY_KINDS:
        strategy = parse_strategy(kind, min_rate=10, max_rate=100)
        assert strategy.name == kind
    cfg = TypeAdapter(StrategyConfig).validate_python({"kind": "adaptive", "min_rate": 5})
    assert isinstance(cfg, AdaptiveConfig)
    assert isinstance(strategy_from_config(cfg), AdaptiveStrategy)


def test_an_unknown_kind_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownKindError, match="adaptive, binary, stability, sweep") as err:
        parse_strategy("golden", min_rate=1)
    assert err.value.name == "golden"


@pytest.mark.parametrize(
    ("kind", "fields", "message"),
    [
        ("binary", {"min_rate": 5, "start_rate": 2}, "start_rate 2 is below min_rate 5; raise"),
        ("binary", {"min_rate": 5, "max_rate": 4}, "max_rate 4 is below min_rate 5; raise"),
        ("binary", {"min_rate": 5, "rat": 1}, "no field 'rat'; valid fields are: min_rate,"),
        ("binary", {}, "needs 'min_rate' \\(lowest rate to try"),
        ("binary", {"min_rate": -1}, "field 'min_rate': Input should be greater than 0"),
        ("sweep", {"min_rate": 5}, "needs max_rate \\(for a geometric grid\\) or explicit rates"),
        ("sweep", {"rates": [5, 50], "max_rate": 20}, "rates \\[50.0\\] lie outside"),
        ("stability", {"min_rate": 5, "rate": 2}, "rate 2 lies outside \\[min_rate, max_rate\\]"),
        ("adaptive", {"min_rate": 5, "explore_duration_s": 20}, "exceeds step_duration_s 10"),
    ],
)
def test_config_errors_say_what_and_how(kind: str, fields: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_strategy(kind, **fields)


def test_min_rate_defaults_to_the_rates_given() -> None:
    assert SweepConfig.model_validate({"rates": [40, 20, 30]}).min_rate == 20
    assert StabilityConfig.model_validate({"rate": 80}).min_rate == 80


def test_the_package_exports_are_pinned() -> None:
    assert sorted(search.__all__) == [
        "AdaptiveConfig", "AdaptiveState", "AdaptiveStrategy", "BinaryConfig",
        "BinaryStrategy", "CapacityEstimate", "STRATEGY_KINDS", "SearchConfig",
        "StabilityConfig", "StabilityStrategy", "StepPlan", "StepVerdict", "Strategy",
        "StrategyConfig", "SweepConfig", "SweepStrategy", "parse_strategy",
        "strategy_config", "strategy_from_config", "sweep_grid",
    ]  # fmt: skip
    assert all(hasattr(search, name) for name in search.__all__)


# --- each strategy on a fixed oracle ------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "fields", "expected"),
    [
        (
            "binary",
            {"min_rate": 10},
            [
                (10, 10),
                (20, 10),
                (40, 10),
                (80, 10),
                (160, 10),
                (120, 10),
                (100, 10),
                (90, 10),
                (85, 10),
                (87.5, 10),
                (88.75, 10),
            ],
        ),
        (
            "adaptive",
            {"min_rate": 10},
            [(10, 5), (20, 5), (40, 5), (80, 5), (90.45, 10), (89.11, 30)],
        ),
        (
            "sweep",
            {"min_rate": 80, "max_rate": 100},
            [(80, 10), (81.6, 10), (83.23, 10), (84.89, 10), (86.58, 10), (88.31, 10), (90.07, 10)],
        ),
        ("stability", {"min_rate": 10, "rate": 85}, [(85, 50)]),
    ],
)
def test_each_strategy_proposes_a_pinned_sequence(
    kind: str, fields: dict[str, float], expected: list[tuple[float, float]]
) -> None:
    assert steps_of(drive(parse_strategy(kind, **fields), MM1())) == expected


@pytest.mark.parametrize("kind", SEARCHES)
@pytest.mark.parametrize(
    "make", [MM1, Batching, lambda: Noisy(MM1())], ids=["mm1", "batching", "noisy"]
)
def test_each_estimate_is_within_5_percent(kind: str, make: Callable[[], System]) -> None:
    oracle = make()
    result = drive(parse_strategy(kind, **SEARCHES[kind]), oracle)
    assert result.converged
    assert result.capacity_rps is not None
    assert abs(result.capacity_rps / oracle.boundary - 1) <= 0.05


@pytest.mark.parametrize("precision", [0.01, 0.02, 0.1])
@pytest.mark.parametrize("make", [MM1, Batching])
def test_binary_brackets_within_precision(precision: float, make: Callable[[], System]) -> None:
    oracle = make()
    result = drive(parse_strategy("binary", min_rate=3, precision=precision), oracle)
    assert result.ci_low is not None and result.ci_high is not None
    assert (result.ci_high - result.ci_low) / result.ci_low <= precision
    assert result.ci_low < oracle.boundary <= result.ci_high
    assert result.capacity_rps == result.ci_low


def test_the_sweep_grid_is_geometric_with_spacing_precision() -> None:
    grid = sweep_grid(SweepConfig(min_rate=10, max_rate=20, precision=0.05))
    assert (grid[0], grid[-1], len(grid)) == (10, 20, 16)
    ratios = [b / a for a, b in itertools.pairwise(grid)]
    assert all(abs(r - 1.05) < 1e-3 for r in ratios[:-1])
    assert 1 < ratios[-1] <= 1.05
    explicit = SweepConfig(rates=(30, 10, 20, 10), start_rate=15)
    assert sweep_grid(explicit) == (20, 30)


def test_the_sweep_stops_after_the_first_failure() -> None:
    result = drive(parse_strategy("sweep", rates=[50, 70, 89, 91, 95]), MM1())
    assert steps_of(result) == [(50, 10), (70, 10), (89, 10), (91, 10)]
    assert (result.capacity_rps, result.ci_low, result.ci_high) == (89, 89, 91)


def test_stability_confirms_and_refutes() -> None:
    held = drive(parse_strategy("stability", rate=85), MM1())
    assert (held.capacity_rps, held.ci_low, held.ci_high) == (85, 85, None)
    assert (held.converged, held.steps, held.test_seconds) == (True, 1, 50)
    assert held.reason == "85 req/s held for 50 s (warn)"
    refuted = drive(parse_strategy("stability", rate=95, duration_s=120), MM1())
    assert (refuted.capacity_rps, refuted.ci_low, refuted.ci_high) == (None, None, 95)
    assert (refuted.converged, refuted.test_seconds) == (True, 120)
    assert refuted.reason == "no sustainable rate at or above 95 req/s"


# --- the adaptive search ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "seconds"),
    [
        (MM1, {"adaptive": 60, "binary": 110, "sweep": 1130}),
        (Batching, {"adaptive": 90, "binary": 100, "sweep": 1310}),
    ],
    ids=["mm1", "batching"],
)
def test_adaptive_spends_fewer_test_seconds_at_equal_precision(
    make: Callable[[], System], seconds: dict[str, float]
) -> None:
    results = {kind: drive(parse_strategy(kind, **SEARCHES[kind]), make()) for kind in SEARCHES}
    assert {kind: r.test_seconds for kind, r in results.items()} == seconds
    for r in results.values():
        assert r.converged and r.ci_low is not None and r.ci_high is not None
        assert (r.ci_high - r.ci_low) / r.ci_low <= 0.02
    adaptive = results["adaptive"].test_seconds
    assert adaptive / results["binary"].test_seconds <= 0.9  # 0.545 on MM1, 0.9 batching
    assert adaptive / results["sweep"].test_seconds <= 0.07  # 0.053 on MM1, 0.069 batching


def test_adaptive_converges_with_a_confirmation() -> None:
    """MM1's boundary is analytic: p99 = base/(1 − ρ) reaches the bound at
    C·(1 − base/bound) = 112.5·0.8 = 90 req/s. Noise-free, every step below 90 holds and
    every step at or above fails, so the search ends on a held confirmation at most 90,
    bracketed within the precision by a failure above 90."""
    cfg = AdaptiveConfig(min_rate=10)
    result = drive(AdaptiveStrategy(cfg), MM1())
    boundary = MM1().boundary
    assert boundary == pytest.approx(90.0)
    last = result.trajectory[-1]
    assert last.purpose == "confirm" and last.sustainable
    assert last.duration_s == cfg.confirm_factor * cfg.step_duration_s  # 3 × 10 s
    c, lo, hi = result.capacity_rps, result.ci_low, result.ci_high
    assert c is not None and lo is not None and hi is not None
    assert c == lo == last.rate < boundary <= hi
    assert (hi - lo) / lo <= cfg.precision
    assert boundary * (1 - cfg.precision) <= c  # within the precision of the truth
    assert result.converged and result.reason == (
        f"confirmed {c:g} req/s over {last.duration_s:g} s; "
        f"the boundary lies in [{c:g}, {hi:g}] req/s"
    )


def test_the_gain_halves_each_time_the_direction_reverses() -> None:
    """The rule, applied to the rates the search proposed: the gain starts at 1 and
    halves whenever a step goes the other way from the last move (a repeated rate is no
    move). Batching's boundary (p99 falls with load, then rises through its bound) makes
    the search overshoot and come back, so the rule is exercised; and the laws of a
    bracketing search hold on the way: every rate within bounds, each step after the
    first failure inside the bracket proved so far, the bracket never wider, the end
    within the precision below the true boundary."""
    cfg = AdaptiveConfig(min_rate=10)
    strategy, oracle = AdaptiveStrategy(cfg), Batching()
    rates: list[float] = []
    gains: list[float] = []
    widths: list[float] = []
    while (plan := strategy.propose()) is not None:
        lo, hi = bracket_of(strategy.result().trajectory)
        if lo is not None and hi is not None:
            assert lo < plan.rate < hi or (plan.purpose == "confirm" and plan.rate <= lo)
            widths.append(hi / lo)
        assert plan.rate >= cfg.min_rate
        rates.append(plan.rate)
        strategy.observe(replace(oracle(plan.rate), duration_s=plan.duration_s))
        gains.append(strategy.state.gain)

    expected, gain, direction = [], 1.0, 0
    for prev, rate in zip([rates[0], *rates], rates, strict=False):
        move = (rate > prev) - (rate < prev)
        if move and direction and move != direction:
            gain /= 2
        direction = move or direction
        expected.append(gain)
    assert gains == expected
    assert min(gains) <= 0.25  # reversed at least twice
    assert widths == sorted(widths, reverse=True)
    result = strategy.result()
    assert result.capacity_rps is not None and result.converged
    assert oracle.boundary * (1 - cfg.precision) <= result.capacity_rps < oracle.boundary


def bracket_of(
    trajectory: tuple[StepVerdict, ...] | list[StepVerdict],
) -> tuple[float | None, float | None]:
    """(highest held rate below the lowest failure, that failure) of a noise-free run."""
    failed = [v.rate for v in trajectory if not v.sustainable]
    hi = min(failed, default=None)
    held = [v.rate for v in trajectory if v.sustainable and (hi is None or v.rate < hi)]
    return max(held, default=None), hi


def test_a_failed_confirmation_backs_off_and_confirms_again() -> None:
    """A confirmation (30 s) failing just past the boundary where a shorter step held is
    better evidence than that step, not a spike: the next step confirms lower, where the
    line in 1/score through the long run and the throughput ceiling crosses 1
    (ceiling − score·(ceiling − rate): 2.2 % lower for a score of 1.1 here)."""
    clean = drive(parse_strategy("adaptive", min_rate=10), Batching())
    k = next(i for i, v in enumerate(clean.trajectory) if v.purpose == "confirm")
    assert clean.trajectory[k].rate == 125.1 < clean.trajectory[k - 1].rate == 125.4
    spiky = drive(parse_strategy("adaptive", min_rate=10), Spike(Batching(), at_call=k))
    assert spiky.trajectory[k].score == 1.1 and not spiky.trajectory[k].sustainable
    assert steps_of(spiky) == [*steps_of(clean)[:k], (125.1, 30), (122.3, 30)]
    assert spiky.converged and spiky.capacity_rps == 122.3


def test_a_clear_failure_moves_the_bracket_at_once() -> None:
    clean = drive(parse_strategy("adaptive", min_rate=10), Batching())
    k = next(i for i, v in enumerate(clean.trajectory) if v.purpose == "confirm")
    hit = drive(parse_strategy("adaptive", min_rate=10), Spike(Batching(), k, score=1.5))
    assert hit.trajectory[k + 1].rate < 125.1  # not re-tested: the bracket moved down
    assert hit.capacity_rps is not None and hit.capacity_rps < 125.1
    assert abs(hit.capacity_rps / Batching().boundary - 1) <= 0.05


def test_a_back_off_that_holds_far_below_the_failure_narrows_the_bracket_above_it() -> None:
    """A clear confirmation failure (score 3) backs off 15 %; that confirmation holds,
    but [it, the failure] is far wider than the precision: the search narrows the
    bracket above it and confirms again within the precision of the boundary, rather
    than converging 15 % low."""
    clean = drive(parse_strategy("adaptive", min_rate=10), Batching())
    k = next(i for i, v in enumerate(clean.trajectory) if v.purpose == "confirm")
    hit = drive(parse_strategy("adaptive", min_rate=10), Spike(Batching(), k, score=3.0))
    backed = hit.trajectory[k + 1]
    assert backed.purpose == "confirm" and backed.sustainable
    assert backed.rate == pytest.approx(125.1 * 0.85, rel=0.01)
    held = [v for v in hit.trajectory[k + 2 :] if v.purpose == "confirm" and v.sustainable]
    assert held and hit.converged and hit.capacity_rps == held[-1].rate
    boundary = Batching().boundary
    assert boundary * (1 - 2 * AdaptiveConfig(min_rate=10).precision) <= hit.capacity_rps
    assert hit.capacity_rps <= boundary


@pytest.mark.parametrize("quarters", [(0.4, 0.4, 6.0, 0.4), (3.0, 4.0, 6.0, 5.0)])
def test_a_failure_carried_by_one_quarter_is_re_tested_once(
    quarters: tuple[float, ...],
) -> None:
    """A host stall during one slice of a step far below the boundary fails the step
    (score 4) while its other quarters held: the step is run again and the search ends
    where it would have. A failure in every quarter is the rate's: it moves the bracket."""
    clean = drive(parse_strategy("adaptive", min_rate=10), MM1())
    k = 2  # the third step, well inside the boundary
    assert clean.trajectory[k].score < 0.5

    @dataclass
    class Stall:
        calls: int = 0

        def __call__(self, rate: float) -> StepVerdict:
            self.calls += 1
            if self.calls - 1 == k:
                return replace(verdict(rate, 4.0), quarters=quarters)
            return MM1()(rate)

    stalled = drive(parse_strategy("adaptive", min_rate=10), Stall())
    if max(sorted(quarters)[:3]) <= 1:
        assert steps_of(stalled) == steps_of(clean)[: k + 1] + steps_of(clean)[k:]  # re-run
        assert stalled.capacity_rps == clean.capacity_rps
    else:
        assert stalled.capacity_rps is not None and stalled.capacity_rps < 0.8 * MM1().boundary


# --- shared rules -----------------------------------------------------------------------

ALL = {**SEARCHES, "stability": {"rate": 85}}


@pytest.mark.parametrize("kind", ALL)
def test_an_invalid_verdict_is_rerun_and_never_the_estimate(kind: str) -> None:
    clean = drive(parse_strategy(kind, **ALL[kind]), MM1())
    k = clean.steps - 1  # the last step: invalid, it claims to be healthy
    redone = drive(parse_strategy(kind, **ALL[kind]), Invalid(MM1(), frozenset({k})))
    assert not redone.trajectory[k].valid
    assert steps_of(redone) == [*steps_of(clean)[: k + 1], *steps_of(clean)[k:]]
    assert redone.trajectory[k + 1 :] == clean.trajectory[k:]
    assert (redone.capacity_rps, redone.converged) == (clean.capacity_rps, True)
    assert redone.test_seconds == clean.test_seconds + clean.trajectory[k].duration_s


@pytest.mark.parametrize("kind", SEARCHES)
def test_a_generator_that_cannot_hold_a_step_twice_ends_the_search(kind: str) -> None:
    result = drive(parse_strategy(kind, **SEARCHES[kind]), Invalid(MM1(), frozenset({2, 3})))
    assert result.reason == (
        f"the load generator could not hold {result.trajectory[2].rate:g} req/s (two tries); "
        "add generator processes or lower the rate"
    )
    assert (result.converged, result.steps) == (False, 4)
    assert result.capacity_rps == result.trajectory[1].rate  # the best valid one so far


@pytest.mark.parametrize(
    ("kind", "fields", "lowest"),
    [
        ("binary", {"min_rate": 100}, 100),
        ("binary", {"min_rate": 95, "start_rate": 400}, 95),
        ("adaptive", {"min_rate": 100}, 100),
        ("adaptive", {"min_rate": 95, "start_rate": 400}, 95),
        ("sweep", {"min_rate": 100, "max_rate": 200}, 100),
        ("stability", {"rate": 100}, 100),
    ],
)
def test_no_sustainable_rate_is_an_answer(
    kind: str, fields: dict[str, float], lowest: float
) -> None:
    result = drive(parse_strategy(kind, **fields), MM1())
    assert result.reason == f"no sustainable rate at or above {lowest:g} req/s"
    assert (result.capacity_rps, result.ci_low, result.converged) == (None, None, True)
    assert min(v.rate for v in result.trajectory) == lowest


@pytest.mark.parametrize(("kind", "best"), [("binary", 40), ("adaptive", 40), ("sweep", 10.4)])
def test_the_step_budget_stops_a_search_with_its_best_estimate(kind: str, best: float) -> None:
    result = drive(parse_strategy(kind, **{**SEARCHES[kind], "max_steps": 3}), MM1())
    assert (result.steps, result.converged, result.capacity_rps) == (3, False, best)
    assert "max_steps=3" in result.reason and "raise max_steps" in result.reason


def test_the_time_budget_stops_a_search_before_it_overruns() -> None:
    result = drive(parse_strategy("adaptive", min_rate=10, max_test_seconds=25), MM1())
    assert steps_of(result) == [(10, 5), (20, 5), (40, 5), (80, 5)]  # the next needs 10 s
    assert (result.test_seconds, result.converged, result.capacity_rps) == (20, False, 80)
    assert (result.ci_low, result.ci_high) == (80, 90)  # the bracket, then the estimates
    assert "max_test_seconds=25" in result.reason


@pytest.mark.parametrize(("kind", "high"), [("binary", None), ("adaptive", 90)])
def test_a_ceiling_that_holds_ends_the_search_there(kind: str, high: float | None) -> None:
    result = drive(parse_strategy(kind, min_rate=10, max_rate=50), MM1())
    # adaptive's upper end, without a failure, is its model's estimate of the boundary
    assert (result.capacity_rps, result.ci_high, result.converged) == (50, high, True)
    assert "raise max_rate" in result.reason
    assert max(v.rate for v in result.trajectory) == 50


@pytest.mark.parametrize("kind", ALL)
def test_propose_asks_the_same_step_until_told_and_starts_empty(kind: str) -> None:
    strategy = parse_strategy(kind, **ALL[kind])
    empty = strategy.result()
    assert (empty.steps, empty.capacity_rps, empty.converged, empty.reason) == (0, None, False, "")
    assert strategy.propose() == strategy.propose()


# --- the law: the interval holds the boundary ---------------------------------------------


def monotone(family: str, boundary: float, shape: float) -> Oracle:
    """A random monotone system: sustainable exactly below ``boundary``."""

    def oracle(rate: float) -> StepVerdict:
        if family == "mm1":  # capacity 1.05..5 × the boundary
            capacity = boundary * (1.05 + 4 * shape)
            if rate >= capacity:
                return verdict(rate, 10.0, HealthState.OVERLOADED)
            score = (1 - boundary / capacity) / (1 - rate / capacity)
        elif family == "power":  # exponent 0.3..6
            score = (rate / boundary) ** (0.3 + 5.7 * shape)
        else:  # a step: no gradient at all
            score = 0.5 if rate < boundary else 1.0 + 3 * shape
        if rate < boundary:
            return verdict(rate, min(score, 0.999))
        return verdict(rate, max(score, 1.0), HealthState.UNHEALTHY)

    return oracle


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(sorted(STRATEGY_KINDS)),
    family=st.sampled_from(["mm1", "power", "step"]),
    boundary=st.floats(2, 5000),
    shape=st.floats(0, 1),
    below=st.floats(0.05, 4),
    above=st.floats(0.05, 2.5),
    start=st.floats(0, 1),
)
def test_every_interval_contains_the_true_boundary(
    kind: str, family: str, boundary: float, shape: float, below: float, above: float, start: float
) -> None:
    lowest, highest = boundary * math.exp(-below), boundary * math.exp(above)
    fields = {"min_rate": lowest, "max_rate": highest, "max_steps": 1000}
    if kind != "sweep":
        fields["start_rate"] = min(highest, lowest * (highest / lowest) ** start)
    result = drive(parse_strategy(kind, **fields), monotone(family, boundary, shape))
    p = 0.02
    assert result.converged
    assert result.ci_low is None or result.ci_low * (1 - p) <= boundary
    assert result.ci_high is None or boundary <= result.ci_high * (1 + p)
    if kind != "stability":
        assert result.capacity_rps is not None
        assert abs(result.capacity_rps / boundary - 1) <= 0.05
