"""The event-loop runner and serve-until-signal, shared by every command that runs a loop.

``AsyncService`` gives a server with ``start``/``stop`` its ``async with``;
``run_coroutine`` runs a coroutine to completion on a fresh event loop (uvloop when
installed); ``serve_until_signal`` runs an async server from start until SIGINT or
SIGTERM, then stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Self, TypeVar

T = TypeVar("T")
S = TypeVar("S")


class AsyncService:
    """A server started by ``await start()`` and stopped by ``await stop()``; ``async
    with`` does both."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop when uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop (uvloop when installed)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` has passed; whether it is set.

    Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancellation that lands as the
    awaited future completes (the result is returned and the cancel lost), so a Ctrl-C
    could be ignored and a run carry on to its end. ``asyncio.timeout`` tells its own
    cancellation from a caller's."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


def stop_on_signal() -> asyncio.Event:
    """An event set when the process gets SIGINT or SIGTERM (handled on the running loop
    from now on)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def serve_until_signal(
    make: Callable[[], AbstractAsyncContextManager[S]], ready: Callable[[S], None]
) -> None:
    """Enter the server ``make()`` builds, call ``ready`` with it once started, serve
    until SIGINT or SIGTERM, then leave it (stopping it). The signals are handled from
    before the server starts, so one sent as soon as ``ready`` has run stops it."""

    async def main() -> None:
        stop = stop_on_signal()
        async with make() as server:
            ready(server)
            await stop.wait()

    run_coroutine(main())
