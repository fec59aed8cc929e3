"""Arrival processes: statistics of the seeded schedules, exact deterministic layouts,
and the command-line / YAML spec parsers."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.workload import (
    ArrivalProcess,
    ConstantArrivals,
    DiurnalArrivals,
    GammaArrivals,
    PoissonArrivals,
    RampArrivals,
    StepArrivals,
    arrival_from_dict,
    parse_arrival,
)

KINDS = ["constant", "diurnal", "gamma", "poisson", "ramp", "steps"]


def gap_cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def counts(times: np.ndarray, edges: list[float]) -> np.ndarray:
    return np.histogram(times, bins=edges)[0]


def assert_poisson_counts(observed: np.ndarray, expected: list[float]) -> None:
    """Each count within 5 standard deviations (sqrt of its mean) of its mean."""
    for got, mean in zip(observed, expected, strict=True):
        assert abs(got - mean) <= 5 * math.sqrt(mean) + 1e-9, (observed, expected)


# --- stationary processes -------------------------------------------------------------


def test_poisson_gaps_have_cv_one() -> None:
    times = PoissonArrivals(rate=100).schedule(100.0, seed=3)
    assert len(times) >= 9_500
    assert gap_cv(times) == pytest.approx(1.0, rel=0.05)


# The sample CV of gamma gaps is noisy when the shape is small (heavy tail): with cv = 4
# its spread over 10,000 gaps is about 3 %, so ±5 % would fail for 1 seed in 12. The gap
# counts below put ±5 % beyond 7 standard deviations of the estimator.
@pytest.mark.parametrize(("cv", "gaps"), [(0.5, 10_000), (2.0, 50_000), (4.0, 200_000)])
def test_gamma_gaps_have_the_requested_cv(cv: float, gaps: int) -> None:
    rate = 1000.0
    times = GammaArrivals(rate=rate, cv=cv).schedule(gaps / rate, seed=11)
    shape = 1 / cv**2
    assert gap_cv(times) == pytest.approx(1 / math.sqrt(shape), rel=0.05)


@pytest.mark.parametrize(
    "spec",
    [PoissonArrivals(rate=1000), GammaArrivals(rate=1000, cv=0.5), GammaArrivals(rate=1000, cv=4)],
)
def test_mean_rate_matches_the_realised_rate(spec: PoissonArrivals | GammaArrivals) -> None:
    times = spec.schedule(100.0, seed=5)
    assert len(times) / 100.0 == pytest.approx(spec.mean_rate(100.0), rel=0.05)


def test_constant_is_exactly_evenly_spaced_from_zero() -> None:
    assert ConstantArrivals(rate=4).schedule(2.0).tolist() == [
        0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75,
    ]  # fmt: skip
    assert ConstantArrivals(rate=3).schedule(1.0).tolist() == [0.0, 1 / 3, 2 / 3]


@given(rate=st.floats(0.01, 1000), duration=st.floats(0.01, 100))
def test_constant_fills_the_run_with_equal_gaps(rate: float, duration: float) -> None:
    times = ConstantArrivals(rate=rate).schedule(duration)
    assert times[0] == 0.0
    assert times[-1] < duration <= times[-1] + 1 / rate * (1 + 1e-9)
    np.testing.assert_allclose(np.diff(times), 1 / rate, rtol=1e-9)


@pytest.mark.parametrize(
    "spec",
    [
        ConstantArrivals(rate=50),
        PoissonArrivals(rate=50),
        GammaArrivals(rate=50, cv=3),
        RampArrivals(start_rate=10, end_rate=90),
        StepArrivals(rates=(10, 90), step_s=3),
        DiurnalArrivals(rate=50, amplitude=0.8, period_s=4),
    ],
    ids=lambda spec: spec.kind,
)
def test_seed_fixes_the_schedule(spec: Any) -> None:
    first = spec.schedule(10.0, seed=42)
    again = spec.schedule(10.0, seed=42)
    other = spec.schedule(10.0, seed=43)
    assert first.dtype == np.float64
    assert np.array_equal(first, again)
    if spec.kind != "constant":
        assert not np.array_equal(first, other)


@settings(max_examples=30)
@given(
    kind=st.sampled_from(["poisson", "gamma"]),
    short=st.floats(0.1, 50),
    extra=st.floats(0.0, 50),
    seed=st.integers(0, 2**32),
)
def test_a_longer_schedule_extends_a_shorter_one(
    kind: str, short: float, extra: float, seed: int
) -> None:
    spec = PoissonArrivals(rate=40) if kind == "poisson" else GammaArrivals(rate=40, cv=2)
    head = spec.schedule(short, seed)
    whole = spec.schedule(short + extra, seed)
    assert np.array_equal(whole[: len(head)], head)
    assert len(whole) == len(head) or whole[len(head)] >= short


def test_a_million_arrivals_take_well_under_a_second() -> None:
    started = time.perf_counter()
    times = PoissonArrivals(rate=10_000).schedule(100.0, seed=1)
    assert time.perf_counter() - started < 1.0
    assert len(times) == pytest.approx(1_000_000, rel=0.01)


@pytest.mark.parametrize(("duration", "seed"), [(0.0, 0), (-1.0, 0), (math.nan, 0), (1.0, -1)])
def test_bad_duration_or_seed_is_a_config_error(duration: float, seed: int) -> None:
    with pytest.raises(ConfigError, match=r"duration_s|seed"):
        PoissonArrivals(rate=5).schedule(duration, seed)


# --- time-varying processes -----------------------------------------------------------


def test_steps_counts_follow_each_step_and_hold_the_last() -> None:
    spec = StepArrivals(rates=(100, 400, 0, 200), step_s=10)
    times = spec.schedule(60.0, seed=9)
    observed = counts(times, [0, 10, 20, 30, 40, 60])
    assert observed[2] == 0
    assert_poisson_counts(observed, [1000, 4000, 0, 2000, 4000])
    assert spec.mean_rate(60.0) == pytest.approx(11_000 / 60)


@pytest.mark.parametrize(("start", "end"), [(0.0, 200.0), (200.0, 0.0)])
def test_ramp_counts_follow_the_linear_rate(start: float, end: float) -> None:
    # Rising: rate(t) = 2t, so Λ(t) = t² and [10k, 10k + 10) expects 100·(2k + 1).
    times = RampArrivals(start_rate=start, end_rate=end).schedule(100.0, seed=4)
    expected = [100.0 * (2 * k + 1) for k in range(10)]
    if start > end:
        expected.reverse()
    assert_poisson_counts(counts(times, list(range(0, 101, 10))), expected)


@pytest.mark.parametrize(("phase", "signs"), [(0.0, [1, 1, -1, -1]), (10.0, [1, -1, -1, 1])])
def test_diurnal_counts_follow_the_sine(phase: float, signs: list[int]) -> None:
    # rate 100 ± 50 with period 40: each quarter expects 1000 ± 100·0.5·40/(2π) = 1000 ± 1000/π.
    spec = DiurnalArrivals(rate=100, amplitude=0.5, period_s=40, phase_s=phase)
    times = spec.schedule(80.0, seed=8)
    expected = [1000 + sign * 1000 / math.pi for sign in signs * 2]
    assert_poisson_counts(counts(times, list(range(0, 81, 10))), expected)
    assert spec.mean_rate(80.0) == pytest.approx(100.0)


def test_evenly_spaced_steps_are_exact_and_ignore_the_seed() -> None:
    spec = StepArrivals(rates=(2, 4), step_s=1, poisson=False)
    assert spec.schedule(2.0, seed=1).tolist() == [0.0, 0.5, 1.0, 1.25, 1.5, 1.75]
    assert np.array_equal(spec.schedule(2.0, seed=1), spec.schedule(2.0, seed=2))


def test_evenly_spaced_flat_ramp_is_the_constant_schedule() -> None:
    ramp = RampArrivals(start_rate=7, end_rate=7, poisson=False).schedule(10.0)
    np.testing.assert_allclose(ramp, ConstantArrivals(rate=7).schedule(10.0), rtol=1e-12)


def test_a_flat_poisson_ramp_rescales_the_same_draws_as_poisson() -> None:
    ramp = RampArrivals(start_rate=30, end_rate=30).schedule(20.0, seed=6)
    np.testing.assert_allclose(ramp, PoissonArrivals(rate=30).schedule(20.0, seed=6), rtol=1e-12)


def test_evenly_spaced_diurnal_puts_arrival_i_where_the_integral_reaches_i() -> None:
    rate, amplitude, period, phase = 50.0, 0.9, 7.0, 1.5
    spec = DiurnalArrivals(
        rate=rate, amplitude=amplitude, period_s=period, phase_s=phase, poisson=False
    )
    times = spec.schedule(30.0, seed=0)
    omega = 2 * math.pi / period
    integral = rate * (
        times + amplitude / omega * (math.cos(omega * phase) - np.cos(omega * (times + phase)))
    )
    np.testing.assert_allclose(integral, np.arange(len(times)), atol=1e-9)
    assert len(times) == math.ceil(spec.mean_rate(30.0) * 30.0)


any_spec = st.one_of(
    st.builds(ConstantArrivals, rate=st.floats(0.1, 200)),
    st.builds(PoissonArrivals, rate=st.floats(0.1, 200)),
    st.builds(GammaArrivals, rate=st.floats(0.1, 200), cv=st.floats(0.2, 5)),
    st.builds(
        RampArrivals,
        start_rate=st.floats(0.1, 200),
        end_rate=st.floats(0, 200),
        poisson=st.booleans(),
    ),
    st.builds(
        StepArrivals,
        rates=st.lists(st.floats(0.1, 200), min_size=1, max_size=5).map(tuple),
        step_s=st.floats(0.1, 20),
        poisson=st.booleans(),
    ),
    st.builds(
        DiurnalArrivals,
        rate=st.floats(0.1, 200),
        amplitude=st.floats(0, 0.99),
        period_s=st.floats(0.5, 50),
        phase_s=st.floats(-50, 50),
        poisson=st.booleans(),
    ),
)


@settings(max_examples=60)
@given(spec=any_spec, duration=st.floats(0.1, 50), seed=st.integers(0, 2**32))
def test_every_schedule_is_sorted_float64_within_the_run(
    spec: ArrivalProcess, duration: float, seed: int
) -> None:
    times = spec.schedule(duration, seed)
    assert times.dtype == np.float64 and times.ndim == 1
    assert bool(np.all(np.diff(times) >= 0))
    assert len(times) == 0 or (times[0] >= 0 and times[-1] < duration)


# --- parsing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate", "expected"),
    [
        ("constant", 20, ConstantArrivals(rate=20)),
        ("poisson", 20, PoissonArrivals(rate=20)),
        ("poisson:rate=5", 20, PoissonArrivals(rate=5)),
        ("gamma:cv=2", 20, GammaArrivals(rate=20, cv=2)),
        ("ramp:from=10,to=100", None, RampArrivals(start_rate=10, end_rate=100)),
        ("ramp", 50, RampArrivals(start_rate=0, end_rate=50)),
        ("ramp:from=5", 50, RampArrivals(start_rate=5, end_rate=50)),
        (
            "steps:rates=10/20/40,step=5",
            None,
            StepArrivals(rates=(10, 20, 40), step_s=5),
        ),
        (
            "diurnal:amplitude=0.5,period=60",
            30,
            DiurnalArrivals(rate=30, amplitude=0.5, period_s=60),
        ),
        (
            " diurnal : amplitude=0.5, period_s=60, phase=3, poisson=false ",
            30,
            DiurnalArrivals(rate=30, amplitude=0.5, period_s=60, phase_s=3, poisson=False),
        ),
    ],
)
def test_parse_arrival_reads_the_cli_forms(text: str, rate: float | None, expected: object) -> None:
    assert parse_arrival(text, rate) == expected


def test_yaml_mapping_selects_the_class_by_kind() -> None:
    spec = arrival_from_dict(yaml.safe_load("kind: poisson\nrate: 20\n"))
    assert spec == PoissonArrivals(rate=20)
    steps = arrival_from_dict({"kind": "steps", "rates": [1, 2], "step_s": 3, "poisson": False})
    assert steps == StepArrivals(rates=(1, 2), step_s=3, poisson=False)


def test_unknown_kind_lists_the_valid_ones() -> None:
    for attempt in (lambda: parse_arrival("bursty", 10), lambda: arrival_from_dict({"kind": "x"})):
        with pytest.raises(UnknownKindError) as caught:
            attempt()
        assert caught.value.valid == KINDS
        assert ", ".join(KINDS) in str(caught.value)


@pytest.mark.parametrize(
    ("text", "rate", "fragments"),
    [
        ("gamma:cvv=2", 10, ["'cvv'", "valid parameters are: rate, cv"]),
        ("gamma:cv=-1", 10, ["'cv'", "greater than 0", "'-1'"]),
        ("gamma:cv=abc", 10, ["'cv'", "valid number", "'abc'"]),
        ("poisson", None, ["needs 'rate'", "requests per second"]),
        ("diurnal:amplitude=1,period=60", 10, ["'amplitude'", "less than 1"]),
        ("steps:rates=10/x,step=1", None, ["'rates[1]'", "'x'"]),
        ("ramp:from=0,to=0", None, ["both 0"]),
        ("ramp:from=1,start_rate=2", None, ["given twice"]),
        ("poisson:rate", None, ["expected name=value", "'rate'"]),
    ],
)
def test_bad_parameters_say_what_is_wrong(
    text: str, rate: float | None, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_arrival(text, rate)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_mapping_without_kind_is_refused_with_the_kinds() -> None:
    with pytest.raises(ConfigError, match=r"needs a .kind.*constant, diurnal"):
        arrival_from_dict({"rate": 3})
    with pytest.raises(ConfigError, match="finite number"):
        arrival_from_dict({"kind": "poisson", "rate": math.inf})
