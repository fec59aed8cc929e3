"""Synchronisation for tests that must hold on a busy host: wait for a condition with a
deadline (never a fixed sleep), read a process's output until a line appears, and run a
load generator in its own process, apart from the event loop of the server it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import IO

from ridgeline.loadgen.schedule import Schedule
from ridgeline.loadgen.step import StepConfig, StepResult, measure_step

POLL_S = 0.01


def wait_until(predicate: Callable[[], bool], timeout: float, what: str = "") -> None:
    """Return as soon as ``predicate()`` holds; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}")
        time.sleep(POLL_S)


async def await_until(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float, what: str = ""
) -> None:
    """``wait_until`` inside an event loop: the loop keeps running while it polls."""
    deadline = time.monotonic() + timeout
    while True:
        held = predicate()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}")
        await asyncio.sleep(POLL_S)


class LineReader:
    """Lines of a pipe (a child's stdout or stderr), read on a thread and kept, so a test
    can wait for one to appear and still read the whole output afterwards."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(pipe,), daemon=True)
        self._thread.start()

    def _pump(self, pipe: IO[str]) -> None:
        with pipe:  # closed at its end, as communicate() would
            for line in pipe:
                self.lines.append(line)
                self._new.put(line)
        self._new.put(None)

    def wait_for(self, needle: str, timeout: float) -> str:
        """The first line (from now on) that contains ``needle``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._new.get(timeout=max(0.0, left))
            except queue.Empty:
                line = None
                left = 0.0
            if line is not None and needle in line:
                return line
            if line is None:
                raise AssertionError(
                    f"no line with {needle!r} within {timeout:g} s; got:\n{''.join(self.lines)}"
                )

    def text(self) -> str:
        """All output, once the pipe is closed (the process has exited)."""
        self._thread.join(timeout=30)
        return "".join(self.lines)


def watch(proc: subprocess.Popen[str]) -> tuple[LineReader, LineReader]:
    """Readers for a child started with ``stdout=PIPE, stderr=PIPE, text=True``."""
    assert proc.stdout is not None and proc.stderr is not None
    return LineReader(proc.stdout), LineReader(proc.stderr)


@contextlib.contextmanager
def running(cmd: list[str]) -> Iterator[LineReader]:
    """``cmd`` (a server) in its own process, unbuffered; its stdout's reader until the
    block ends, then SIGINT and its exit (killed if it takes over a minute)."""
    with running_process(cmd) as (_, stdout):
        yield stdout


@contextlib.contextmanager
def running_process(cmd: list[str]) -> Iterator[tuple[subprocess.Popen[str], LineReader]]:
    """``running``, yielding the process too (its pid, to read its memory)."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        stdout, _ = watch(proc)
        yield proc, stdout
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def _measure(url: str, schedule: Schedule, cfg: StepConfig) -> StepResult:
    return asyncio.run(measure_step(url, schedule, cfg))


async def measure_apart(url: str, schedule: Schedule, cfg: StepConfig | None = None) -> StepResult:
    """One step measured by a generator in its own process with its own event loop: a
    server running in this loop cannot delay the generator's sends (and so make the step
    invalid), and the generator cannot slow the server it measures."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, _measure, url, schedule, cfg or StepConfig())
