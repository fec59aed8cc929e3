"""How a server's late requests come and go across a probe's steps (``health.timescale``):
the index of dispersion of their counts, and the confirmation length it asks for."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.health.timescale import CLUSTERS, MIN_LATE, TimeScale, Window, time_scale

pytestmark = pytest.mark.timeout(30)


def step(index: int, start: float, late: list[int]) -> list[Window]:
    """One step's one-second windows from ``start``."""
    return [Window(start + i, index, k) for i, k in enumerate(late)]


def test_too_few_late_requests_read_nothing() -> None:
    seen = time_scale(step(0, 0.0, [1] * (MIN_LATE - 1)), 1.0)
    assert seen.dispersion == 0.0
    assert seen.cover_s(500.0, 0.01) == 0.0


def test_one_late_request_a_window_is_not_clustered() -> None:
    """Counts that never vary: an IDC of 0 at every length, and no time asked for."""
    seen = time_scale(step(0, 0.0, [2] * 64), 1.0)
    assert seen.idc == ((1.0, 0.0), (2.0, 0.0), (4.0, 0.0), (8.0, 0.0))
    assert seen.cover_s(500.0, 0.01) == 0.0


def test_a_stall_every_45_s_asks_for_ten_of_them() -> None:
    """A 500 ms stall every 45 s makes 220 requests late, the rest none: at a rate of
    500 req/s where 1 % may be late, 220 late come every 220 / 5 = 44 s, and ten of
    them take 440 s. The IDC at 1 s bins is (220²/45 − (220/45)²) / (220/45) =
    220 − 220/45; longer bins of one step hold no more than one stall (at 32 s, 2 of its
    5 bins do: the same mean and a smaller spread)."""
    late = [0] * 180
    for t in (10, 55, 100, 145):
        late[t] = 220
    seen = time_scale(step(0, 0.0, late), 1.0)
    assert seen.dispersion == pytest.approx(220 - 220 / 45)
    assert seen.spacing_s(500.0, 0.01) == pytest.approx((220 - 220 / 45) / 5)
    assert seen.cover_s(500.0, 0.01) == pytest.approx(CLUSTERS * (220 - 220 / 45) / 5)


def test_bins_never_span_two_steps() -> None:
    """Two steps at different rates, each steady: 1 late a window in one, 9 in the other.
    Within each step the counts do not vary; across them they would, for the rate
    alone."""
    windows = step(0, 0.0, [1] * 32) + step(1, 33.0, [9] * 32)
    assert time_scale(windows, 1.0).dispersion == 0.0


def test_a_neighbours_busy_phase_reads_at_the_phases_length() -> None:
    """Late requests only in a neighbour's busy phase, 36 s of every 90 s: a bin of L
    windows inside a phase holds 4·L late, else none, so the IDC is (1 − 0.4)·4·L, growing
    with the bin length while bins fit inside the phases (exactly 2.4 at 1 s; bins that
    straddle a phase's edge pull the longer ones below the line)."""
    late = [(4 if t % 90 >= 54 else 0) for t in range(360)]
    seen = time_scale(step(0, 0.0, late), 1.0)
    by_length = dict(seen.idc)
    assert by_length[1.0] < by_length[2.0] < by_length[4.0] < by_length[8.0] < by_length[16.0]
    assert seen.dispersion == max(by_length.values())
    assert by_length[1.0] == pytest.approx(2.4)
    assert by_length[16.0] >= 0.75 * 2.4 * 16


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    cluster=st.integers(10, 200),
)
def test_clusters_read_larger_than_the_same_late_requests_spread(seed: int, cluster: int) -> None:
    """The same late requests, once spread over the windows one by one and once in
    clusters of ``cluster``: the clustered ones ask for a longer run (law: merging
    Poisson counts into lumps multiplies the IDC by the lump's size). Lumps of ten or
    more: 40 late requests spread over 400 windows read an IDC of 1 give or take the
    noise of a dozen bins at the longest length (up to ~3), which lumps of two or three
    do not clear."""
    rng = np.random.default_rng(seed)
    n, clusters = 400, 20
    spread = np.bincount(rng.integers(0, n, clusters * cluster), minlength=n)
    lumped = np.zeros(n, dtype=int)
    np.add.at(lumped, rng.integers(0, n, clusters), cluster)
    a = time_scale(step(0, 0.0, spread.tolist()), 1.0)
    b = time_scale(step(0, 0.0, lumped.tolist()), 1.0)
    assert b.cover_s(100.0, 0.01) > a.cover_s(100.0, 0.01)


def test_describe_names_the_spacing() -> None:
    seen = TimeScale(220.0, ((1.0, 220.0),), late=880, watched_s=180.0)
    assert seen.describe(500.0, 0.01) == (
        "late requests came 220 together (880 late in 180 s of steps that kept up): "
        "at 500 req/s a cluster every 44 s"
    )
