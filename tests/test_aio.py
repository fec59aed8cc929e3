"""The event-loop foundation: waiting on an event never loses a caller's cancellation."""

from __future__ import annotations

import asyncio
import signal

import pytest

from _timing import await_until
from ridgeline.aio import LoopLag, signals_held, wait_event


async def test_a_cancel_that_lands_as_the_event_is_set_is_not_lost() -> None:
    """Ctrl-C cancels the main task; if that lands in the loop turn in which the awaited
    event is set, ``asyncio.wait_for`` on Python 3.11 returns the result and the cancel is
    gone (a demo interrupted in its profiling stage ran to its end and exited 0)."""
    event = asyncio.Event()
    waiting = asyncio.create_task(wait_event(event, 10.0))
    await asyncio.sleep(0)  # it is waiting now
    event.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_it_says_whether_the_event_came_or_the_time_ran_out() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 10.0) is True


async def test_loop_lag_sees_a_loop_that_was_held() -> None:
    """A callback that holds the loop 50 ms makes the next tick that late."""
    import time

    lag = LoopLag(interval_s=0.002, window=50)
    lag.start()
    try:
        await asyncio.sleep(0.02)  # some ticks on an idle loop
        time.sleep(0.05)  # hold the loop, as a slow handler would
        ticks = lag.samples
        await await_until(lambda: lag.samples > ticks, timeout=5)
    finally:
        await lag.stop()
    assert lag.quantile(1.0) >= 0.04
    assert lag.quantile(0.0) < 0.04


def test_a_stop_while_signals_are_held_reaches_its_handler_after_the_block() -> None:
    """``signals_held`` (around a worker's start): SIGTERM and Ctrl-C sent inside the block
    reach their handlers only once it ends, each once; the handlers are as before."""
    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    # Python's own Ctrl-C handler, whatever this process inherited (a suite started in the
    # background of a non-interactive shell, as make test-busy's was, ignores SIGINT)
    before_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with signals_held():
            signal.raise_signal(signal.SIGTERM)  # to this thread, before it returns
            inside = list(seen)
        assert (inside, seen) == ([], [signal.SIGTERM])
        with pytest.raises(KeyboardInterrupt), signals_held():
            signal.raise_signal(signal.SIGINT)
            seen.append(0)  # the block ran on
        assert seen == [signal.SIGTERM, 0]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, before_int)
