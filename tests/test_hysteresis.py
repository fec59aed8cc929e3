"""Hysteresis on exact sequences of window assessments."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ridgeline.health import (
    Assessment,
    HealthState,
    HysteresisConfig,
    HysteresisState,
    severity,
    smooth,
)

H, W, U, OV, C = (
    HealthState.HEALTHY,
    HealthState.WARN,
    HealthState.UNHEALTHY,
    HealthState.OVERLOADED,
    HealthState.CRITICAL,
)


def a(state: HealthState, score: float = 5.0, *, all_failed: bool = False) -> Assessment:
    return Assessment(state=state, score=score, all_failed=all_failed)


def run(
    seq: list[Assessment], cfg: HysteresisConfig, start: HealthState = H
) -> tuple[list[HealthState], list[bool]]:
    hs = HysteresisState.initial(start)
    states, spikes = [], []
    for x in seq:
        s, hs = smooth(hs, x, cfg)
        states.append(s)
        spikes.append(hs.spike)
    return states, spikes


K3 = HysteresisConfig()


def test_one_bad_window_does_not_flip_the_state() -> None:
    assert run([a(H, 0.3), a(U), a(H, 0.3), a(H, 0.3)], K3)[0] == [H, H, H, H]


def test_k_consecutive_windows_do() -> None:
    assert run([a(U)] * 4, K3)[0] == [H, H, U, U]
    assert run([a(U), a(U), a(H, 0.3), a(U), a(U), a(U)], K3)[0] == [H, H, H, H, H, U]


def test_recovery_also_takes_k_windows() -> None:
    assert run([a(H, 0.3)] * 3, K3, start=U)[0] == [U, U, H]


def test_alternating_bad_states_move_to_the_least_severe_they_agree_on() -> None:
    assert run([a(U), a(OV), a(U)], K3)[0] == [H, H, U]
    assert run([a(W, 0.9), a(H, 0.3), a(H, 0.3)], K3, start=C)[0] == [C, C, W]


def test_a_window_on_the_other_side_restarts_the_count() -> None:
    assert run([a(U), a(U), a(H, 0.3), a(U)], K3, start=W)[0] == [W, W, W, W]


def test_a_short_spike_is_tolerated_and_flagged() -> None:
    cfg = HysteresisConfig(k=1, spike_windows=1)
    assert run([a(U, 2.0), a(H, 0.3)], cfg) == ([H, H], [True, False])
    # a window at or past spike_max_score is no spike: with k=1 it moves the state at once
    assert run([a(U, 3.0)], cfg) == ([U], [False])


def test_a_longer_spike_is_not() -> None:
    assert run([a(U, 2.0)] * 2, HysteresisConfig(k=1, spike_windows=1)) == (
        [H, U],
        [True, False],
    )
    assert run([a(U, 2.0)] * 4, HysteresisConfig(k=3, spike_windows=2)) == (
        [H, H, U, U],
        [True, True, False, False],
    )
    # spike_windows ≥ k: the run counts from its start once it outgrows a spike
    assert run([a(U, 2.0)] * 4, HysteresisConfig(k=2, spike_windows=3)) == (
        [H, H, H, U],
        [True, True, True, False],
    )


def test_a_better_window_is_never_a_spike() -> None:
    assert run([a(H, 0.3)], HysteresisConfig(k=1), start=U) == ([H], [False])


def test_every_request_failing_goes_critical_at_once() -> None:
    dead = a(C, 100.0, all_failed=True)
    assert run([a(H, 0.3), dead, a(C, 100.0)], K3)[0] == [H, C, C]
    # a Critical window with some answers is smoothed like any other
    assert run([a(C, 100.0)], K3)[0] == [H]


_assessments = st.builds(
    a,
    st.sampled_from(list(HealthState)),
    st.floats(min_value=0.0, max_value=10.0),
    all_failed=st.integers(0, 9).map(lambda n: n == 0),  # a dying server, now and then
)


@given(
    seq=st.lists(_assessments, max_size=40),
    k=st.integers(min_value=1, max_value=5),
    spike_windows=st.integers(min_value=0, max_value=4),
    start=st.sampled_from(list(HealthState)),
)
def test_the_state_moves_only_when_k_windows_agree(
    seq: list[Assessment], k: int, spike_windows: int, start: HealthState
) -> None:
    cfg = HysteresisConfig(k=k, spike_windows=spike_windows)
    states, _ = run(seq, cfg, start)
    before = [start, *states]
    for i, (old, new) in enumerate(zip(before[:-1], states, strict=True)):
        if new == old:
            continue
        if seq[i].all_failed:
            assert new is C
            continue
        assert i + 1 >= k
        last = [x.state for x in seq[i + 1 - k : i + 1]]
        assert not any(x.all_failed for x in seq[i + 1 - k : i + 1])
        gaps = [severity(s) - severity(old) for s in last]
        # all k on one side of the old state, all at least as far as the new one
        assert all(g > 0 for g in gaps) or all(g < 0 for g in gaps)
        assert new in last
        assert all(abs(g) >= abs(severity(new) - severity(old)) for g in gaps)
