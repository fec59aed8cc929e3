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
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
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


class LoopLag:
    """How late this event loop runs what is ready: a timer every ``interval_s``, how much
    later than asked it fired, over the last ``window`` ticks. A request waits about
    that long for the loop before its handler sees it, and again before its answer is
    written: time no model of the queues behind the handler can see (``serve`` keeps a
    low quantile of it back from every drop deadline). Measured on the loop's own clock:
    it is the loop's real lateness, whatever clock the code it runs decides by."""

    def __init__(self, interval_s: float = 0.005, window: int = 400) -> None:
        self.interval_s = interval_s
        self._lags: deque[float] = deque(maxlen=window)
        self._ticks = 0
        self._cached: tuple[int, float, float] = (-1, 0.0, 0.0)
        """(ticks, q, quantile): the last answer, until the next tick."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @property
    def samples(self) -> int:
        """Ticks measured and kept (at most ``window``)."""
        return len(self._lags)

    def quantile(self, q: float = 0.99) -> float:
        """The ``q`` quantile of the recent lateness, s (0 before any tick)."""
        if not self._lags:
            return 0.0
        ticks, at, value = self._cached
        if ticks == self._ticks and at == q:  # every request asks; the lags move per tick
            return value
        ordered = sorted(self._lags)
        value = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
        self._cached = (self._ticks, q, value)
        return value

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self._lags.append(max(0.0, loop.time() - asked))
            self._ticks += 1


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


async def cancelled_on_signal(coro: Coroutine[Any, Any, T], got: list[int]) -> T:
    """Await ``coro``; SIGINT or SIGTERM cancels it, the signal appended to ``got``.
    Handled on the loop, so it holds whatever the process inherited: a process started
    from a shell's background job has SIGINT ignored, and Python's KeyboardInterrupt
    never comes (`timeout`, systemd and Kubernetes stop a process with SIGTERM)."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None

    def on(sig: int) -> None:
        got.append(sig)
        task.cancel()

    signals = STOP_SIGNALS
    for sig in signals:
        loop.add_signal_handler(sig, on, sig)
    try:
        return await coro
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""What stops every long-running command: Ctrl-C, and what `timeout`, systemd and
Kubernetes send."""


def signal_name(got: list[int]) -> str:
    """How a stop is told to the user: ``Ctrl-C``, ``SIGTERM``, or ``a signal``."""
    if not got:
        return "a signal"
    return "Ctrl-C" if got[-1] == signal.SIGINT else signal.Signals(got[-1]).name


@contextlib.contextmanager
def stopping_on_signal(stop: asyncio.Event, got: list[int] | None = None) -> Iterator[None]:
    """While the block runs, SIGINT or SIGTERM sets ``stop`` (the signal appended to
    ``got``): the one way a measuring command stops sending, keeps what it measured and
    marks its run. Handled on the running loop, so it holds whatever the process
    inherited (see ``cancelled_on_signal``); outside a main thread, nothing is handled."""
    loop = asyncio.get_running_loop()
    seen = got if got is not None else []

    def on(sig: int) -> None:
        seen.append(sig)
        stop.set()

    installed = []
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on, sig)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM wait; after it, each that came goes to the
    handler it would have gone to (in the main thread only; elsewhere nothing is held).
    Around a process's ``start()``: a stop there interrupted the parent between spawning
    the child and handing it its instructions, and the child, reading a pipe left half
    written, printed a traceback of its own beside the command's one ``error:`` line
    (`profile` stopped by SIGTERM, 1 run of the suite's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for came in got:
            handler = before[signal.Signals(came)]
            if callable(handler):
                handler(came, None)
            elif handler in (signal.SIG_DFL, None):
                signal.raise_signal(came)


def stop_on_signal() -> asyncio.Event:
    """An event set when the process gets SIGINT or SIGTERM (handled on the running loop
    from now on)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
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
