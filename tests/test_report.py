"""The HTML report and terminal summary, from runs written into a real run store."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from ridgeline.errors import ConfigError, StoreError
from ridgeline.health.state import HealthState
from ridgeline.report import PROBE_FIGURES, RUN_FIGURES, summary_table, write_report
from ridgeline.report._view import view_of
from ridgeline.report.figures import COLOURS, health_timeline, throughput_vs_rate, trajectory
from ridgeline.search.base import CapacityEstimate, StepVerdict
from ridgeline.telemetry.records import Outcome, Records
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows

OK_, WARN, BAD, OVER = (
    HealthState.HEALTHY,
    HealthState.WARN,
    HealthState.UNHEALTHY,
    HealthState.OVERLOADED,
)


def step_records(rate: float, duration_s: float, latency_s: float, timeouts: int = 0) -> Records:
    """Requests at a constant ``rate``, each answered after ``latency_s``; the last
    ``timeouts`` of them given up on after 1 s instead."""
    sched = np.arange(int(rate * duration_s)) / rate
    rec = Records.empty(sched)
    rec.sent[:] = sched
    rec.done[:] = sched + latency_s
    rec.outcome[:] = int(Outcome.OK)
    if timeouts:
        rec.done[-timeouts:] = sched[-timeouts:] + 1.0
        rec.outcome[-timeouts:] = int(Outcome.TIMEOUT)
    return rec


# (purpose, rate, duration, latency, timeouts, excluded windows, window states, verdict)
PROBE_STEPS: list[tuple[str, float, float, float, int, int, list[HealthState], HealthState]] = [
    ("bracket", 50.0, 4.0, 0.010, 0, 1, [OK_, OK_, OK_], OK_),
    ("bracket", 100.0, 4.0, 0.030, 0, 0, [OK_, WARN, WARN, WARN], WARN),
    ("bisect", 150.0, 4.0, 0.200, 120, 0, [WARN, BAD, OVER, OVER], OVER),
    ("confirm", 100.0, 6.0, 0.030, 0, 0, [WARN] * 6, WARN),
]


def write_probe(store: RunStore) -> int:
    """A probe as the orchestrator stores it: a warmup step (every window excluded),
    then search steps whose windows carry state and score, then the summary."""
    run_id = store.create_run("probe", "http://127.0.0.1:8000/v2/models/m", {"slo": "p99<100ms"})
    warm = step_records(10.0, 2.0, 0.050)
    wins = windows(warm, 2.0)
    for w in wins:
        w.excluded = True
    store.add_step(run_id, 0, summarize(warm, 2.0, valid=True, invalid_reason=None), wins)
    t, timeline, verdicts = 2.0, [], []
    for k, (purpose, rate, dur, lat, outs, skip, states, verdict) in enumerate(PROBE_STEPS, 1):
        rec = step_records(rate, dur, lat, outs)
        summary = summarize(rec, dur, valid=True, invalid_reason=None)
        wins = windows(rec, dur)
        for w in wins[:skip]:
            w.excluded = True
        for w, state in zip(wins[skip:], states, strict=True):
            w.state, w.score = state.value, 0.5 if state.sustainable else 1.5
            timeline.append(
                {
                    "t_s": t + w.start_s,
                    "step": k,
                    "state": state.value,
                    "score": w.score,
                    "reason": "",
                }
            )
        store.add_step(run_id, k, summary, wins)
        verdicts.append(
            StepVerdict(
                rate=rate,
                duration_s=dur,
                state=verdict,
                score=0.5 if verdict.sustainable else 1.5,
                achieved_rps=summary.achieved_rps,
                p99_ms=summary.latency_ms.p99,
                excluded_warmup_s=float(skip),
                purpose=purpose,
                reason="" if verdict.sustainable else "p99 over its bound",
            )
        )
        t += dur
    estimate = CapacityEstimate(
        capacity_rps=100.0,
        ci_low=95.0,
        ci_high=120.0,
        strategy="adaptive",
        steps=4,
        test_seconds=18.0,
        converged=True,
        trajectory=tuple(verdicts),
    )
    summary_out: dict[str, Any] = asdict(estimate) | {
        "warmup_excluded_s": 3.0,
        "valid": True,
        "confirmed": True,
        "slo": "p99<100ms,errors<1%",
        "run_id": run_id,
        "health_timeline": timeline,
    }
    store.finish_run(run_id, "complete", None, summary_out)
    return run_id


def write_plain_run(store: RunStore) -> int:
    rec = step_records(40.0, 3.0, 0.020)
    run_id = store.create_run("run", "null://", {"rate": 40})
    store.add_step(
        run_id, 0, summarize(rec, 3.0, valid=True, invalid_reason=None), windows(rec, 3.0)
    )
    store.finish_run(run_id, "complete", None, None)
    return run_id


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One stored probe, read back once: its histograms are slow to summarise."""
    with RunStore(tmp_path_factory.mktemp("probe") / "runs.sqlite") as store:
        yield store.get_run(write_probe(store))


def text_of(run: dict[str, Any]) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(summary_table(run))
    return console.export_text()


def test_a_probe_report_is_one_self_contained_page_with_every_plot(
    probe_run: dict[str, Any], tmp_path: Path
) -> None:
    path = write_report(probe_run, tmp_path / "out" / "report.html")
    page = path.read_text(encoding="utf-8")
    assert path == tmp_path / "out" / "report.html"
    assert "<script src=" not in page
    assert page.count("Plotly.newPlot(") == len(PROBE_FIGURES)
    assert page.count("plotly.js v") == 1  # the library, inline, once
    for div in PROBE_FIGURES:
        assert f'id="{div}"' in page
    for fact in ("100.0 req/s", "[95.0, 120.0] req/s", "adaptive", "18.0 s", "3.0 s"):
        assert fact in page
    assert "p99&lt;100ms,errors&lt;1%" in page


def test_the_health_timeline_is_in_run_time_with_warmup_shaded(
    probe_run: dict[str, Any],
) -> None:
    fig = health_timeline(view_of(probe_run))
    by_state = {tr.name: list(tr.x) for tr in fig.data}
    # Warmup: 2 s before the search, then the first window of the first search step.
    assert by_state == {
        "warmup": [0.0, 1.0, 2.0],
        "healthy": [3.0, 4.0, 5.0, 6.0],
        "warn": [7.0, 8.0, 9.0, 10.0, *range(14, 20)],
        "unhealthy": [11.0],
        "overloaded": [12.0, 13.0],
    }
    assert [tr.marker.color for tr in fig.data] == [COLOURS[s] for s in by_state]
    shaded = [(s.x0, s.x1) for s in fig.layout.shapes if s.type == "rect"]
    assert shaded == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]


def test_the_trajectory_colours_each_step_by_its_verdict_under_the_estimate_band(
    probe_run: dict[str, Any],
) -> None:
    fig = trajectory(view_of(probe_run))
    marked = {tr.name: (list(tr.x), list(tr.y)) for tr in fig.data if tr.name}
    assert marked == {
        "healthy": ([1], [50.0]),
        "warn": ([2, 4], [100.0, 100.0]),
        "overloaded": ([3], [150.0]),
    }
    band = [(s.y0, s.y1) for s in fig.layout.shapes if s.type == "rect"]
    line = [s.y0 for s in fig.layout.shapes if s.type == "line"]
    assert (band, line) == ([(95.0, 120.0)], [100.0])


def test_the_terminal_summary_carries_the_numbers(probe_run: dict[str, Any]) -> None:
    text = text_of(probe_run)
    for fact in (
        "estimate",
        "100.0 req/s",
        "[95.0, 120.0] req/s",
        "p99<100ms,errors<1%",
        "test-seconds",
        "18.0 s",
        "warmup excluded",
        "3.0 s",
        "search 3 (bisect)",
        "150.0 req/s → overloaded",
    ):
        assert fact in text, fact


def test_a_plain_run_renders_its_windows(store: RunStore, tmp_path: Path) -> None:
    run = store.get_run(write_plain_run(store))
    page = write_report(run, tmp_path / "run.html").read_text(encoding="utf-8")
    assert all(f'id="{d}"' in page for d in RUN_FIGURES)
    assert not any(f'id="{d}"' in page for d in PROBE_FIGURES)
    assert "<script src=" not in page
    text = text_of(run)
    assert "offered 40.0 req/s, achieved 40.0 req/s, p99 20.0" in text


def test_a_probe_stopped_before_its_summary_renders_as_its_steps(
    store: RunStore, tmp_path: Path
) -> None:
    rec = step_records(20.0, 2.0, 0.010)
    run_id = store.create_run("probe", "null://", {})
    store.add_step(
        run_id, 0, summarize(rec, 2.0, valid=True, invalid_reason=None), windows(rec, 2.0)
    )
    page = write_report(store.get_run(run_id), tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'id="throughput-over-time"' in page
    assert "running" in page


def test_a_run_of_another_layout_or_an_unwritable_path_says_what_to_do(
    store: RunStore, tmp_path: Path
) -> None:
    with pytest.raises(StoreError, match=r"RunStore\.get_run"):
        write_report({"id": 1, "kind": "run"}, tmp_path / "x.html")
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = store.get_run(write_plain_run(store))
    with pytest.raises(ConfigError, match="--out"):
        write_report(run, blocker / "x.html")


def test_the_achieved_equals_offered_line_is_drawn_over_the_steps(
    probe_run: dict[str, Any],
) -> None:
    """Where the server keeps up, achieved lies on the reference line: drawn first, the
    line was hidden under the data."""
    fig = throughput_vs_rate(view_of(probe_run))
    *data, reference = fig.data
    assert reference.name == "achieved = offered" and [d.name for d in data] == ["achieved"]
    top = max(max(data[0].x), max(data[0].y))
    assert list(reference.x) == list(reference.y) == [0, top]
