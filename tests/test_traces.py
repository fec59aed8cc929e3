"""Recorded traces: the bundled Azure trace, round trips through CSV and JSONL, the laws
of window / scaling, and errors that name the file, line and column."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ridgeline
from ridgeline.errors import ConfigError, TraceFormatError, UnknownKindError
from ridgeline.probe.drivers import step_schedule
from ridgeline.search.base import StepPlan
from ridgeline.workload import Trace, bundled_trace_path, read_trace

Row = tuple[float, int, int]


def write_csv(path: Path, header: str, lines: list[str]) -> Path:
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def write_rows(path: Path, rows: list[Row], fmt: str) -> Path:
    """Rows of (seconds, prompt tokens, output tokens), in the given order."""
    if fmt == "csv":
        lines = [f"{t!r},{p},{o}" for t, p, o in rows]
        return write_csv(path.with_suffix(".csv"), "time,input_tokens,output_tokens", lines)
    records = [{"ts": t, "prompt_tokens": p, "GeneratedTokens": o} for t, p, o in rows]
    target = path.with_suffix(".jsonl")
    target.write_text("".join(json.dumps(r) + "\n" for r in records))
    return target


def trace_of(times: list[float]) -> Trace:
    return Trace.from_times(np.array(times), {"items": np.arange(1, len(times) + 1)}, "test")


# --- the bundled trace ----------------------------------------------------------------


def test_bundled_azure_trace_reads_whole_and_fast() -> None:
    path = bundled_trace_path()
    # the reader's own CPU time, not the wall clock: fast is a claim about its work,
    # and other processes on a busy host stretch the wall clock, not this
    started = time.process_time()
    trace = read_trace(path)
    assert time.process_time() - started < 1.0
    # The file holds 8,819 data rows after its header (it has no final newline).
    assert len(trace) == 8_819
    assert trace.mean_rate == pytest.approx(2.6, abs=0.05)
    assert trace.duration == pytest.approx(57.3 * 60, rel=0.01)
    assert set(trace.columns) == {"prompt_tokens", "output_tokens"}
    # First rows of the file: 18:17:03.9799600,4808,10 and 18:17:04.0319600,3180,8.
    assert trace.times[:2].tolist() == [0.0, 0.052]
    assert trace.columns["prompt_tokens"][:2].tolist() == [4808, 3180]
    assert trace.columns["output_tokens"][:2].tolist() == [10, 8]
    gaps = np.diff(trace.times)
    assert 12 < gaps.std() / gaps.mean() < 14  # very bursty, as the dataset notes say


def test_bundled_trace_lives_in_the_package_with_its_attribution() -> None:
    path = bundled_trace_path("azure_llm_2023_code")
    assert path.parent == Path(ridgeline.__file__).parent / "data"
    attribution = (path.parent / "ATTRIBUTION.md").read_text()
    for needed in ("CC-BY 4.0", "Azure Public Dataset", "Splitwise", "Patel et al.", "ISCA 2024"):
        assert needed in attribution
    with pytest.raises(UnknownKindError, match="azure_llm_2023_code"):
        bundled_trace_path("azure_llm_2099")


# --- round trips ----------------------------------------------------------------------

rows_strategy = st.lists(
    st.tuples(
        st.floats(0, 1e5, allow_nan=False, allow_infinity=False),
        st.integers(0, 100_000),
        st.integers(0, 4_096),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40)
@given(rows=rows_strategy, fmt=st.sampled_from(["csv", "jsonl"]))
def test_read_back_keeps_order_and_gaps(
    tmp_path_factory: pytest.TempPathFactory, rows: list[Row], fmt: str
) -> None:
    origin = min(t for t, _, _ in rows)
    rows = [(t - origin, p, o) for t, p, o in rows]  # first request at 0, as a trace holds
    trace = read_trace(write_rows(tmp_path_factory.mktemp("rt") / "trace", rows, fmt))
    expected = sorted(rows, key=lambda row: row[0])  # stable: ties keep file order
    assert trace.times.tolist() == [t for t, _, _ in expected]
    assert trace.columns["prompt_tokens"].tolist() == [p for _, p, _ in expected]
    assert trace.columns["output_tokens"].tolist() == [o for _, _, o in expected]


@settings(max_examples=25)
@given(offsets=st.lists(st.integers(0, 10**13), min_size=1, max_size=30))
def test_azure_datetimes_with_seven_digits_read_to_the_100ns(
    tmp_path_factory: pytest.TempPathFactory, offsets: list[int]
) -> None:
    base = datetime(2023, 11, 16, 18, 17, 3)
    stamps = [base + timedelta(microseconds=k // 10) for k in offsets]
    lines = [
        f"{s:%Y-%m-%d %H:%M:%S}.{s.microsecond:06d}{k % 10},1,1"
        for s, k in zip(stamps, offsets, strict=True)
    ]
    path = write_csv(tmp_path_factory.mktemp("dt") / "t.csv", "TIMESTAMP,ContextTokens,x", lines)
    trace = read_trace(path)
    ticks = sorted(offsets)
    assert trace.times.tolist() == [(k - ticks[0]) * 100 / 1e9 for k in ticks]


# a trace spanning under a microsecond has no meaningful rate (its mean rate overflows)
timelines = st.lists(st.floats(0, 1e4, allow_nan=False), min_size=2, max_size=50).filter(
    lambda ts: max(ts) - min(ts) > 1e-6
)


@given(times=timelines, target=st.floats(0.01, 1e4))
def test_scaled_to_rate_reaches_the_target_and_keeps_gap_ratios(
    times: list[float], target: float
) -> None:
    trace = trace_of(times)
    scaled = trace.scaled_to_rate(target)
    assert scaled.mean_rate == pytest.approx(target, rel=1e-9)
    old, new = np.diff(trace.times), np.diff(scaled.times)
    np.testing.assert_allclose(new / new.sum(), old / old.sum(), rtol=1e-9, atol=1e-15)
    assert np.array_equal(scaled.columns["items"], trace.columns["items"])


@given(times=timelines, factor=st.floats(0.01, 100))
def test_at_speed_divides_every_time(times: list[float], factor: float) -> None:
    trace = trace_of(times)
    fast = trace.at_speed(factor)
    assert fast.duration == pytest.approx(trace.duration / factor, rel=1e-12)
    # to a picosecond: a subnormal time (5e-324 s) halved underflows to 0
    np.testing.assert_allclose(fast.at_speed(1 / factor).times, trace.times, rtol=1e-9, atol=1e-12)


@given(times=timelines, cut=st.floats(0, 1))
def test_windows_partition_the_trace(times: list[float], cut: float) -> None:
    trace = trace_of(times)
    split = trace.duration * cut
    whole = [trace.window(0, split)] if split > 0 else []
    if split <= trace.duration:
        whole.append(trace.window(split, trace.duration + 1))
    assert sum(len(w) for w in whole) == len(trace)
    items = np.concatenate([w.columns["items"] for w in whole])
    assert np.array_equal(items, trace.columns["items"])
    for part in whole:
        assert part.times[0] == 0.0
        start = np.flatnonzero(trace.columns["items"] == part.columns["items"][0])[0]
        gaps = np.diff(trace.times[start : start + len(part)])
        np.testing.assert_allclose(np.diff(part.times), gaps, atol=1e-9)


def test_window_slices_by_time_and_rebases() -> None:
    trace = trace_of([0.0, 1.0, 2.5, 4.0, 7.0])
    part = trace.window(1.0, 4.0)
    assert part.times.tolist() == [0.0, 1.5]
    assert part.columns["items"].tolist() == [2, 3]
    with pytest.raises(ConfigError, match="holds no requests"):
        trace.window(4.5, 6.0)


def test_unsorted_rows_are_sorted_stably(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", "ts,items", ["5,1", "3,2", "5,3", "3,4", "4,5"])
    trace = read_trace(path)
    assert trace.times.tolist() == [0.0, 0.0, 1.0, 2.0, 2.0]
    assert trace.columns["items"].tolist() == [2, 4, 5, 1, 3]


# --- units, names, zones --------------------------------------------------------------


def test_time_units_from_the_argument_or_the_column_name(tmp_path: Path) -> None:
    ms = write_csv(tmp_path / "a.csv", "timestamp,batch_size", ["1000,2", "1250,4"])
    assert read_trace(ms, time_unit="ms").times.tolist() == [0.0, 0.25]
    assert read_trace(ms, time_unit="ms").columns["items"].tolist() == [2, 4]
    named = write_csv(tmp_path / "b.csv", "arrival_time_us,x", ["10,a", "500010,b"])
    assert read_trace(named, time_column="arrival_time_us").times.tolist() == [0.0, 0.5]
    auto = write_csv(tmp_path / "c.csv", "Time_MS", ["0", "1500"])
    assert read_trace(auto).times.tolist() == [0.0, 1.5]


def test_zone_suffixes_are_converted_to_utc(tmp_path: Path) -> None:
    lines = ["2023-11-16T18:17:03Z", "2023-11-16T19:17:04+01:00", "2023-11-16 18:17:05.5"]
    trace = read_trace(write_csv(tmp_path / "z.csv", "created_at", lines))
    assert trace.times.tolist() == [0.0, 1.0, 2.5]


# --- malformed traces -----------------------------------------------------------------

GOOD = ["2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.0319600,3180,8"]
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def test_bad_timestamp_names_file_line_and_column(tmp_path: Path) -> None:
    lines = [*GOOD, GOOD[0], "abc,1,1", GOOD[1]]  # "abc" is on line 5 (the header is line 1)
    path = write_csv(tmp_path / "azure.csv", AZURE_HEADER, lines)
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    error = caught.value
    assert (error.path, error.line, error.column) == (str(path), 5, "TIMESTAMP")
    assert f"{path}, line 5, column TIMESTAMP" in str(error)
    assert "expected a timestamp like 2023-11-16 18:17:03.97 or seconds, got 'abc'" in str(error)


def test_bad_number_names_its_true_line_after_blank_lines(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "n.csv", "time,prompt_tokens", ["0.5,3", "", "x,4"])
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    assert (caught.value.line, caught.value.column) == (4, "time")
    assert "got 'x'" in str(caught.value)


@pytest.mark.parametrize(
    ("lines", "line", "column", "fragment"),
    [
        (["0,-3,1"], 2, "ContextTokens", "expected an integer ≥ 0, got '-3'"),
        (["0,1,2.5"], 2, "GeneratedTokens", "expected an integer ≥ 0, got '2.5'"),
        (["0,1,2", "1,2"], 3, "GeneratedTokens", "expected 3 comma-separated fields"),
        (["nan,1,2"], 2, "TIMESTAMP", "got 'nan'"),
    ],
)
def test_bad_cells_are_named(
    tmp_path: Path, lines: list[str], line: int, column: str, fragment: str
) -> None:
    with pytest.raises(TraceFormatError) as caught:
        read_trace(write_csv(tmp_path / "c.csv", AZURE_HEADER, lines))
    assert (caught.value.line, caught.value.column) == (line, column)
    assert fragment in str(caught.value)


def test_missing_timestamp_column_lists_the_columns_found(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "m.csv", "when,ContextTokens", ["1,2"])
    with pytest.raises(TraceFormatError, match="columns found: when, ContextTokens"):
        read_trace(path)
    with pytest.raises(TraceFormatError, match="looked for 'sent'; columns found: when"):
        read_trace(path, time_column="sent")


def test_bad_json_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0}\n{"timestamp": 1}\n{"timestamp": 2,\n')
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    assert caught.value.line == 3
    assert "not valid JSON" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ('{"ts": 0}\n[1, 2]\n', 2, "expected a JSON object"),
        ('{"ts": 0}\n\n{"other": 1}\n', 3, "got nothing"),
        ('{"ts": 0}\n{"ts": true}\n', 2, "got True"),
        ('{"ts": 0, "items": 0}\n', 1, "expected an integer ≥ 1, got 0"),
    ],
)
def test_bad_json_records_are_named(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = tmp_path / "t.ndjson"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    assert caught.value.line == line
    assert fragment in str(caught.value)


@pytest.mark.parametrize(("name", "text"), [("e.csv", ""), ("h.csv", AZURE_HEADER + "\n")])
def test_an_empty_trace_is_an_error(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(TraceFormatError, match=r"empty|no requests"):
        read_trace(tmp_path / name)


def test_units_only_apply_to_numbers(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "a.csv", AZURE_HEADER, GOOD)
    with pytest.raises(TraceFormatError, match="numeric timestamps"):
        read_trace(path, time_unit="ms")
    with pytest.raises(UnknownKindError, match="valid time units are: ms, ns, s, us"):
        read_trace(path, time_unit="hours")  # type: ignore[arg-type]


def test_trace_misuse_is_a_config_error() -> None:
    single = trace_of([3.0])
    assert len(single) == 1 and single.duration == 0.0
    with pytest.raises(ConfigError, match="no mean rate"):
        _ = single.mean_rate
    with pytest.raises(ConfigError, match="> 0"):
        trace_of([0.0, 1.0]).at_speed(0.0)
    with pytest.raises(ConfigError, match="sorted and start at 0"):
        Trace(np.array([1.0, 2.0]))
    trace = trace_of([0.0, 1.0])
    with pytest.raises(ValueError, match="read-only"):
        trace.times[0] = 5.0


@given(
    times=timelines,
    rate=st.floats(0.5, 500),
    duration=st.floats(0.5, 60),
)
@example(times=[0.0, 1.0, 2.2250738585e-313], rate=1.0, duration=1.0)  # a denormal gap
def test_a_trace_step_offers_its_labelled_rate_with_the_traces_gaps(
    times: list[float], rate: float, duration: float
) -> None:
    """A probe step on a trace sped up (``--trace-scale speed``) holds exactly its rate
    (round(rate·duration) arrivals in [0, duration]), and its gaps are the trace's own,
    cycled and scaled by one factor."""
    trace = trace_of(times)
    step = step_schedule(StepPlan(rate, duration, "t"), 0, "poisson", trace, "speed")
    n = max(1, round(rate * duration))
    assert len(step.times) == n and step.duration_s == duration
    assert step.times[0] == 0.0 and np.all(np.diff(step.times) >= 0)
    assert step.times[-1] <= duration
    if rate * duration >= 1:  # (a step always holds one request at least)
        assert abs(step.rate - rate) <= 0.5 / duration + 1e-9
    gaps = np.resize(np.diff(trace.times), n)
    if n > 1 and gaps.sum() > 0:  # each gap the trace's, times one factor (to a nanosecond)
        scaled = gaps[: n - 1] * (duration / gaps.sum())
        np.testing.assert_allclose(np.diff(step.times), scaled, rtol=1e-6, atol=1e-9)


def test_a_held_trace_holds_its_rate_every_stretch_and_replays_the_trace_in_order() -> None:
    """The bundled trace at 30 req/s for 12 s, held every 2 s: 60 requests in each 2 s
    (time-scaled as a whole, its opening puts most of them in the last 2 s), and the
    first stretch is the trace's first 60 requests time-scaled to it."""
    from ridgeline.loadgen.schedule import trace_at_rate, trace_held

    trace = read_trace(bundled_trace_path())
    held = trace_held(trace, 30.0, 12.0)
    counts = np.histogram(held.times, bins=np.arange(0.0, 12.1, 2.0))[0]
    assert counts.tolist() == [60] * 6
    whole = np.histogram(trace_at_rate(trace, 30.0, 12.0).times, bins=np.arange(0.0, 12.1, 2.0))
    assert whole[0].max() > 150  # the burstiness a held trace keeps within 2 s only
    first = trace_at_rate(Trace.from_times(trace.times[:61]), 30.0, 2.0)
    np.testing.assert_allclose(held.times[:60], first.times)
    with pytest.raises(ConfigError, match="hold_s must be finite and > 0"):
        trace_held(trace, 30.0, 12.0, hold_s=0.0)


@settings(max_examples=60, deadline=None)
@given(
    times=timelines,
    rate=st.floats(0.5, 500),
    duration=st.floats(0.5, 60),
    seed=st.integers(0, 2**16),
)
@example(times=[0.0, 1.0, 2.2250738585e-313], rate=1.0, duration=1.0, seed=0)  # a denormal gap
def test_an_overlaid_trace_offers_its_labelled_rate_from_the_traces_rows(
    times: list[float], rate: float, duration: float, seed: int
) -> None:
    """Copies overlaid hold exactly the rate (round(rate·duration) arrivals, sorted, in
    [0, duration]), every request one of the trace's (its size column kept), and the same
    seed makes the same schedule."""
    from ridgeline.loadgen.schedule import trace_overlaid

    trace = trace_of(times)
    if not trace.duration > 0:
        with pytest.raises(ConfigError, match="spans no time"):
            trace_overlaid(trace, rate, duration, seed)
        return
    step = trace_overlaid(trace, rate, duration, seed)
    n = max(1, round(rate * duration))
    assert len(step.times) == n and step.duration_s == duration
    assert np.all(np.diff(step.times) >= 0) and step.times[0] >= 0.0
    assert step.times[-1] <= duration
    assert step.shapes is not None
    assert {s.items for s in step.shapes} <= set(range(1, len(times) + 1))
    np.testing.assert_array_equal(trace_overlaid(trace, rate, duration, seed).times, step.times)


def test_overlaid_copies_keep_a_bursts_length_where_a_sped_up_trace_shortens_it() -> None:
    """A trace of 1 req/s for an hour with a burst of 60 requests in its 1,000th second,
    brought to 100 req/s: 100 copies overlaid, each burst still lasts a second, so no
    15 ms holds more than a few requests; sped up 100 times, the burst passes in 10 ms."""
    from ridgeline.loadgen.schedule import trace_at_rate, trace_overlaid

    steady = np.arange(0.0, 3600.0)
    burst = 1000.0 + np.arange(60) / 60.0
    trace = Trace.from_times(np.sort(np.concatenate([steady, burst])))
    duration = 3660 / 100.0  # as many requests as the trace holds
    overlaid = trace_overlaid(trace, 100.0, duration, seed=3)
    sped = trace_at_rate(trace, 100.0, duration)

    def most_in_15ms(times: np.ndarray) -> int:  # 5 ms bins, three at a time
        counts = np.histogram(times, np.arange(0.0, duration + 0.01, 0.005))[0]
        return int((counts[:-2] + counts[1:-1] + counts[2:]).max())

    assert most_in_15ms(sped.times) >= 59  # the burst, within 10 ms
    assert most_in_15ms(overlaid.times) <= 12
    assert "98 copies overlaid" in overlaid.description  # its mean: 1.02 req/s
