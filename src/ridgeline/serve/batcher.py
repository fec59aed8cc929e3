"""One task's queue: dynamic batching by the shared policy, dispatch to free instances.

Requests join the queue with their rows, input arrays and absolute deadline. Whenever
an instance is free, ``policies.batching.decide`` says whether to send a batch now (full,
a preferred size, or the oldest request has waited the queue delay) or to wait until
when; the same function drives the fake server and the simulator. A request that can
no longer make its deadline is dropped (``dropping``) when it arrives and again when
its batch forms (unless it arrived at an idle server), so no instance works on an answer
nobody will use. A batch's inputs are concatenated along the batch dimension, run on the
instance, and its outputs split back by rows; an instance's failure (a crash included)
fails that batch's requests with an error, never leaving them waiting.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ridgeline.clock import Clock
from ridgeline.errors import InferFailed
from ridgeline.policies.batching import BatchingConfig, Wait, decide
from ridgeline.policies.dropping import (
    ExecModel,
    TaskTiming,
    arrival_gap,
    expected_wait_s,
    should_drop,
    spent,
)
from ridgeline.serve.metrics import ServeMetrics
from ridgeline.v2.spec import TensorSpec
from ridgeline.v2.tensors import Array


class Instance(Protocol):
    """Runs one batch at a time (a worker process, or anything in-process)."""

    async def run(self, inputs: dict[str, Array]) -> dict[str, Array]: ...


class _Item:
    __slots__ = ("arrays", "arrival", "budget", "deadline", "future", "kept", "rows")

    def __init__(
        self, rows: int, arrays: list[Array], deadline: float, arrival: float, budget: float
    ) -> None:
        self.rows, self.arrays, self.deadline, self.arrival = rows, arrays, deadline, arrival
        self.budget = budget
        """When this task's latency budget runs out (its end, summed from the source)."""
        self.kept = False
        """Arrived at an idle server: never dropped (``dropping``)."""
        self.future: asyncio.Future[list[Array]] = asyncio.get_running_loop().create_future()


class TaskQueue:
    """The queue of task ``name``; ``remaining_after`` is the expected time of the tasks
    after it (its longest path), for the drop decision."""

    def __init__(
        self,
        name: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        batching: BatchingConfig,
        instances: Sequence[Instance],
        clock: Clock,
        metrics: ServeMetrics,
        remaining_after: Callable[[], float] = lambda: 0.0,
        drop: bool = True,
    ) -> None:
        self.name, self.inputs, self.outputs = name, list(inputs), list(outputs)
        self.cfg, self.instances, self.clock = batching, list(instances), clock
        self._gap_s = 0.0
        """The mean gap between rows arriving lately (``dropping.arrival_gap``)."""
        self._last_s: float | None = None
        self.metrics, self.remaining_after, self.drop = metrics, remaining_after, drop
        self.exec = ExecModel()
        self._items: deque[_Item] = deque()
        self._rows = 0
        self._free = list(range(len(self.instances)))
        self.retired: set[int] = set()
        """Instances no batch goes to any more (``retire``)."""
        self._draining: dict[int, asyncio.Future[None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def active(self) -> int:
        """Instances batches may go to."""
        return len(self.instances) - len(self.retired)

    def timing(self) -> TaskTiming:
        return TaskTiming(
            self.exec,
            self._rows,
            self.cfg.max_batch_size,
            self.active,
            self.cfg.max_queue_delay_s,
            self.active - len(self._free),
            self._gap_s,
        )

    def idle(self) -> bool:
        """Nothing queued and no batch running."""
        return not self._items and not self._running

    def add_instance(self, instance: Instance) -> int:
        """Start sending batches to ``instance`` too (warm it first); its slot."""
        self.instances.append(instance)
        slot = len(self.instances) - 1
        self._free.append(slot)
        self._pump()
        return slot

    def retire(self, slot: int) -> asyncio.Future[None]:
        """Send no more batches to instance ``slot``; done once its batch in flight, if
        any, has finished and been answered. What is queued goes to the others."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.retired.add(slot)
        if slot in self._free:
            self._free.remove(slot)
            done.set_result(None)
        else:
            self._draining[slot] = done
        return done

    def expected_s(self) -> float:
        """From joining this queue now to the end of the longest path after it."""
        t = self.timing()
        return expected_wait_s(t) + self.exec.time(t.batch_rows) + self.remaining_after()

    def submit(
        self,
        rows: int,
        arrays: list[Array],
        deadline: float,
        keep: bool = False,
        budget: float = math.inf,
    ) -> asyncio.Future[list[Array]]:
        """Queue one request of ``rows`` rows (≤ the batch size); its outputs' future.
        ``keep``: never drop it (it arrived at an idle server, ``dropping``). ``budget``:
        when its latency budget through this task runs out; one that comes, or whose
        batch forms, after that is dropped (it has spent the budget), as one expected to
        miss its ``deadline`` is."""
        if not 1 <= rows <= self.cfg.max_batch_size:
            raise ValueError(f"{rows} rows for task {self.name!r} (1..{self.cfg.max_batch_size})")
        now = self.clock.now()
        self._gap_s = arrival_gap(self._gap_s, self._last_s, now, rows)
        self._last_s = now
        item = _Item(rows, arrays, deadline, now, budget)
        self.metrics.requests.labels(self.name).inc()
        if self._closed:
            item.future.set_exception(InferFailed("unavailable", "the server is shutting down"))
        elif (
            self.drop
            and not keep
            and (should_drop(now, deadline, self.expected_s()) or spent(now, budget))
        ):
            self._drop(item, now)
        else:
            item.kept = keep
            self._items.append(item)
            self._rows += rows
            self._pump()
        return item.future

    def _drop(self, item: _Item, now: float) -> None:
        if item.future.done():  # cancelled by its caller
            return
        self.metrics.drops.labels(self.name).inc()
        # the answer names the reason, never this request's numbers: a client counts its
        # errors by their text, and one kind of drop must stay one kind of error
        why = (
            "its latency budget here is spent"
            if spent(now, item.budget)
            else "it would finish past its deadline"
        )
        item.future.set_exception(
            InferFailed("dropped", f"cannot meet SLO at task {self.name!r}: {why}")
        )

    def _pump(self) -> None:
        items, now = self._items, self.clock.now()
        while items and self._free:
            d = decide(self._rows, items[0].arrival, now, self.cfg)
            if isinstance(d, Wait):
                if d.until is not None:
                    self._arm(d.until, now)
                return
            batch: list[_Item] = []
            rows = 0
            own = self.exec.time(d.size)
            rest = own + self.remaining_after()
            while items and rows + items[0].rows <= d.size:
                item = items.popleft()
                self._rows -= item.rows
                if (
                    self.drop
                    and not item.kept
                    and (should_drop(now, item.deadline, rest) or spent(now, item.budget))
                ):
                    self._drop(item, now)
                    continue
                batch.append(item)
                rows += item.rows
            if batch:
                slot = self._free.pop(0)
                task = asyncio.create_task(self._execute(slot, batch, rows, now))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    def _arm(self, until: float, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, until - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    async def _execute(self, slot: int, batch: list[_Item], rows: int, formed: float) -> None:
        m, name = self.metrics, self.name
        for item in batch:
            m.queue_s.labels(name).observe(formed - item.arrival)
        inputs = {
            spec.name: np.concatenate([item.arrays[k] for item in batch], axis=0)
            for k, spec in enumerate(self.inputs)
        }
        start = self.clock.now()
        try:
            out = await self.instances[slot].run(inputs)
            arrays = [out[spec.name] for spec in self.outputs]
        except Exception as e:  # a failed or crashed instance fails its batch, loudly
            m.errors.labels(name).inc(len(batch))
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(InferFailed("internal", f"task {name!r}: {e}"))
        else:
            took = self.clock.now() - start
            self.exec = self.exec.observe(rows, took)
            m.compute_s.labels(name).observe(took)
            m.batch_size.labels(name).observe(rows)
            m.rows.labels(name).inc(rows)
            offset = 0
            for item in batch:
                part = [a[offset : offset + item.rows] for a in arrays]
                offset += item.rows
                if not item.future.done():
                    item.future.set_result(part)
        finally:
            if slot in self.retired:
                drained = self._draining.pop(slot, None)
                if drained is not None and not drained.done():
                    drained.set_result(None)
            else:
                self._free.append(slot)
            if not self._closed:
                self._pump()

    async def drain(self) -> None:
        """Serve what is queued now, without a batching delay, and wait for every batch
        to end: the queue of a task being replaced, whose new requests go elsewhere."""
        self.cfg = self.cfg.model_copy(update={"max_queue_delay_s": 0.0})
        self._pump()
        while not self.idle():
            await asyncio.gather(*list(self._running), return_exceptions=True)
            self._pump()

    async def close(self) -> None:
        """Refuse what is queued, wait for the batches running."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        while self._items:
            item = self._items.popleft()
            if not item.future.done():  # its caller may have gone (cancelled) already
                item.future.set_exception(InferFailed("unavailable", "the server is shutting down"))
        self._rows = 0
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
