"""One task's queue: ``policies.queue.BatchQueue`` stepped on the event loop, its
batches run on worker instances.

Requests join the queue with their rows, input arrays and absolute deadline. Whenever
an instance is free, the queue says whether to send a batch now (full, a preferred
size, or the oldest request has waited the queue delay) or to wait until when; the same
queue drives the fake server and both simulators. A request that can no longer make its
deadline is dropped (``dropping``) when it arrives and again when its batch forms
(unless it arrived at an idle server), so no instance works on an answer nobody will
use. A batch's inputs are concatenated along the batch dimension, run on the
instance, and its outputs split back by rows; an instance's failure (a crash included)
fails that batch's requests with an error, never leaving them waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ridgeline.clock import Clock
from ridgeline.errors import InferFailed
from ridgeline.policies.batching import BatchingConfig
from ridgeline.policies.dropping import After, Trail, nothing_after
from ridgeline.policies.queue import BatchQueue, DropReason, Entry
from ridgeline.serve.metrics import ServeMetrics
from ridgeline.v2.spec import TensorSpec
from ridgeline.v2.tensors import Array


class Instance(Protocol):
    """Runs one batch at a time (a worker process, or anything in-process)."""

    async def run(self, inputs: dict[str, Array]) -> dict[str, Array]: ...


class _Item:
    __slots__ = ("arrays", "future")

    def __init__(self, arrays: list[Array]) -> None:
        self.arrays = arrays
        self.future: asyncio.Future[list[Array]] = asyncio.get_running_loop().create_future()


class TaskQueue:
    """The queue of task ``name``: ``policies.queue.BatchQueue`` stepped on the event
    loop, its batches run on ``instances``; ``remaining_after`` is the expected time of
    the tasks after it (its longest path), for the drop decision."""

    def __init__(
        self,
        name: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        batching: BatchingConfig,
        instances: Sequence[Instance],
        clock: Clock,
        metrics: ServeMetrics,
        remaining_after: After = nothing_after,
        drop: bool = True,
    ) -> None:
        self.name, self.inputs, self.outputs = name, list(inputs), list(outputs)
        self.instances, self.clock = list(instances), clock
        self.metrics, self.remaining_after = metrics, remaining_after
        self.core: BatchQueue[_Item] = BatchQueue(
            batching, len(self.instances), drop=drop, started=clock.now()
        )
        self.retired: set[int] = set()
        """Instances no batch goes to any more (``retire``)."""
        self._draining: dict[int, asyncio.Future[None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def cfg(self) -> BatchingConfig:
        return self.core.cfg

    def idle(self) -> bool:
        """Nothing queued and no batch running."""
        return not self.core.items and not self._running

    def add_instance(self, instance: Instance) -> int:
        """Start sending batches to ``instance`` too (warm it first); its slot."""
        self.instances.append(instance)
        slot = self.core.add_instance(self.clock.now())
        self._pump()
        return slot

    def retire(self, slot: int) -> asyncio.Future[None]:
        """Send no more batches to instance ``slot``; done once its batch in flight, if
        any, has finished and been answered. What is queued goes to the others."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.retired.add(slot)
        if self.core.retire(slot):
            self._draining[slot] = done
        else:
            done.set_result(None)
        return done

    def expected_s(self, ahead_rows: float = 0.0, elapsed_s: float = 0.0) -> float:
        """From joining this queue ``elapsed_s`` from now, with ``ahead_rows`` reaching it
        first, to the end of the longest path after it."""
        return self.core.expected_s(self.remaining_after, ahead_rows, elapsed_s)

    def submit(
        self,
        rows: int,
        arrays: list[Array],
        deadline: float,
        keep: bool = False,
        trail: Trail | None = None,
    ) -> asyncio.Future[list[Array]]:
        """Queue one request of ``rows`` rows (≤ the batch size); its outputs' future.
        ``keep``: never drop it (it arrived at an idle server, ``dropping``); otherwise
        one expected to miss its ``deadline`` (times the queue's ``Slack`` where it is
        judged) is dropped on arrival or as its batch forms. ``trail``: its request's
        checks, which this queue's join (``dropping.Trail``)."""
        core = self.core
        if not 1 <= rows <= core.cfg.max_batch_size:
            raise ValueError(f"{rows} rows for task {self.name!r} (1..{core.cfg.max_batch_size})")
        now = self.clock.now()
        core.arrive(now, rows)
        item = _Item(arrays)
        entry = Entry(item, rows, now, deadline, keep, trail)
        self.metrics.requests.labels(self.name).inc()
        if self._closed:
            item.future.set_exception(InferFailed("unavailable", "the server is shutting down"))
            return item.future
        why = core.refuses(entry, now, self.expected_s)
        if why is not None:
            self._drop(item, why)
        else:
            core.push(entry)
            self._pump()
        return item.future

    def refuse(self, why: DropReason) -> asyncio.Future[list[Array]]:
        """A request turned away before it joins (its model's own check at arrival),
        answered and counted as this queue's drops are."""
        item = _Item([])
        self._drop(item, why)
        return item.future

    def _drop(self, item: _Item, why: DropReason) -> None:
        if item.future.done():  # cancelled by its caller
            return
        self.metrics.drops.labels(self.name).inc()
        # the answer names the reason, never this request's numbers: a client counts its
        # errors by their text, and one kind of drop must stay one kind of error
        item.future.set_exception(
            InferFailed("dropped", f"cannot meet SLO at task {self.name!r}: {why.value}")
        )

    def _pump(self) -> None:
        now = self.clock.now()
        for formed in self.core.batches(
            now, lambda until: self._arm(until, now), self.remaining_after
        ):
            for entry, why in formed.dropped:
                self._drop(entry.payload, why)
            if formed.batch:
                run = self._execute(formed.slot, formed.batch, formed.rows, now)
                task = asyncio.create_task(run)
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

    async def _execute(
        self, slot: int, entries: list[Entry[_Item]], rows: int, formed: float
    ) -> None:
        m, name = self.metrics, self.name
        for entry in entries:
            m.queue_s.labels(name).observe(formed - entry.arrival)
        batch = [entry.payload for entry in entries]
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
            self.core.learn(rows, took)
            m.compute_s.labels(name).observe(took)
            m.batch_size.labels(name).observe(rows)
            m.rows.labels(name).inc(rows)
            offset = 0
            for entry in entries:
                item = entry.payload
                part = [a[offset : offset + entry.rows] for a in arrays]
                offset += entry.rows
                if not item.future.done():
                    item.future.set_result(part)
        finally:
            if slot in self.retired:
                drained = self._draining.pop(slot, None)
                if drained is not None and not drained.done():
                    drained.set_result(None)
            else:
                self.core.release(slot, self.clock.now())
            if not self._closed:
                self._pump()

    async def drain(self) -> None:
        """Serve what is queued now, without a batching delay, and wait for every batch
        to end: the queue of a task being replaced, whose new requests go elsewhere."""
        self.core.cfg = self.cfg.model_copy(update={"max_queue_delay_s": 0.0})
        self._pump()
        while not self.idle():
            await asyncio.gather(*list(self._running), return_exceptions=True)
            self._pump()

    async def close(self) -> None:
        """Refuse what is queued, wait for the batches running."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for entry in self.core.clear():
            item = entry.payload
            if not item.future.done():  # its caller may have gone (cancelled) already
                item.future.set_exception(InferFailed("unavailable", "the server is shutting down"))
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
