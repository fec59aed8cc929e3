"""The long-run truth judges token bounds plainly: each bound over its own samples, a
failed request beyond every bound."""

from __future__ import annotations

import numpy as np

from ridgeline.health import parse_slo
from ridgeline.study.truth import broken_records
from ridgeline.telemetry.records import Outcome, Records, gaps_from


def answers(ttft: list[float], gaps: list[list[float]], outcome: list[Outcome]) -> Records:
    rec = Records.empty(np.zeros(len(ttft)))
    rec.sent[:] = 0.0
    rec.first_token[:] = ttft
    rec.done[:] = [t + sum(g) if np.isfinite(t) else 30.0 for t, g in zip(ttft, gaps, strict=True)]
    rec.output_tokens[:] = [len(g) + 1 for g in gaps]
    rec.outcome[:] = [int(o) for o in outcome]
    rec.gaps, rec.gap_start = gaps_from(gaps)
    return rec


OK = Outcome.OK


def test_ttft_p90_counts_a_request_that_timed_out_before_its_first_token_as_beyond() -> None:
    fast = [0.01] * 9
    slo = parse_slo("ttft_p90<50ms")
    assert broken_records(answers([*fast, 0.02], [[0.01]] * 10, [OK] * 10), slo) is None
    # the tenth times out with no token: 9 of 10 within is still 90 %
    timed_out = answers([*fast, np.nan], [[0.01]] * 9 + [[]], [OK] * 9 + [Outcome.TIMEOUT])
    assert broken_records(timed_out, parse_slo("ttft_p90<50ms,errors<20%")) is None
    # two of ten beyond (one slow, one failed): 80 % < 90 %
    two = answers([*fast[:8], 0.2, np.nan], [[0.01]] * 9 + [[]], [OK] * 9 + [Outcome.TIMEOUT])
    assert broken_records(two, parse_slo("ttft_p90<50ms,errors<20%")) == "ttft_p90"


def test_itl_pools_every_gap_so_one_long_answer_outweighs_short_ones() -> None:
    # one answer of 18 fast gaps and two of one slow gap each: 18 of 20 gaps within (90 %)
    rec = answers([0.01] * 3, [[0.001] * 18, [0.1], [0.1]], [OK] * 3)
    assert broken_records(rec, parse_slo("itl_p90<10ms")) is None
    assert broken_records(rec, parse_slo("itl_p95<10ms")) == "itl_p95"
    # per request (TPOT) two of three answers are slow: a TPOT bound breaks
    assert broken_records(rec, parse_slo("tpot_p50<10ms")) == "tpot_p50"


def test_errors_and_e2e_bounds_are_judged_as_before() -> None:
    rec = answers([0.01] * 4, [[0.001]] * 4, [OK, OK, OK, Outcome.ERROR])
    assert broken_records(rec, parse_slo("ttft_p50<1s,errors<10%")) == "errors"
    assert broken_records(rec, parse_slo("p50<1ms,errors<50%")) == "p50"
