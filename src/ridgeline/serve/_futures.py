"""Small helpers for the futures and processes of the worker and decoder pools."""

from __future__ import annotations

import asyncio
import signal
import traceback
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

T = TypeVar("T")


def resolve(future: asyncio.Future[T] | None, value: T) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def fail(future: asyncio.Future[Any] | None, error: BaseException) -> None:
    if future is not None and not future.done():
        future.set_exception(error)


def retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's error as seen though its awaiter may be gone (no asyncio warning)."""
    if not future.cancelled():
        future.exception()


def exit_text(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = " (often the kernel's out-of-memory killer: check memory)" if name == "SIGKILL" else ""
    return f"exit code {code}, killed by {name}{hint}"


def error_text(error: BaseException) -> str:
    """``Type: message (at file:line)``, where it was raised."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


async def end_process(process: BaseProcess, exited: asyncio.Future[Any], timeout_s: float) -> None:
    """Wait ``timeout_s`` for a process asked to exit, then terminate it, then kill it a
    second later; ``exited`` resolves when it has gone."""
    for stop in (None, process.terminate, process.kill):
        if stop is not None:
            stop()
        done, _ = await asyncio.wait([exited], timeout=timeout_s if stop is None else 1.0)
        if done:
            return
    await asyncio.shield(exited)
