"""The batching engine: ``policies.queue.BatchQueue`` stepped on the event loop.

Event-driven, with no task per instance: an arrival or a completion runs ``_pump``,
which asks the queue what a free instance should do and either dispatches the batch it
forms or arms one timer for the policy's deadline.

Times are absolute. An instance keeps ``busy_until``; a batch starts at the later of
that and the moment the batch became ready (its last request's arrival, or the queue
delay's deadline), and ends at start + service, pushed past any stall window. The
completion is scheduled for that absolute end, so the ~1 ms lateness of each timer never
accumulates: under saturation the next batch starts at the previous one's logical end,
and measured throughput matches ``capacity_rps``. A batch whose end has already passed
completes at once, without a timer; with free service and no queue delay every request
is answered inside ``submit`` without sleeping (the fast path).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from enum import StrEnum

from ridgeline.clock import Clock, MonotonicClock
from ridgeline.fakeserver.metrics import Stats
from ridgeline.policies.queue import BatchQueue, Entry, Formed
from ridgeline.synthetic.model import LatencyModel, service_time_s, stall_release


class Status(StrEnum):
    OK = "ok"
    ERROR = "error"
    """Executed, then answered with an injected error (``error_rate``)."""
    REJECTED = "rejected"
    """Not queued: the queue was full (``max_queue``) or the engine closed."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one submitted request ended."""

    status: Status
    queue_s: float = 0.0
    """From arrival to the start of its batch."""
    compute_s: float = 0.0
    """From the start to the end of its batch (stalls included)."""
    batch_rows: int = 0
    done_at: float = 0.0
    """Clock time its batch completed (the logical end, not the timer's wake-up)."""
    detail: str = ""
    """Why it failed, for the error message: "injected error", "queue full", …"""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


QUEUE_FULL = Outcome(Status.REJECTED, detail="queue full")
SHUT_DOWN = Outcome(Status.REJECTED, detail="server shutting down")


class _Pending:
    __slots__ = ("future", "outcome")

    def __init__(self) -> None:
        self.outcome: Outcome | None = None
        self.future: asyncio.Future[Outcome] | None = None


class BatchingEngine:
    """Queue, batch and "execute" requests with the timing of a ``LatencyModel``.

    Create it inside the event loop that will submit to it; the model's clock (stalls,
    warm-up) starts at construction. What to batch, when, and on which instance is
    ``policies.queue.BatchQueue``'s to say; this engine steps it on the event loop.
    """

    def __init__(
        self, model: LatencyModel, clock: Clock | None = None, stats: Stats | None = None
    ) -> None:
        self.model = model
        self.clock: Clock = clock or MonotonicClock()
        self.stats = stats or Stats(model.batching.max_batch_size)
        self.started_at = self.clock.now()
        self._cfg = model.batching
        self._stalls = bool(model.stalls) or model.periodic_stall is not None
        self._queue: BatchQueue[_Pending] = BatchQueue(
            model.batching, model.instances, started=self.started_at
        )
        self._busy_until = [self.started_at] * model.instances
        self._running: dict[int, tuple[asyncio.TimerHandle, list[Entry[_Pending]]]] = {}
        self._executing = 0
        self._wait: asyncio.TimerHandle | None = None
        self._wait_until = 0.0
        self._served = 0
        self._noise_rng = random.Random(model.seed)
        self._error_rng = random.Random(model.seed + 1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def queue_length(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue.items)

    @property
    def pending(self) -> int:
        """Requests waiting or executing."""
        return len(self._queue.items) + self._executing

    async def submit(self, rows: int = 1) -> Outcome:
        """Queue one request of ``rows`` rows and wait for its batch to complete."""
        now_or_later = self.submit_nowait(rows)
        if isinstance(now_or_later, Outcome):
            return now_or_later
        return await now_or_later

    def submit_nowait(self, rows: int = 1) -> Outcome | asyncio.Future[Outcome]:
        """Queue one request of ``rows`` rows: its ``Outcome`` when it is already decided
        (answered at once, queue full, shut down), else a future that resolves to it.

        For front ends that answer without a task per request; call it on the loop.
        """
        if not 1 <= rows <= self._cfg.max_batch_size:
            raise ValueError(
                f"a request of {rows} rows cannot be batched; send 1..max_batch_size "
                f"({self._cfg.max_batch_size}) rows"
            )
        if self._closed:
            return SHUT_DOWN
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        now = self.clock.now()
        p = _Pending()
        entry = Entry(p, rows, now)
        q = self._queue
        q.push(entry)
        if q.free:
            self._pump(now)
        if p.outcome is not None:
            return p.outcome
        if q.overflow(entry, self.model.max_queue):
            return QUEUE_FULL
        p.future = self._loop.create_future()
        return p.future

    def close(self) -> None:
        """Stop: cancel timers and answer everything queued or executing as rejected."""
        self._closed = True
        if self._wait is not None:
            self._wait.cancel()
        victims = self._queue.clear()
        for handle, batch in self._running.values():
            handle.cancel()
            victims.extend(batch)
        self._running.clear()
        for e in victims:
            self._resolve(e.payload, SHUT_DOWN)

    def _pump(self, now: float) -> None:
        for formed in self._queue.batches(now, lambda until: self._arm(until, now)):
            self._dispatch(formed, now)

    def _dispatch(self, formed: Formed[_Pending], now: float) -> None:
        inst, batch, rows = formed.slot, formed.batch, formed.rows
        start = max(self._busy_until[inst], formed.ready)
        t0 = self.started_at
        end = start + service_time_s(self.model, rows, start - t0, self._served, self._noise_rng)
        if self._stalls:
            end = t0 + stall_release(self.model, end - t0)
        self._served += len(batch)
        self._busy_until[inst] = end
        self._executing += len(batch)
        if end <= now:
            self._complete(inst, batch, rows, start, end)
        else:
            assert self._loop is not None
            handle = self._loop.call_later(end - now, self._on_done, inst, batch, rows, start, end)
            self._running[inst] = (handle, batch)

    def _on_done(
        self, inst: int, batch: list[Entry[_Pending]], rows: int, start: float, end: float
    ) -> None:
        del self._running[inst]
        self._complete(inst, batch, rows, start, end)
        self._pump(self.clock.now())

    def _complete(
        self, inst: int, batch: list[Entry[_Pending]], rows: int, start: float, end: float
    ) -> None:
        self._queue.release(inst, end)
        self._executing -= len(batch)
        s, compute = self.stats, end - start
        s.exec_count += 1
        s.inference_count += rows
        s.batch_rows.observe(rows)
        error_rate = self.model.error_rate
        for e in batch:
            queued = start - e.arrival
            s.queue_s.observe(queued)
            s.compute_s.observe(compute)
            s.queue_us += queued * 1e6
            s.compute_us += compute * 1e6
            if error_rate > 0.0 and self._error_rng.random() < error_rate:
                self._resolve(
                    e.payload, Outcome(Status.ERROR, queued, compute, rows, end, "injected error")
                )
            else:
                self._resolve(e.payload, Outcome(Status.OK, queued, compute, rows, end))

    @staticmethod
    def _resolve(p: _Pending, outcome: Outcome) -> None:
        p.outcome = outcome
        fut = p.future
        if fut is not None and not fut.done():
            fut.set_result(outcome)

    def _arm(self, until: float, now: float) -> None:
        if self._wait is not None:
            if self._wait_until == until:
                return
            self._wait.cancel()
        assert self._loop is not None
        self._wait_until = until
        self._wait = self._loop.call_later(max(0.0, until - now), self._on_wait)

    def _on_wait(self) -> None:
        self._wait = None
        self._pump(self.clock.now())
