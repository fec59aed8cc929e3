"""One schedule sharded across N local generator processes that share a start time.

Shard k replays every N-th arrival (k, k+N, ...), so each shard keeps the schedule's
shape at 1/N of its rate. The parent waits until every shard has connected, then gives
them one start instant on CLOCK_MONOTONIC (``time.perf_counter`` is system-wide on
Linux); their records, timed from that same instant, merge exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ridgeline.errors import RidgelineError, TargetError
from ridgeline.loadgen.replayer import Progress, ReplayConfig, replay
from ridgeline.targets.options import TargetOptions
from ridgeline.telemetry.records import Records
from ridgeline.workload.payloads import RequestShape

_START_LEAD_S = 0.25


@dataclass(frozen=True, slots=True, eq=False)
class Sending:
    """Requests for one target: each one's send time (from a start given later) and
    size, and how they are replayed. A generator process or Ray worker is given its
    share as one value (it pickles)."""

    url: str
    options: TargetOptions
    times: NDArray[np.float64]
    shapes: Sequence[RequestShape] | None
    cfg: ReplayConfig

    def shares(self, n: int) -> list[Sending]:
        """Cut ``n`` ways: share k is every n-th arrival from the k-th (k, k+n, ...) with
        its sizes, so each keeps the schedule's shape at 1/n of its rate; the in-flight
        bound is split between them."""
        cfg = self.cfg.model_copy(update={"max_outstanding": max(1, self.cfg.max_outstanding // n)})
        shapes = self.shapes
        return [
            replace(
                self,
                times=self.times[k::n],
                shapes=None if shapes is None else list(shapes[k::n]),
                cfg=cfg,
            )
            for k in range(n)
        ]


def _shard_main(conn: Connection, share: Sending) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    from ridgeline.aio import run_coroutine
    from ridgeline.targets.factory import make_target

    async def main() -> Records | None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        target = make_target(share.url, share.options)
        try:
            await target.connect(share.cfg.max_outstanding)
            conn.send(("ready", None))
            msg, start_at = await loop.run_in_executor(None, conn.recv)
            if msg != "start":
                return None

            def watch() -> None:
                try:
                    if conn.recv()[0] == "stop":
                        loop.call_soon_threadsafe(stop.set)
                except (EOFError, OSError):
                    loop.call_soon_threadsafe(stop.set)

            threading.Thread(target=watch, daemon=True).start()
            return await replay(
                target, share.times, share.shapes, share.cfg, start_at=start_at, stop=stop
            )
        finally:
            await target.close()

    try:
        rec = run_coroutine(main())
        conn.send(("records", rec))
    except RidgelineError as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    except Exception as exc:
        conn.send(("error", f"generator process failed: {type(exc).__name__}: {exc}"))


async def replay_sharded(
    sending: Sending,
    processes: int,
    *,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
) -> Records:
    """Replay ``sending`` from ``processes`` local processes, each its share, from one
    start; their records merged."""
    loop = asyncio.get_running_loop()
    ctx = mp.get_context("spawn")
    conns: list[Connection] = []
    procs = []
    for share in sending.shares(processes):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_shard_main, args=(child, share), daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    try:
        hellos = await asyncio.gather(*(loop.run_in_executor(None, c.recv) for c in conns))
        failed = [m for kind, m in hellos if kind != "ready"]
        if failed:
            for c in conns:
                with contextlib.suppress(OSError):  # a shard that failed may be gone already
                    c.send(("abort", None))
            raise TargetError(f"a generator process could not start: {failed[0]}")
        start_at = time.perf_counter() + _START_LEAD_S
        for c in conns:
            c.send(("start", start_at))
        if progress is not None:
            progress.total = int(sending.times.shape[0])
        results = asyncio.gather(*(loop.run_in_executor(None, c.recv) for c in conns))
        if stop is not None:
            stopper: asyncio.Future[Any] = loop.create_task(stop.wait())
            waiting: list[asyncio.Future[Any]] = [results, stopper]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                for c in conns:
                    with contextlib.suppress(OSError):
                        c.send(("stop", None))
            stopper.cancel()
        parts = await results
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        for c in conns:
            c.close()
    errors = [m for kind, m in parts if kind != "records"]
    if errors:
        raise TargetError(errors[0])
    merged = Records.merge([rec for _, rec in parts])
    if progress is not None:
        progress.sent = progress.answered = len(merged)
    return merged
