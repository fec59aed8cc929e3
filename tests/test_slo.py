"""The SLO's text form: what a user types, what a report prints, and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ridgeline.errors import ConfigError
from ridgeline.health.slo import PERCENTILES, LatencyBound, SLOPolicy, format_slo, parse_slo


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
    pcts = draw(st.lists(st.sampled_from(PERCENTILES), unique=True, max_size=4))
    bounds = tuple(LatencyBound(percentile=p, bound_ms=draw(_positive)) for p in pcts)
    return SLOPolicy(latency=bounds, max_error_rate=draw(_fraction), min_attainment=draw(_fraction))


@given(policies())
def test_format_then_parse_is_the_identity(policy: SLOPolicy) -> None:
    assert parse_slo(format_slo(policy)) == policy
