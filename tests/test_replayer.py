"""The open-loop replayer against in-process targets (real time, loopback-free)."""

from __future__ import annotations

import asyncio

import numpy as np

from ridgeline.loadgen.replayer import Progress, ReplayConfig, replay
from ridgeline.loadgen.validity import ValidityConfig, assess_validity
from ridgeline.targets.base import OK, Reply
from ridgeline.telemetry.records import Outcome
from ridgeline.workload.payloads import RequestShape


class Fn:
    """A minimal in-process target around an async function."""

    def __init__(self, fn):  # type: ignore[no-untyped-def]
        self.fn = fn
        self.seen: list[RequestShape] = []

    async def connect(self, max_outstanding: int) -> None:
        return None

    async def send(self, shape: RequestShape) -> Reply:
        self.seen.append(shape)
        return await self.fn(shape)  # type: ignore[no-any-return]

    async def close(self) -> None:
        return None


async def ok(shape: RequestShape) -> Reply:
    return OK


def answering_after(seconds: float) -> Fn:
    """A target that answers OK ``seconds`` after each request."""

    async def answer(shape: RequestShape) -> Reply:
        await asyncio.sleep(seconds)
        return OK

    return Fn(answer)


def even(n: int, rate: float) -> np.ndarray:
    return np.arange(n, dtype=np.float64) / rate


async def test_every_request_is_sent_once_in_order_with_its_shape() -> None:
    shapes = [RequestShape(items=i % 3 + 1, prompt_tokens=i) for i in range(500)]
    target = Fn(ok)
    rec = await replay(target, even(500, 2000.0), shapes)
    assert rec.count(Outcome.OK) == 500
    assert [s.prompt_tokens for s in target.seen] == list(range(500))
    sent = rec.sent
    assert np.all(np.diff(sent) >= 0)
    assert np.all(rec.lateness >= 0)
    assert np.all(rec.done >= rec.sent)


async def test_latency_is_timed_from_the_schedule_and_from_the_send() -> None:
    rec = await replay(answering_after(0.02), even(50, 500.0))
    assert np.all(rec.latency_from_send >= 0.02)
    assert np.all(rec.latency_from_schedule >= rec.latency_from_send)
    np.testing.assert_allclose(
        rec.latency_from_schedule - rec.latency_from_send, rec.lateness, atol=1e-12
    )


async def test_exceptions_and_error_replies_are_errors_kept_in_latency() -> None:
    async def flaky(shape: RequestShape) -> Reply:
        if shape.items == 2:
            raise ConnectionResetError("peer went away")
        if shape.items == 3:
            return Reply(ok=False, error="HTTP 500: boom")
        if shape.items == 4:
            return Reply(ok=False, dropped=True, error="dropped: cannot meet SLO")
        return OK

    shapes = [RequestShape(items=i % 4 + 1) for i in range(400)]
    rec = await replay(Fn(flaky), even(400, 4000.0), shapes)
    assert rec.count(Outcome.OK) == 100
    assert rec.count(Outcome.ERROR) == 200
    assert rec.count(Outcome.DROPPED) == 100
    assert rec.errors == {"ConnectionResetError: peer went away": 100, "HTTP 500: boom": 100}
    assert np.isfinite(rec.latency_from_schedule).all()


async def test_a_request_that_never_answers_times_out_and_counts() -> None:
    rec = await replay(answering_after(10), even(20, 200.0), config=ReplayConfig(timeout_s=0.05))
    assert rec.count(Outcome.TIMEOUT) == 20
    lat = rec.latency_from_send
    assert lat.min() >= 0.05
    assert lat.max() < 0.05 + 0.1
    assert rec.errors == {"timeout after 0.05 s": 20}


async def test_stop_marks_unsent_and_incomplete_requests() -> None:
    """A stop set as the 200th request goes out (a condition, not a timer: beside a busy
    loop a 0.2 s timer fired after 452 sends): those sent are incomplete, the rest
    unsent, and the step is invalid as interrupted."""
    stop = asyncio.Event()
    calls = 0

    async def answer(shape: RequestShape) -> Reply:
        nonlocal calls
        calls += 1
        if calls == 200:
            stop.set()
        await asyncio.sleep(5)
        return OK

    progress = Progress()
    rec = await replay(
        Fn(answer),
        even(1000, 1000.0),
        config=ReplayConfig(drain_s=0.05),
        stop=stop,
        progress=progress,
    )
    sent = rec.count(Outcome.INCOMPLETE)
    assert 200 <= sent < 1000
    assert rec.count(Outcome.NOT_SENT) == 1000 - sent
    assert progress.stopped
    valid, reason = assess_validity(rec, ValidityConfig(), interrupted=True)
    assert not valid
    assert reason is not None and reason.startswith("interrupted")


async def test_sends_that_fall_due_while_behind_are_issued_late_not_skipped() -> None:
    rec = await replay(
        answering_after(0.05), even(200, 1000.0), config=ReplayConfig(max_outstanding=5)
    )
    assert rec.count(Outcome.OK) == 200
    assert rec.outstanding_limited > 0
    # 5 in flight × 50 ms each is 100/s: the last send is ~1.8 s behind its schedule
    assert rec.lateness[-1] > 1.0
    valid, reason = assess_validity(rec, ValidityConfig())
    assert not valid
    assert reason is not None and "outstanding-request limit" in reason
    assert "generator fell behind: its lateness (p99 " in reason
