"""Token metrics on known token timings: TTFT from schedule and from send, vLLM's pooled
ITL against the per-request TPOT, tokens/s, goodput and the windows they fall in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from _cli import ridgeline
from ridgeline.fakeserver import running_in_process
from ridgeline.health import parse_slo
from ridgeline.report import summary_table, write_report
from ridgeline.synthetic.model import LatencyModel
from ridgeline.telemetry.records import Outcome, Records, gaps_from
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import gap_statistic, good, summarize, with_goodput
from ridgeline.telemetry.windows import windows

FAST, SLOW = 0.001, 0.040


def streamed(
    rows: list[tuple[float, float, float, list[float], int]],
    outcome: list[Outcome] | None = None,
) -> Records:
    """One request per row: (scheduled, sent, first token, gaps, prompt tokens); output
    tokens are one more than the gaps, done is the last chunk."""
    rec = Records.empty(np.array([r[0] for r in rows]))
    rec.sent[:] = [r[1] for r in rows]
    rec.first_token[:] = [r[2] for r in rows]
    rec.done[:] = [r[2] + sum(r[3]) for r in rows]
    rec.output_tokens[:] = [len(r[3]) + 1 for r in rows]
    rec.prompt_tokens[:] = [r[4] for r in rows]
    rec.outcome[:] = [int(o) for o in outcome or [Outcome.OK] * len(rows)]
    rec.gaps, rec.gap_start = gaps_from([r[3] for r in rows])
    return rec


def two_requests() -> Records:
    """One answer of 10 fast gaps (1 ms) and one of 2 slow ones (40 ms)."""
    return streamed(
        [
            (0.000, 0.001, 0.010, [FAST] * 10, 100),
            (0.100, 0.100, 0.105, [SLOW] * 2, 50),
        ]
    )


def test_pooled_itl_is_every_gap_and_tpot_one_value_per_request() -> None:
    s = summarize(two_requests(), 1.0, valid=True, invalid_reason=None)
    assert s.itl_ms is not None and s.tpot_ms is not None
    # 12 gaps pooled: 10 of 1 ms, 2 of 40 ms; the median is a fast gap, the p90 a slow one
    assert s.itl_ms.p50 == 1.0
    assert s.itl_ms.p90 == pytest.approx(40.0, rel=1e-3)
    assert s.itl_ms.mean == pytest.approx((10 * 1.0 + 2 * 40.0) / 12)
    # one TPOT per request: (e2e − ttft)/(tokens − 1) = 1 ms and 40 ms, mean 20.5 ms
    assert s.tpot_ms.p50 == 1.0
    assert s.tpot_ms.max == pytest.approx(40.0, rel=1e-3)
    assert s.tpot_ms.mean == pytest.approx(20.5)


def test_a_request_that_timed_out_before_its_first_token_counts_in_ttft_at_its_timeout() -> None:
    rec = streamed(
        [(0.0, 0.0, 0.010, [FAST], 10), (0.1, 0.1, np.nan, [], 10)],
        [Outcome.OK, Outcome.TIMEOUT],
    )
    rec.done[1] = 0.1 + 30.0  # given up on after 30 s, never a token
    s = summarize(rec, 1.0, valid=True, invalid_reason=None)
    assert s.ttft_ms is not None
    assert s.ttft_ms.max == pytest.approx(30_000.0, rel=1e-3)  # not left out of the tail
    assert s.ttft_ms.p50 == pytest.approx(10.0, rel=1e-3)
    assert s.error_rate == 0.5


def test_ttft_is_timed_from_the_schedule_and_from_the_send_apart() -> None:
    s = summarize(two_requests(), 1.0, valid=True, invalid_reason=None)
    assert s.ttft_ms is not None and s.ttft_from_send_ms is not None
    # 5 ms and 10 ms from the schedule; the first went out 1 ms late: 9 ms from its send
    assert (s.ttft_ms.p50, s.ttft_ms.max) == pytest.approx((5.0, 10.0), rel=1e-3)
    assert (s.ttft_from_send_ms.p50, s.ttft_from_send_ms.max) == pytest.approx((5.0, 9.0), rel=1e-3)


def test_tokens_per_second_count_the_successful_requests_only() -> None:
    rec = streamed(
        [
            (0.0, 0.0, 0.01, [FAST] * 3, 100),
            (0.1, 0.1, 0.11, [FAST] * 9, 30),
            (0.2, 0.2, 0.21, [FAST], 7),
        ],
        [Outcome.OK, Outcome.OK, Outcome.ERROR],
    )
    s = summarize(rec, 2.0, valid=True, invalid_reason=None)
    assert (s.input_tokens_per_s, s.output_tokens_per_s) == (65.0, 7.0)


def test_a_step_without_streamed_answers_has_no_token_metrics() -> None:
    rec = Records.empty(np.array([0.0, 0.5]))
    rec.sent[:] = rec.done[:] = [0.0, 0.5]
    rec.outcome[:] = int(Outcome.OK)
    s = summarize(rec, 1.0, valid=True, invalid_reason=None)
    assert (s.ttft_ms, s.itl_ms, s.tpot_ms, s.input_tokens_per_s) == (None, None, None, None)


@pytest.mark.parametrize(
    ("slo", "good_ones"),
    [
        ("ttft_p99<8ms", [False, True]),  # TTFT 10 ms and 5 ms
        ("tpot_p99<5ms", [True, False]),  # TPOT 1 ms and 40 ms
        ("itl_p99<5ms", [True, False]),  # each request's own p99 gap: 1 ms and 40 ms
        ("itl_max<50ms", [True, True]),
        ("p99<50ms", [True, False]),  # e2e: 20 ms and 85 ms
        ("e2e_p50<100ms,ttft_p99<20ms,itl_mean<2ms", [True, False]),
    ],
)
def test_a_request_is_good_when_it_meets_every_bound_on_its_own_values(
    slo: str, good_ones: list[bool]
) -> None:
    assert good(two_requests(), parse_slo(slo).latency).tolist() == good_ones


def test_a_failed_request_is_never_good_and_goodput_is_good_per_second() -> None:
    rec = streamed(
        [(0.0, 0.0, 0.001, [FAST], 1), (0.5, 0.5, 0.501, [FAST], 1)],
        [Outcome.OK, Outcome.ERROR],
    )
    s = with_goodput(
        summarize(rec, 0.5, valid=True, invalid_reason=None),
        rec,
        parse_slo("ttft_p99<1s").latency,
    )
    assert (s.good, s.goodput_rps, s.achieved_rps) == (1, 2.0, 2.0)


def test_a_request_without_a_first_token_fails_a_ttft_bound_but_not_a_tpot_one() -> None:
    rec = Records.empty(np.array([0.0]))
    rec.sent[:] = [0.0]
    rec.done[:] = [0.01]
    rec.outcome[:] = int(Outcome.OK)
    assert good(rec, parse_slo("ttft_p99<1s").latency).tolist() == [False]
    assert good(rec, parse_slo("tpot_p99<1ms,itl_p99<1ms").latency).tolist() == [True]


def test_windows_attribute_every_gap_to_the_window_its_request_was_scheduled_in() -> None:
    wins = windows(two_requests(), 0.2, width_s=0.05)
    # the slow request is scheduled at 0.100 and its gaps run to 0.185, in window 3
    itl = [w.itl_ms.max if w.itl_ms else None for w in wins]
    assert itl[0] == 1.0 and itl[1] is None and itl[3] is None
    assert itl[2] == pytest.approx(40.0, rel=1e-3)
    ttft = [w.ttft_ms.p50 if w.ttft_ms else 0.0 for w in wins]
    assert ttft == pytest.approx([10.0, 0.0, 5.0, 0.0], rel=1e-3)
    assert wins[2].tpot_ms is not None and wins[2].tpot_ms.p50 == pytest.approx(40.0, rel=1e-3)


@given(
    st.lists(st.lists(st.floats(1e-4, 1.0, allow_nan=False), max_size=12), min_size=1, max_size=8),
    st.sampled_from(["p50", "p90", "p99", "max", "mean"]),
)
def test_the_per_request_gap_statistic_is_each_requests_own(
    per_request: list[list[float]], stat: str
) -> None:
    rec = streamed([(float(i), float(i), float(i), g, 1) for i, g in enumerate(per_request)])
    got = gap_statistic(rec, stat)
    for i, g in enumerate(per_request):
        if not g:
            assert np.isnan(got[i])
        elif stat == "mean":
            assert got[i] == pytest.approx(sum(g) / len(g))
        else:
            q = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}[stat]
            rank = max(int(np.ceil(q * len(g) - 1e-9)), 1)  # nearest rank
            assert got[i] == sorted(g)[rank - 1]


def test_the_store_keeps_prompt_tokens_and_gaps_per_request(tmp_path: Path) -> None:
    rec = two_requests()
    with RunStore(tmp_path / "r.sqlite") as store:
        run = store.create_run("run", "t", {})
        s = summarize(rec, 1.0, valid=True, invalid_reason=None)
        step = store.add_step(run, 0, s, [], rec)
        back = store.records(step)
    assert back.prompt_tokens.tolist() == [100, 50]
    assert back.gap_start.tolist() == [0, 10, 12]
    np.testing.assert_allclose(back.gaps, rec.gaps, rtol=1e-6)  # float32 on disk
    itl = summarize(back, 1.0, valid=True, invalid_reason=None).itl_ms
    assert itl is not None and s.itl_ms is not None
    assert (itl.p50, itl.p99) == (s.itl_ms.p50, s.itl_ms.p99)


def test_run_json_shows_the_token_metrics_and_goodput_against_the_fake_llm_server(
    tmp_path: Path,
) -> None:
    """A real streaming server on loopback: 20 ms to the first token, a token every 5 ms;
    ``run --slo`` counts goodput, and ITL (every gap) reads the server's 5 ms."""
    model = LatencyModel(base_ms=1.0, per_item_ms=0.0, ttft_ms=20.0, per_token_ms=5.0)
    with running_in_process(model, grpc_port=None) as srv:
        url = srv.http_url.replace("http://", "openai+http://") + "/v1"
        res = ridgeline(
            "run", url, "--model", "fake", "--rate", "20", "--duration", "2",
            "--slo", "ttft_p99<10s,itl_p99<1ms", "--json",
            db=tmp_path / "r.sqlite",
        )  # fmt: skip
    assert res.returncode in (0, 3), res.stderr  # 3: the host too busy to judge the step
    s = json.loads(res.stdout)
    assert s["valid"] == (res.returncode == 0)
    assert s["ok"] > 0 and s["errors"] == 0
    assert s["itl_ms"]["p50"] == pytest.approx(5.0, abs=1.5)
    assert s["tpot_ms"]["p50"] == pytest.approx(5.0, abs=1.5)
    assert s["ttft_ms"]["p50"] >= 20.0 and s["ttft_from_send_ms"]["p50"] >= 20.0
    assert s["output_tokens_per_s"] > 0
    assert (s["good"], s["goodput_rps"]) == (0, 0.0)  # no answer's gaps are all under 1 ms


def test_a_stored_streaming_run_shows_its_token_numbers_in_runs_show_and_the_report(
    tmp_path: Path,
) -> None:
    rec = two_requests()
    s = with_goodput(
        summarize(rec, 1.0, valid=True, invalid_reason=None),
        rec,
        parse_slo("ttft_p99<8ms").latency,
    )
    with RunStore(tmp_path / "r.sqlite") as store:
        run_id = store.create_run("run", "openai+http://127.0.0.1:1/v1", {})
        store.add_step(run_id, 0, s, windows(rec, 1.0))
        store.finish_run(run_id, "complete")
        run = store.get_run(run_id)
    console = Console(width=200, record=True)
    console.print(summary_table(run))
    text = console.export_text()
    assert "step 1: goodput" in text and "1.0 req/s within every bound" in text
    assert "step 1: tokens/s" in text and "in 150.0, out 14.0" in text
    assert "step 1: ITL (every gap, pooled)" in text
    page = write_report(run, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<th>ITL p99 ms</th>" in page and "<th>goodput req/s</th>" in page
