"""The event-loop foundation: waiting on an event never loses a caller's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from ridgeline.aio import wait_event


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
