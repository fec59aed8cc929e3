"""The batching engine: one queue, ``instances`` executors, dispatch by ``decide``.

Event-driven, with no task per instance: an arrival or a completion runs ``_pump``,
which asks the batching policy what a free instance should do and either dispatches a
batch or arms one timer for the policy's deadline.

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
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from ridgeline.clock import Clock, MonotonicClock
from ridgeline.fakeserver.metrics import Stats
from ridgeline.policies.batching import Wait, decide
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
    __slots__ = ("arrival", "future", "outcome", "rows")

    def __init__(self, rows: int, arrival: float) -> None:
        self.rows = rows
        self.arrival = arrival
        self.outcome: Outcome | None = None
        self.future: asyncio.Future[Outcome] | None = None


class BatchingEngine:
    """Queue, batch and "execute" requests with the timing of a ``LatencyModel``.

    Create it inside the event loop that will submit to it; the model's clock (stalls,
    warm-up) starts at construction.
    """

    def __init__(
        self, model: LatencyModel, clock: Clock | None = None, stats: Stats | None = None
    ) -> None:
        self.model = model
        self.clock: Clock = clock or MonotonicClock()
        self.stats = stats or Stats(model.batching.max_batch_size)
        self.started_at = self.clock.now()
        self._cfg = model.batching
        self._preferred = frozenset(model.batching.preferred_batch_sizes)
        self._stalls = bool(model.stalls) or model.periodic_stall is not None
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._busy_until = [self.started_at] * model.instances
        self._free = list(range(model.instances))
        self._running: dict[int, tuple[asyncio.TimerHandle, list[_Pending]]] = {}
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
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Requests waiting or executing."""
        return len(self._queue) + self._executing

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
        p = _Pending(rows, now)
        self._queue.append(p)
        self._queued_rows += rows
        if self._free:
            self._pump(now)
        if p.outcome is not None:
            return p.outcome
        limit = self.model.max_queue
        if limit is not None and self._queue and self._queue[-1] is p and len(self._queue) > limit:
            self._queue.pop()
            self._queued_rows -= rows
            return QUEUE_FULL
        p.future = self._loop.create_future()
        return p.future

    def close(self) -> None:
        """Stop: cancel timers and answer everything queued or executing as rejected."""
        self._closed = True
        if self._wait is not None:
            self._wait.cancel()
        victims = list(self._queue)
        self._queue.clear()
        self._queued_rows = 0
        for handle, batch in self._running.values():
            handle.cancel()
            victims.extend(batch)
        self._running.clear()
        for p in victims:
            self._resolve(p, SHUT_DOWN)

    def _pump(self, now: float) -> None:
        q, cfg = self._queue, self._cfg
        while q and self._free:
            head = q[0]
            d = decide(self._queued_rows, head.arrival, now, cfg)
            if isinstance(d, Wait):
                if d.until is not None:
                    self._arm(d.until, now)
                return
            batch, rows = [q.popleft()], head.rows
            while q and rows + q[0].rows <= d.size:
                rows += q[0].rows
                batch.append(q.popleft())
            self._queued_rows -= rows
            ready = batch[-1].arrival
            if d.size != cfg.max_batch_size and d.size not in self._preferred:
                ready = max(ready, head.arrival + cfg.max_queue_delay_s)  # sent on timeout
            self._dispatch(batch, rows, ready, now)

    def _dispatch(self, batch: list[_Pending], rows: int, ready: float, now: float) -> None:
        free = self._free
        inst = free[0] if len(free) == 1 else min(free, key=self._busy_until.__getitem__)
        free.remove(inst)
        start = max(self._busy_until[inst], ready)
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
        self, inst: int, batch: list[_Pending], rows: int, start: float, end: float
    ) -> None:
        del self._running[inst]
        self._complete(inst, batch, rows, start, end)
        self._pump(self.clock.now())

    def _complete(
        self, inst: int, batch: list[_Pending], rows: int, start: float, end: float
    ) -> None:
        self._free.append(inst)
        self._executing -= len(batch)
        s, compute = self.stats, end - start
        s.exec_count += 1
        s.inference_count += rows
        s.batch_rows.observe(rows)
        error_rate = self.model.error_rate
        for p in batch:
            queued = start - p.arrival
            s.queue_s.observe(queued)
            s.compute_s.observe(compute)
            s.queue_us += queued * 1e6
            s.compute_us += compute * 1e6
            if error_rate > 0.0 and self._error_rng.random() < error_rate:
                self._resolve(
                    p, Outcome(Status.ERROR, queued, compute, rows, end, "injected error")
                )
            else:
                self._resolve(p, Outcome(Status.OK, queued, compute, rows, end))

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
