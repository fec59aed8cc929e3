"""``Records.merge``: shards ordered by scheduled time, each request with its own gaps."""

from __future__ import annotations

import numpy as np
import pytest

from ridgeline.telemetry.records import Outcome, Records, gaps_from

pytestmark = pytest.mark.timeout(60)


def _shard(rng: np.random.Generator, n: int, gappy: bool) -> tuple[Records, list[list[float]]]:
    rec = Records.empty(rng.choice(np.arange(0.0, 5.0, 0.25), n))  # ties across shards
    rec.sent[:] = rec.scheduled + rng.uniform(0, 0.01, n)
    rec.done[:] = rec.sent + rng.uniform(0.01, 0.1, n)
    rec.first_token[:] = rec.sent + 0.005
    rec.outcome[:] = rng.choice([int(Outcome.OK), int(Outcome.ERROR)], n)
    rec.output_tokens[:] = rng.integers(0, 9, n)
    rec.prompt_tokens[:] = rng.integers(1, 99, n)
    gaps = [rng.uniform(0, 1, rng.integers(0, 5)).tolist() if gappy else [] for _ in range(n)]
    rec.gaps, rec.gap_start = gaps_from(gaps)
    rec.errors = {"boom": int(rng.integers(1, 5))}
    return rec, gaps


@pytest.mark.parametrize("gappy", [True, False])
def test_merge_orders_requests_with_their_gaps(gappy: bool) -> None:
    rng = np.random.default_rng(2031)
    shards = [_shard(rng, n, gappy) for n in (37, 0, 52, 11)]
    merged = Records.merge([rec for rec, _ in shards])
    # first principles: every request as a row, shard after shard, then a stable sort
    rows = [
        (float(rec.scheduled[i]), float(rec.done[i]), int(rec.outcome[i]), gaps[i])
        for rec, gaps in shards
        for i in range(len(rec))
    ]
    rows.sort(key=lambda row: row[0])
    assert len(merged) == len(rows) == 100
    assert merged.scheduled.tolist() == [r[0] for r in rows]
    assert merged.done.tolist() == [r[1] for r in rows]
    assert merged.outcome.tolist() == [r[2] for r in rows]
    assert [merged.gaps_of(i).tolist() for i in range(len(merged))] == [r[3] for r in rows]
    assert merged.gap_start.tolist() == np.cumsum([0, *(len(r[3]) for r in rows)]).tolist()
    assert merged.gaps.dtype == np.float64 and merged.gap_start.dtype == np.int64
    assert merged.errors == {"boom": sum(rec.errors["boom"] for rec, _ in shards)}


def test_merge_of_nothing_but_empty_shards() -> None:
    empty = Records.empty(np.empty(0))
    merged = Records.merge([empty, empty])
    assert len(merged) == 0 and merged.gap_start.tolist() == [0] and merged.gaps.size == 0
