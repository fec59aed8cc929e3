"""A probe's steps on a recorded trace (``--trace-scale overlay|speed``): overlaid copies
of the trace, each replaying the step's length of it from its own random point, keep
the trace's bursts and their count's variance; sped up, a step replays the trace's
opening stretch as it always has. Virtual time throughout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from _cli import ridgeline
from ridgeline.errors import ConfigError
from ridgeline.loadgen.schedule import trace_at_rate, trace_copies, trace_superposed
from ridgeline.probe.api import make_driver
from ridgeline.probe.drivers import NetworkDriver, SimDriver, step_schedule
from ridgeline.search.base import StepPlan
from ridgeline.workload import Trace, bundled_trace_path, read_trace

pytestmark = pytest.mark.timeout(120)


def numbered(times: list[float] | np.ndarray) -> Trace:
    """A trace whose ``items`` number its rows from 1, so a request's row shows."""
    return Trace.from_times(np.asarray(times, float), {"items": np.arange(1, len(times) + 1)})


def period_of(trace: Trace) -> float:
    """The trace cycles with this period: its span and one mean gap."""
    return trace.duration * len(trace) / (len(trace) - 1)


BURSTY = numbered(
    np.sort(
        np.concatenate(
            [
                np.arange(100.0),  # one request a second for 100 s
                30.0 + np.arange(40) * 0.01,  # and two bursts of 40 in 0.4 s
                70.0 + np.arange(40) * 0.01,
            ]
        )
    )
)


# --- speed: the schedule a probe's step always made -----------------------------------


def test_speed_replays_the_traces_opening_stretch_as_before() -> None:
    """The trace 0, 1, 3 s at 2 req/s for 2 s: its first four gaps cycled (1, 2, 1, 2 s)
    scaled by 2/6 to fill the step, the rows cycled with them; any seed, every step."""
    trace = numbered([0.0, 1.0, 3.0])
    for seed in (0, 7):
        step = step_schedule(StepPlan(2.0, 2.0, "confirm"), seed, "poisson", trace, "speed")
        assert step.times.tolist() == pytest.approx([0.0, 1 / 3, 1.0, 4 / 3], abs=1e-12)
        assert [s.items for s in step.shapes or []] == [1, 2, 3, 1]
    bundled = read_trace(bundled_trace_path())
    today = trace_at_rate(bundled, 40.0, 30.0)
    driver = NetworkDriver("http://127.0.0.1:1/", trace=bundled, trace_scale="speed")
    for seed in (0, 3):
        again = driver.schedule(StepPlan(40.0, 30.0, "bisect"), seed)
        np.testing.assert_array_equal(again.times, today.times)
        assert again.shapes == today.shapes


# --- overlay: counts and their laws -----------------------------------------------------


def test_whole_copies_over_whole_periods_replay_every_row_that_many_times() -> None:
    """Three copies for two periods: each of the trace's rows exactly six times, whatever
    the starting points (a copy over a whole period holds the whole trace)."""
    period = period_of(BURSTY)
    rate = 3 * len(BURSTY) / period
    for seed in (0, 1, 2):
        step = trace_superposed(BURSTY, rate, 2 * period, seed)
        items = np.array([s.items for s in step.shapes or []])
        assert len(step.times) == 6 * len(BURSTY)
        assert np.bincount(items)[1:].tolist() == [6] * len(BURSTY)
        assert np.all(np.diff(step.times) >= 0) and step.times[0] >= 0
        assert step.times[-1] < 2 * period


def test_a_fraction_of_a_copy_is_a_binomial_share_of_its_requests() -> None:
    """At 2.5 times the trace's mean rate for three periods: two whole copies (6·n
    requests) and half of a third, Binomial(3·n, 1/2). Over 200 seeds the half copy's
    mean count is 3n/2 within 4 standard errors, 4·sqrt(3n·¼/200), so the step's mean
    rate is 2.5 times the trace's (a false alarm once in 15,000 draws of seeds)."""
    n, period = len(BURSTY), period_of(BURSTY)
    rate = 2.5 * n / period
    extra = []
    for seed in range(200):
        count = len(trace_superposed(BURSTY, rate, 3 * period, seed).times)
        assert 6 * n <= count <= 9 * n
        extra.append(count - 6 * n)
    assert abs(np.mean(extra) - 1.5 * n) <= 4 * np.sqrt(3 * n * 0.25 / 200)


def test_an_overlaid_step_offers_its_rate_on_average() -> None:
    """The bundled trace (2.6 req/s, an inter-arrival CV of 13) at 40 req/s for 30 s, 400
    seeds: the count is drawn (its spread is the trace's over 30 s) and its mean is
    1,200. The seeds' starts are independent, so the mean of 400 counts lies within 4 of
    its standard errors (the counts' own SD over √400) of 1,200."""
    trace = read_trace(bundled_trace_path())
    counts = np.array([len(trace_superposed(trace, 40.0, 30.0, s).times) for s in range(400)])
    assert counts.std() > 3 * np.sqrt(1200)  # far more spread than Poisson arrivals
    assert abs(counts.mean() - 1200) <= 4 * counts.std(ddof=1) / np.sqrt(len(counts))


def test_one_copy_keeps_the_traces_inter_arrival_cv() -> None:
    """At the trace's own mean rate for one period, the step is the whole trace started
    at a random point: its gaps are the trace's (one split in two, the wrap added), so
    their CV is the trace's 13.2 to within 2 %."""
    trace = read_trace(bundled_trace_path())
    period = period_of(trace)

    def cv(times: np.ndarray) -> float:
        gaps = np.diff(times)
        return float(gaps.std() / gaps.mean())

    for seed in (0, 1):
        step = trace_superposed(trace, len(trace) / period, period, seed)
        assert "its users ×1 (" in step.description
        assert cv(step.times) == pytest.approx(cv(trace.times), rel=0.02)


def test_the_counts_variance_adds_up_over_copies_as_superposition_predicts() -> None:
    """The count of a 10 s step over the bursty trace (a request a second, two bursts of
    40), 3,000 seeds at each overlay factor. ``k`` independent copies: the variance is
    ``k`` times one copy's (the index of dispersion, variance over mean, stays the
    trace's); half a copy, each request kept with probability ½: ``¼·V + ¼·M``
    (binomial thinning). Tolerance: 4 standard errors of ln(variance), √((κ−1)/S) for
    kurtosis κ over S seeds, for each side."""
    period = period_of(BURSTY)
    mean_rate = len(BURSTY) / period
    seeds = range(3000)

    def counts(factor: float) -> np.ndarray:
        rate = factor * mean_rate
        return np.array([len(trace_superposed(BURSTY, rate, 10.0, s).times) for s in seeds])

    def log_se(c: np.ndarray) -> float:
        z = (c - c.mean()) / c.std()
        return float(np.sqrt((np.mean(z**4) - 1) / len(c)))

    one = counts(1.0)
    v1, m1 = one.var(ddof=1), one.mean()
    assert v1 / m1 > 10  # the bursts: far past Poisson's 1
    for factor, predicted in ((4.0, 4 * v1), (0.5, 0.25 * v1 + 0.25 * m1)):
        c = counts(factor)
        tolerance = 4 * np.hypot(log_se(one), log_se(c))
        assert abs(np.log(c.var(ddof=1) / predicted)) <= tolerance, factor
        assert c.mean() == pytest.approx(factor * m1, rel=0.1)
    dispersion_4 = counts(4.0)
    assert dispersion_4.var() / dispersion_4.mean() == pytest.approx(v1 / m1, rel=0.3)


# --- sizes, seeds and the drivers ------------------------------------------------------


def test_sizes_travel_with_their_arrivals() -> None:
    """One copy: consecutive requests are consecutive rows of the trace (cycling), the
    gap between them the trace's own, and each carries its row's size."""
    times = np.cumsum(np.arange(1.0, 31.0)) - 1.0  # every gap its own length: 2, 3, ...
    trace = numbered(times)
    period = period_of(trace)
    step = trace_superposed(trace, len(trace) / period, 2.5 * period, seed=4)
    rows = np.array([s.items for s in step.shapes or []]) - 1
    assert len(rows) > 60
    nxt = (rows[:-1] + 1) % len(trace)
    np.testing.assert_array_equal(rows[1:], nxt)
    gaps = np.append(np.diff(times), period - times[-1])  # row i to the next, cycling
    recorded = gaps[rows[:-1]]
    np.testing.assert_allclose(np.diff(step.times), recorded, atol=1e-9)


def test_each_step_draws_its_own_stretches_from_its_seed() -> None:
    """Overlay is the drivers' default: two steps at one rate (a search step and its
    confirmation, seeds apart) replay different stretches; one seed, the same."""
    trace = read_trace(bundled_trace_path())
    sim = make_driver("sim:vision", trace=bundled_trace_path())
    assert isinstance(sim, SimDriver) and sim.trace_scale == "overlay"
    plan = StepPlan(40.0, 20.0, "confirm")
    first = step_schedule(plan, 5, "poisson", trace)
    assert "overlaid at their own pace" in first.description
    np.testing.assert_array_equal(step_schedule(plan, 5, "poisson", trace).times, first.times)
    assert not np.array_equal(step_schedule(plan, 6, "poisson", trace).times, first.times)
    with pytest.raises(ConfigError, match="--trace-scale must be overlay or speed, got 'window'"):
        make_driver("sim:vision", trace=bundled_trace_path(), trace_scale="window")


def test_a_draw_with_no_request_still_sends_one() -> None:
    trace = numbered([0.0, 1000.0])  # a period of 2,000 s, mostly empty
    step = trace_superposed(trace, 1e-4, 1.0, seed=0)
    assert step.times.tolist() == [0.0] and step.shapes is not None and len(step.shapes) == 1


# --- the laws, for any trace -------------------------------------------------------------

timelines = st.lists(st.floats(0.0, 1000.0, allow_nan=False), min_size=2, max_size=40).filter(
    lambda t: max(t) > min(t)
)
starts = st.lists(st.floats(0.0, 5000.0, allow_nan=False), max_size=6)


@settings(max_examples=80, deadline=None)
@given(times=timelines, a=starts, b=starts, duration=st.floats(0.01, 3000.0))
def test_overlaid_copies_add_up(
    times: list[float], a: list[float], b: list[float], duration: float
) -> None:
    """Copies from two lists of starting points are the copies of each, together: the
    count is the sum of the counts, the times and rows the same; every request lies in
    [0, duration), and one copy that does not wrap is the trace's window at its start."""
    trace = numbered(times)
    assume(len(trace) * duration / period_of(trace) < 1e5)  # copies that fit in memory
    both_t, both_r = trace_copies(trace, np.array(a + b), duration)
    a_t, a_r = trace_copies(trace, np.array(a), duration)
    b_t, b_r = trace_copies(trace, np.array(b), duration)
    assert len(both_t) == len(a_t) + len(b_t)
    np.testing.assert_array_equal(both_t, np.concatenate([a_t, b_t]))
    np.testing.assert_array_equal(both_r, np.concatenate([a_r, b_r]))
    assert np.all((both_t >= 0) & (both_t < duration))
    s = trace.times[len(trace) // 2]
    one_t, one_r = trace_copies(trace, np.array([s]), duration)
    if s + duration <= trace.duration:
        window = trace.window(s, s + duration)
        np.testing.assert_allclose(one_t - one_t[0], window.times, atol=1e-9)
        np.testing.assert_array_equal(trace.columns["items"][one_r], window.columns["items"])


@settings(max_examples=60, deadline=None)
@given(
    times=timelines,
    rate=st.floats(0.01, 300.0),
    duration=st.floats(0.1, 100.0),
    seed=st.integers(0, 2**16),
)
def test_an_overlaid_step_is_sorted_sized_and_seeded(
    times: list[float], rate: float, duration: float, seed: int
) -> None:
    """Whatever the trace and the step: a sorted schedule in [0, duration), one request
    at least, each of them one of the trace's rows; one seed, one schedule. A trace so
    fast that its cycling places would pass a float's whole numbers is refused."""
    trace = numbered(times)
    if len(trace) * duration / period_of(trace) > 2.0**53:
        with pytest.raises(ConfigError, match="too fast to replay"):
            trace_superposed(trace, rate, duration, seed)
        return
    step = trace_superposed(trace, rate, duration, seed)
    assert len(step.times) >= 1 and step.duration_s == duration
    assert np.all(np.diff(step.times) >= 0)
    assert step.times[0] >= 0 and step.times[-1] < duration
    assert step.shapes is not None and len(step.shapes) == len(step.times)
    assert {s.items for s in step.shapes} <= set(range(1, len(times) + 1))
    np.testing.assert_array_equal(trace_superposed(trace, rate, duration, seed).times, step.times)


# --- the command -------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_probe_replays_a_trace_overlaid_or_sped_up(tmp_path: Path) -> None:
    """``ridgeline probe sim:vision --trace T`` held at 10 req/s (``stability``): sped
    up, every second of load sends exactly 10 requests; overlaid (the default), as many
    as its copies' stretches of the bursty trace hold, the same for the same seed and
    not for another; an unknown scale is refused before anything runs."""
    trace = tmp_path / "bursty.csv"
    sizes = BURSTY.columns["items"] % 7 + 1
    rows = [f"{t!r},{i}" for t, i in zip(BURSTY.times.tolist(), sizes.tolist(), strict=True)]
    trace.write_text("time,items\n" + "\n".join(rows) + "\n")
    db = tmp_path / "runs.sqlite"
    args = ["probe", "sim:vision", "--trace", str(trace), "--strategy", "stability"]
    args += ["--rate", "10", "--no-warmup", "--no-confirm", "--json"]

    def sent(*extra: str) -> tuple[int, float]:
        res = ridgeline(*args, *extra, db=db)
        assert res.returncode in (0, 1), res.stderr
        out = json.loads(res.stdout)
        return int(out["requests_sent"]), float(out["test_seconds"])

    count, seconds = sent("--trace-scale", "speed")
    assert count == round(10 * seconds)
    overlaid = [sent(), sent("--trace-scale", "overlay"), sent("--seed", "1")]
    assert overlaid[0] == overlaid[1] and overlaid[0][0] != round(10 * overlaid[0][1])
    assert overlaid[2][0] != overlaid[0][0]
    res = ridgeline(*args, "--trace-scale", "window", db=db)
    assert res.returncode == 2
    assert "--trace-scale must be overlay or speed, got 'window'" in res.stderr
    for command in ("probe", "simulate"):  # one declaration of the option
        words = " ".join(ridgeline(command, "--help").stdout.replace("│", " ").split())
        assert "--trace-scale" in words and "the stress case" in words
        assert "[default: overlay]" in words
