"""The open-loop replayer: sends at scheduled times whatever the responses.

Latency is timed from the *scheduled* send (no coordinated omission) and also from the
actual send, so the two can be compared. Sends that fell due while the generator was
behind are issued at once, never skipped; their lateness (actual − scheduled) is kept.
Timeouts and errors are outcomes of their own and stay in every metric.
"""

from __future__ import annotations

import asyncio
import errno
import math
import time
from collections import deque
from collections.abc import Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from ridgeline.aio import wait_event
from ridgeline.targets.base import Target
from ridgeline.telemetry.records import Outcome, Records, gaps_from
from ridgeline.workload.payloads import DEFAULT_SHAPE, RequestShape

_PENDING = -1
_NAP_S = 0.0001
_SWEEP_S = 0.005
_MAX_ERROR_KINDS = 50


class ReplayConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_outstanding: int = Field(
        10_000, ge=1, description="requests in flight at most; a send waits for a free slot"
    )
    timeout_s: float = Field(30.0, gt=0, description="per-request timeout, from the actual send")
    drain_s: float | None = Field(
        None,
        gt=0,
        description="after a stop, how long to wait for in-flight requests (default: timeout_s)",
    )
    spin_s: float = Field(
        0.0015,
        ge=0,
        le=0.05,
        description="sleep on the event loop's timer until this close to a send, then poll",
    )


@dataclass(slots=True)
class Progress:
    """Counters a display can read while a replay runs."""

    total: int = 0
    sent: int = 0
    answered: int = 0
    failed: int = 0
    outstanding_limited: int = 0
    """Sends that had to wait because ``max_outstanding`` requests were in flight."""
    client_failures: int = 0
    """Requests the generator itself could not make (``client_failure``)."""
    stopped: bool = False


async def replay(
    target: Target,
    scheduled: NDArray[np.float64],
    shapes: Sequence[RequestShape] | None = None,
    config: ReplayConfig | None = None,
    *,
    start_at: float | None = None,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
) -> Records:
    """Replay ``scheduled`` (seconds from the start, sorted) against a connected target.

    ``start_at`` is a ``time.perf_counter()`` instant (shared by generator shards);
    ``stop`` ends sending early: in-flight requests get ``drain_s`` to answer, the rest
    are marked INCOMPLETE and unsent ones NOT_SENT.
    """
    cfg = config or ReplayConfig()
    prog = progress if progress is not None else Progress()
    n = int(scheduled.shape[0])
    prog.total = n
    rec = Records.empty(scheduled)
    if n == 0:
        return rec
    if shapes is not None and len(shapes) != n:
        raise ValueError(f"{len(shapes)} request shapes for {n} scheduled requests")

    loop = asyncio.get_running_loop()
    pc = time.perf_counter
    start = pc() + 0.005 if start_at is None else start_at
    due = (scheduled + start).tolist()
    sent = [math.nan] * n
    done = [math.nan] * n
    outcome = [int(Outcome.NOT_SENT)] * n
    first_token = [math.nan] * n
    tokens = [0] * n
    prompt = [0] * n
    chunk_gaps: dict[int, list[float]] = {}
    errors: dict[str, int] = {}
    tasks: dict[int, asyncio.Task[None]] = {}
    deadlines: deque[tuple[float, int]] = deque()
    slot_free = asyncio.Event()
    all_done = asyncio.Event()
    timeout = cfg.timeout_s
    send = target.send

    def note_error(reason: str) -> None:
        if reason in errors or len(errors) < _MAX_ERROR_KINDS:
            errors[reason] = errors.get(reason, 0) + 1
        else:
            errors["(other)"] = errors.get("(other)", 0) + 1

    def finish(j: int) -> None:
        tasks.pop(j, None)
        prog.answered += 1
        if len(tasks) < cfg.max_outstanding:
            slot_free.set()
        if not tasks:
            all_done.set()

    async def one(j: int, shape: RequestShape) -> None:
        try:
            reply = await send(shape)
        except asyncio.CancelledError:
            return  # a timeout or a stop already recorded this request
        except Exception as exc:  # any transport failure is an error outcome, with its kind
            if outcome[j] == _PENDING:
                done[j] = pc() - start
                outcome[j] = int(Outcome.ERROR)
                prog.failed += 1
                local = client_failure(exc)
                if local is not None:
                    prog.client_failures += 1
                note_error((local or f"{type(exc).__name__}: {exc}")[:200])
                finish(j)
            return
        if outcome[j] != _PENDING:
            return
        done[j] = pc() - start
        if reply.ok:
            outcome[j] = int(Outcome.OK)
        elif reply.dropped:
            outcome[j] = int(Outcome.DROPPED)
        else:
            outcome[j] = int(Outcome.ERROR)
            prog.failed += 1
            note_error((reply.error or "error")[:200])
        if reply.first_token_at is not None:
            first_token[j] = reply.first_token_at - start
        tokens[j] = reply.output_tokens
        prompt[j] = shape.prompt_tokens if reply.prompt_tokens is None else reply.prompt_tokens
        times = reply.chunk_times
        if times is not None and len(times) > 1:
            chunk_gaps[j] = np.diff(times).tolist()
        finish(j)

    async def sweep() -> None:
        while True:
            await asyncio.sleep(_SWEEP_S)
            now = pc()
            while deadlines:
                deadline, j = deadlines[0]
                if outcome[j] != _PENDING:
                    deadlines.popleft()
                    continue
                if deadline > now:
                    break
                deadlines.popleft()
                done[j] = now - start
                outcome[j] = int(Outcome.TIMEOUT)
                prog.failed += 1
                note_error(f"timeout after {timeout:g} s")
                task = tasks.get(j)
                finish(j)
                if task is not None:
                    task.cancel()

    sweeper = loop.create_task(sweep())
    create_task = loop.create_task
    limit = cfg.max_outstanding
    spin = cfg.spin_s
    stopped = stop.is_set if stop is not None else (lambda: False)
    i = 0
    try:
        while i < n and not stopped():
            now = pc()
            if due[i] > now:
                wait = due[i] - now
                if wait > 2 * spin:
                    await asyncio.sleep(wait - spin)  # the loop's timer: ~1 ms granular
                else:
                    if wait > 2 * _NAP_S:
                        time.sleep(_NAP_S)  # idle without burning the core other work needs
                    await asyncio.sleep(0)  # let answers in while we close in on the send
                continue
            while i < n and due[i] <= now:
                if len(tasks) >= limit:
                    prog.outstanding_limited += 1
                    slot_free.clear()
                    await slot_free.wait()
                    if stopped():
                        break
                t = pc()
                sent[i] = t - start
                outcome[i] = _PENDING
                deadlines.append((t + timeout, i))
                coro = one(i, DEFAULT_SHAPE if shapes is None else shapes[i])
                try:  # start eagerly: the request leaves now; one answered at once costs no task
                    first = coro.send(None)
                except StopIteration:
                    pass
                else:
                    tasks[i] = create_task(_resume(coro, first))
                i += 1
                prog.sent = i
            await asyncio.sleep(0)
        prog.sent = i
        if tasks:
            finished = i == n and not stopped()
            all_done.clear()
            await wait_event(
                all_done, timeout + 4 * _SWEEP_S if finished else (cfg.drain_s or timeout)
            )
    finally:
        prog.stopped = i < n
        sweeper.cancel()
        end = pc() - start
        for j, task in list(tasks.items()):
            if outcome[j] == _PENDING:
                done[j] = end
                outcome[j] = int(Outcome.INCOMPLETE)
                note_error("incomplete: no answer before the step stopped waiting")
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        await asyncio.gather(sweeper, return_exceptions=True)

    rec.sent[:] = sent
    rec.done[:] = done
    rec.outcome[:] = outcome
    rec.first_token[:] = first_token
    rec.output_tokens[:] = tokens
    rec.prompt_tokens[:] = prompt
    if chunk_gaps:
        rec.gaps, rec.gap_start = gaps_from([chunk_gaps.get(j, ()) for j in range(n)])
    rec.errors.update(errors)
    rec.outstanding_limited = prog.outstanding_limited
    rec.client_failures = prog.client_failures
    return rec


_CLIENT_ERRNOS = {
    errno.EMFILE: "too many open files in the load generator (raise `ulimit -n`)",
    errno.ENFILE: "the host's file table is full",
    errno.ENOBUFS: "no buffer space in the load generator",
    errno.ENOMEM: "the load generator is out of memory",
    errno.EADDRNOTAVAIL: "the load generator ran out of local ports",
}


def client_failure(exc: BaseException) -> str | None:
    """Why ``exc`` is the generator's own failure (out of descriptors, memory or local
    ports: the request never reached the server), or None when it is the server's or
    the network's. Looks through wrapping exceptions (aiohttp's ``os_error``, causes)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _CLIENT_ERRNOS:
            return f"client: {_CLIENT_ERRNOS[e.errno]} ({type(e).__name__}: {e})"
        inner = getattr(e, "os_error", None)
        todo += [e.__cause__, e.__context__, inner if isinstance(inner, BaseException) else None]
    return None


class _Continue:
    """Awaitable that carries on a coroutine already stepped once by hand (an eager
    start), re-yielding what it yielded so the Task waits on the same future."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro, self._first = coro, first

    def __await__(self) -> Generator[Any, Any, None]:
        coro, value = self._coro, self._first
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # cancellation and the like: pass it in
                try:
                    value = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    value = coro.send(sent)
                except StopIteration:
                    return


async def _resume(coro: Coroutine[Any, Any, None], first: Any) -> None:
    await _Continue(coro, first)
