"""The SLO's text form: what a user types, what a report prints, and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ridgeline.errors import ConfigError
from ridgeline.health.slo import (
    METRICS,
    PERCENTILES,
    LatencyBound,
    SLOPolicy,
    format_slo,
    parse_slo,
)


def test_reads_bounds_units_and_percent() -> None:
    p = parse_slo("p50<20ms, p99.9<1s,errors<0.1%,attainment>=90%")
    assert p.latency == (
        LatencyBound(percentile="p50", bound_ms=20.0),
        LatencyBound(percentile="p999", bound_ms=1000.0),
    )
    assert p.max_error_rate == 0.001
    assert p.min_attainment == 0.9
    assert parse_slo("p99 < 250us").latency == (LatencyBound(percentile="p99", bound_ms=0.25),)


def test_error_rate_as_fraction_and_defaults() -> None:
    p = parse_slo("errors<0.001")
    assert (p.latency, p.max_error_rate, p.min_attainment) == ((), 0.001, 0.95)
    assert parse_slo("attainment>0.99").min_attainment == 0.99


def test_format_reads_like_the_input() -> None:
    assert format_slo(parse_slo("p99<100ms,errors<0.1%")) == (
        "p99<100ms,errors<0.1%,attainment>95%"
    )
    assert format_slo(parse_slo("p99.9<1.5s,max<250us")) == (
        "p999<1.5s,max<250us,errors<1%,attainment>95%"
    )


def test_reads_token_level_bounds_beside_the_end_to_end_ones() -> None:
    p = parse_slo("ttft_p99<200ms,itl_p99<50ms,tpot_p99.9<40ms,e2e_max<1s,p50<300ms")
    assert p.latency == (
        LatencyBound(metric="ttft", percentile="p99", bound_ms=200.0),
        LatencyBound(metric="itl", percentile="p99", bound_ms=50.0),
        LatencyBound(metric="tpot", percentile="p999", bound_ms=40.0),
        LatencyBound(percentile="max", bound_ms=1000.0),
        LatencyBound(percentile="p50", bound_ms=300.0),
    )
    assert format_slo(p) == (
        "ttft_p99<200ms,itl_p99<50ms,tpot_p999<40ms,max<1s,p50<300ms,errors<1%,attainment>95%"
    )


def test_e2e_is_the_bare_statistic_spelt_out() -> None:
    assert parse_slo("e2e_p99<1s") == parse_slo("p99<1s")
    assert parse_slo("ttft_p99<1s,p99<1s").latency[1] == LatencyBound(
        percentile="p99", bound_ms=1e3
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("p99<100ms,p99<abc", "part 2 'p99<abc' (at character 11)"),
        ("p99<100", "part 1 'p99<100' (at character 1) needs a time unit"),
        ("p75<10ms", "unknown statistic 'p75' in part 1"),
        ("p99>10ms", "must use '<', e.g. 'p99<100ms'"),
        ("errors<5ms", "takes a fraction or a percent, e.g. 'errors<0.1%'"),
        ("attainment>120%", "must lie in (0, 1]"),
        ("p99<1ms,p99<2ms", "p99 bounded twice"),
        ("", "cannot read part 1 ''"),
        ("p99<1s,e2e_p99<2s", "p99 and e2e_p99 both bound the end-to-end p99 latency"),
        ("ttft_p99<1s,ttft_p99.9<1s,ttft_p999<2s", "ttft_p999 bounded twice"),
        ("ttft_p75<1s", "unknown statistic 'ttft_p75'"),
        ("tbt_p99<1s", "each percentile also as e2e_, ttft_, itl_"),
        ("itl_p99<5", "needs a time unit (us, ms or s), e.g. 'itl_p99<100ms'"),
        ("ttft_p99>5ms", "must use '<', e.g. 'ttft_p99<100ms'"),
    ],
)
def test_a_malformed_part_is_named_with_an_example(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_slo(text)
    assert says in str(e.value)
    assert "e.g." in str(e.value) or "keep one bound" in str(e.value)


def test_a_statistic_bounded_twice_is_refused_by_the_model_too() -> None:
    b = LatencyBound(percentile="p99", bound_ms=1.0)
    with pytest.raises(ValueError, match="p99 bounded twice"):
        SLOPolicy(latency=(b, b))


_positive = st.floats(min_value=1e-6, max_value=1e7, allow_nan=False, allow_infinity=False)
_fraction = st.floats(min_value=1e-9, max_value=1.0, exclude_min=True)


@st.composite
def policies(draw: st.DrawFn) -> SLOPolicy:
    stats = st.tuples(st.sampled_from(METRICS), st.sampled_from(PERCENTILES))
    pairs = draw(st.lists(stats, unique=True, max_size=6))
    bounds = tuple(LatencyBound(metric=m, percentile=p, bound_ms=draw(_positive)) for m, p in pairs)
    return SLOPolicy(latency=bounds, max_error_rate=draw(_fraction), min_attainment=draw(_fraction))


@given(policies())
def test_format_then_parse_is_the_identity(policy: SLOPolicy) -> None:
    assert parse_slo(format_slo(policy)) == policy
