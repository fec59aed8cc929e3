"""The event loop: a plan's task queues, batched and dropped as the serving runtime does,
in virtual time.

Each task is a ``policies.queue.BatchQueue``, the queue the runtime's
``serve.batcher.TaskQueue`` and the fake server step on the real clock, stepped here on
a heap of virtual-time events; around the queues it follows ``serve.graph.GraphRunner``:

* a request arrives with a deadline of arrival + ``(1 − margin)``·SLO; if the
  pipeline's expected time (``dropping.expected_remaining_s`` along its longest path,
  over the sources), times the factor of the pipeline's ``Slack`` for answers expected
  about as long, passes it, it is dropped at once, unless every queue is idle (then it,
  and everything it sends on, is never dropped);
* at each task its rows join the queue in chunks of at most the batch size, each
  dropped on arrival if the queue refuses it; a free instance asks the queue (dispatch
  now, or wait until when: a timer), and each request taken into a batch is checked
  again against the batch's time and the path after it; each check scales its
  expectation by its own place's ``Slack``, and every place learns from the answers
  (``dropping.Trail``);
* a batch runs ``service`` time (base + per-row, times a lognormal draw); when it ends
  the instance's execution model learns from it (``ExecModel.observe``) and the queue
  pumps, then each request whose chunks are all answered fans out along its edges,
  ``rows × factor`` rows with fractional factors carried from request to request;
* a request is answered when the last of its task runs ends; a drop anywhere fails it
  (its other branches still run, as the runtime's ``gather`` lets them).

Events at one instant run in the event loop's phases: timers fire, then each batch
ends (its model learns, its queue pumps), then the requests those batches answered go on.
Batches ending together end in the order they started (the runtime's loop breaks such
ties arbitrarily; with any noise they do not happen).

Each instance runs one batch at a time. Given the host's cores (``cores``: each CPU
instance's, as ``Plan.core_assignment`` pins them), instances pinned to one core share
its time (processor sharing, ``_cores``): a batch's profiled time is its work alone, and
its end moves as batches start and end beside it. Noise is drawn per task in the order its
batches start, from a stream seeded by (seed, task): two runs that differ only in
instance counts see the same arrivals and give the k-th batch of a task the same draw.
The execution model starts where the runtime's warm-up leaves it: from a one-row and a
full batch, here at their mean times.

Requests are columns (arrival, finish, status), not objects; the expected time of each
task is cached until its queue, its instances or its execution model (or a task after
it) change, so a pure policy is asked only when its answer could differ.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from heapq import heappop, heappush
from itertools import count
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ridgeline.pipeline.plan import Plan
from ridgeline.plansim._cores import Running, SharedCores, contended
from ridgeline.plansim.service import ServiceTime
from ridgeline.policies.batching import BatchingConfig
from ridgeline.policies.dropping import (
    DROP_MARGIN,
    SLACK_QUANTILE,
    After,
    ExecModel,
    Slack,
    Trail,
    learn,
    nothing_after,
)
from ridgeline.policies.queue import BatchQueue, Entry, refuses_request
from ridgeline.synthetic.model import lognormal_params

PENDING, ANSWERED, DROPPED = 0, 1, 2
"""A request's status in ``EngineRun.status``."""

_COMPLETE, _TIMER, _SHARED = 0, 1, 2
_NOISE_BLOCK = 4096


@dataclass(frozen=True, slots=True)
class TaskCounters:
    """What one task did over a run."""

    submitted: int
    """Requests (chunks of at most a batch) that reached its queue."""
    drops: int
    batches: int
    rows: int
    busy_s: float
    """Instance-seconds spent executing batches."""
    wait_s: float
    """Summed time from joining the queue to the batch starting, over batched requests."""
    batched: int
    """Requests that went into a batch."""


@dataclass(frozen=True, eq=False)
class EngineRun:
    """The raw outcome: per-request columns and per-task counters."""

    finish_s: NDArray[np.float64]
    """When each request was answered (or failed)."""
    status: NDArray[np.uint8]
    """``ANSWERED`` or ``DROPPED``."""
    tasks: dict[str, TaskCounters]
    dropped_at_arrival: int
    end_s: float
    """When the last event happened."""
    in_system_s: float
    """The integral of the number of requests in the pipeline (from reaching it to their
    answer or failure) over ``[0, horizon_s]``."""
    entered_s: NDArray[np.float64]
    """When each request reached the pipeline: the times ``run`` was given (after any
    front end, which the pipeline's count leaves out)."""


class Noise:
    """A task's batch-time noise: lognormal factors of mean 1 and coefficient of
    variation ``cv``, from a stream seeded by (``seed``, the task's index in the plan),
    drawn in the order batches start."""

    __slots__ = ("_draws", "_k", "_mu", "_rng", "_sigma", "cv")

    def __init__(self, cv: float, seed: int, index: int) -> None:
        self.cv = cv
        self._mu, self._sigma = lognormal_params(cv)
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
        self._draws: list[float] = []
        self._k = 0

    def draw(self) -> float:
        if self._k == len(self._draws):
            self._draws = self._rng.lognormal(self._mu, self._sigma, _NOISE_BLOCK).tolist()
            self._k = 0
        self._k += 1
        return self._draws[self._k - 1]


class _Task:
    __slots__ = (
        "after_fn",
        "arm",
        "batched",
        "batches",
        "busy_s",
        "children",
        "drops",
        "edges",
        "expected",
        "expected_fn",
        "gen",
        "mean",
        "name",
        "noise",
        "parents",
        "pinned",
        "q",
        "rows_run",
        "running",
        "size",
        "submitted",
        "wait_s",
    )

    def __init__(
        self,
        name: str,
        cfg: BatchingConfig,
        instances: int,
        service: ServiceTime,
        noise: Noise,
        drop: bool,
        slack_quantile: float = SLACK_QUANTILE,
    ) -> None:
        self.name = name
        self.size = cfg.max_batch_size
        self.mean = [service.mean_s(r) for r in range(self.size + 1)]
        self.noise = noise
        self.pinned: list[tuple[int, ...] | None] | None = None
        """Per instance, the cores it shares with other instances (None: its own)."""
        # the runtime's warm-up: a one-row and a full batch give the first model
        warm = ExecModel.from_warmup(self.mean[1], self.size, self.mean[self.size])
        self.q: BatchQueue[list[Any]] = BatchQueue(
            cfg, instances, drop=drop, exec_model=warm, slack_quantile=slack_quantile
        )
        self.running = 0
        self.gen = 0
        # the queue's callbacks, bound by the engine (``Engine.__init__``)
        self.arm: Callable[[float], None]
        self.after_fn: After
        self.expected_fn: Callable[[], float]
        self.expected: float | None = None
        self.children: list[_Task] = []
        self.parents: list[_Task] = []
        self.edges: list[tuple[int, _Task, float]] = []
        self.submitted = self.drops = self.batches = self.rows_run = self.batched = 0
        self.busy_s = self.wait_s = 0.0

    def counters(self) -> TaskCounters:
        return TaskCounters(
            self.submitted,
            self.drops,
            self.batches,
            self.rows_run,
            self.busy_s,
            self.wait_s,
            self.batched,
        )


class Engine:
    """One simulated run of ``plan``; ``run(times)`` once."""

    def __init__(
        self,
        plan: Plan,
        services: Mapping[str, ServiceTime],
        *,
        drop: bool = True,
        margin: float = DROP_MARGIN,
        seed: int = 0,
        horizon_s: float = math.inf,
        frontend_s: float = 0.0,
        slack_quantile: float = SLACK_QUANTILE,
        cores: Mapping[str, Sequence[tuple[int, ...]]] | None = None,
    ) -> None:
        self.plan, self.drop, self.margin, self.horizon_s = plan, drop, margin, horizon_s
        self.frontend_s = frontend_s
        """Time a request spends outside the queues, kept back from its deadline as the
        runtime keeps its measured front-end time back (``GraphRunner.frontend_s``)."""
        self.slo_s = plan.slo_ms / 1000.0
        # GraphRunner's, to the bit
        self.slack = Slack(quantile=slack_quantile)
        self.tasks: dict[str, _Task] = {}
        for k, (name, t) in enumerate(plan.tasks.items()):
            cfg = BatchingConfig(
                max_batch_size=t.batch_size,
                max_queue_delay_s=t.max_queue_delay_ms / 1000.0,
                preferred_batch_sizes=t.preferred_batch_sizes,
            )
            noise = Noise(services[name].noise_cv, seed, k)
            self.tasks[name] = _Task(
                name, cfg, t.instances, services[name], noise, drop, slack_quantile
            )
        self.shared = SharedCores()
        for name, slots in contended(cores or {}).items():
            if any(c is not None for c in slots):
                self.tasks[name].pinned = slots
        for i, e in enumerate(plan.edges):
            src, dst = self.tasks[e.source], self.tasks[e.target]
            src.children.append(dst)
            src.edges.append((i, dst, e.factor))
            dst.parents.append(src)
        for task in self.tasks.values():
            task.arm = partial(self._arm, task)
            task.after_fn = partial(self._after, task) if task.children else nothing_after
            task.expected_fn = partial(self._expected, task)
        self.sources = [self.tasks[s] for s in plan.sources()]
        self._carry = [0.0] * len(plan.edges)
        self._heap: list[tuple[float, int, int, _Task, Any]] = []
        self._seq = count()
        self._active = 0
        """Requests queued plus batches running, over every task: 0 is idle."""

    # --- the expected times (cached) ------------------------------------------------

    def _expected(self, t: _Task) -> float:
        """``TaskQueue.expected_s``: from joining ``t`` now to the end of its longest path
        (cached until ``t`` or a task after it changes)."""
        e = t.expected
        if e is None:
            for c in t.children:  # cached first: a cache is set only with those after it
                self._expected(c)
            e = t.q.expected_s(t.after_fn)
            t.expected = e
        return e

    def _after(self, t: _Task, ahead_rows: float = 0.0, elapsed_s: float = 0.0, /) -> float:
        """``TaskQueue.remaining_after``: the expected time of the tasks after ``t``, for a
        request leaving it ``elapsed_s`` from now with ``ahead_rows`` ahead of it."""
        if ahead_rows <= 0.0 and elapsed_s <= 0.0:
            return max((self._expected(c) for c in t.children), default=0.0)
        return max(
            (c.q.expected_s(c.after_fn, ahead_rows, elapsed_s) for c in t.children), default=0.0
        )

    @staticmethod
    def _dirty(t: _Task) -> None:
        """``t``'s queue, instances or model changed: forget its expectation and that of
        every task before it. (A task's cache is set only with those after it set, and
        forgotten with those before it, so a task already forgotten has every task
        before it forgotten too.)"""
        if t.expected is None:
            return
        t.expected = None
        for p in t.parents:
            Engine._dirty(p)

    # --- the run ---------------------------------------------------------------------

    def run(self, times: NDArray[np.float64]) -> EngineRun:
        arrivals: list[float] = times.tolist()
        n = len(arrivals)
        self._arrival = arrivals
        self._open = array("q", bytes(8 * n))
        self._failed = bytearray(n)
        self._status = bytearray(n)
        self._finish = array("d", bytes(8 * n))
        self._trail: dict[int, Trail] = {}
        self._inside, self._area, self._last = 0, 0.0, 0.0
        self._dropped_at_arrival = 0
        heap, now, i = self._heap, 0.0, 0
        horizon = self.horizon_s
        while True:
            nxt = arrivals[i] if i < n else math.inf
            if heap and heap[0][0] <= nxt:
                now, _, kind, task, payload = heappop(heap)
                if heap and heap[0][0] == now:
                    self._instant(now, kind, task, payload)
                elif kind == _COMPLETE:
                    self._end(task, payload, now)
                    for item in payload[1]:
                        self._chunk_done(item.payload, now, failed=False)
                elif kind == _TIMER:
                    if payload == task.gen:
                        self._pump(task, now)
                elif payload[1] == payload[0].ver:
                    self._end(task, self._unshare(task, payload[0], now), now)
                    for item in payload[0].batch:
                        self._chunk_done(item.payload, now, failed=False)
            elif i < n:
                now = nxt
                self._arrive(i, now)
                i += 1
            else:
                break
        self._tick(horizon if now > horizon else now)
        return EngineRun(
            np.frombuffer(self._finish, dtype=np.float64).copy(),
            np.frombuffer(bytes(self._status), dtype=np.uint8).copy(),
            {name: t.counters() for name, t in self.tasks.items()},
            self._dropped_at_arrival,
            now,
            self._area,
            times,
        )

    def _tick(self, now: float) -> None:
        t = now if now < self.horizon_s else self.horizon_s
        if t > self._last:
            self._area += self._inside * (t - self._last)
            self._last = t

    def _arrive(self, req: int, now: float) -> None:
        """``GraphRunner.infer``: the pipeline's drop check, then each source task."""
        expected = max(self._expected(s) for s in self.sources)
        budget = (1 - self.margin) * self.slo_s - self.frontend_s
        deadline, factor = now + budget, self.slack.judge(expected)
        idle = self._active == 0
        if self.drop and refuses_request(now, deadline, factor * expected, idle):
            self._status[req] = DROPPED
            self._finish[req] = now
            self._dropped_at_arrival += 1
            return
        trail: Trail = [(self.slack, now, expected)]
        self._trail[req] = trail
        self._open[req] = len(self.sources)
        self._tick(now)
        self._inside += 1
        for s in self.sources:
            self._start(s, 1, req, (deadline, trail), idle, now)

    def _start(
        self,
        t: _Task,
        rows: int,
        req: int,
        deadline: tuple[float, Trail],
        keep: bool,
        now: float,
    ) -> None:
        """``GraphRunner._run``: ``rows`` rows of request ``req`` at ``t``, in chunks;
        ``deadline``: the request's and its checks so far (``dropping.Trail``)."""
        size = t.size
        chunks = -(-rows // size)
        node = [req, t, rows, chunks, False, deadline, keep]
        for k in range(0, rows, size):
            self._submit(t, node, min(size, rows - k), deadline, keep, now)

    def _submit(
        self,
        t: _Task,
        node: list[Any],
        rows: int,
        deadline: tuple[float, Trail],
        keep: bool,
        now: float,
    ) -> None:
        """``TaskQueue.submit``."""
        t.submitted += 1
        q = t.q
        q.arrive(now, rows)
        self._dirty(t)
        entry = Entry(node, rows, now, deadline[0], keep, deadline[1])
        if q.refuses(entry, now, t.expected_fn) is not None:
            t.drops += 1
            self._chunk_done(node, now, failed=True)
            return
        q.push(entry)
        self._active += 1
        self._dirty(t)
        self._pump(t, now)

    def _pump(self, t: _Task, now: float) -> None:
        """``TaskQueue._pump``: batches to free instances while the queue forms them."""
        q = t.q
        if not q.items or not q.free:
            return
        for formed in q.batches(now, t.arm, t.after_fn):
            for entry, _ in formed.dropped:
                t.drops += 1
                self._chunk_done(entry.payload, now, failed=True)
            self._active -= formed.taken
            self._dirty(t)
            batch = formed.batch
            if not batch:
                continue
            slot, rows = formed.slot, formed.rows
            t.running += 1
            self._active += 1
            took = t.mean[rows]
            if took > 0.0 and t.noise.cv > 0.0:
                took *= t.noise.draw()
            t.batches += 1
            t.rows_run += rows
            t.batched += len(batch)
            t.wait_s += sum(now - e.arrival for e in batch)
            cores = t.pinned[slot] if t.pinned is not None else None
            if cores is None:
                t.busy_s += took
                heappush(
                    self._heap,
                    (now + took, next(self._seq), _COMPLETE, t, (slot, batch, rows, took)),
                )
            else:
                self._moved(self.shared.start(Running(t, slot, batch, rows, took, cores, now), now))

    def _arm(self, t: _Task, until: float) -> None:
        """A timer for ``t`` at ``until``; any earlier one of ``t`` is stale."""
        t.gen += 1
        heappush(self._heap, (until, next(self._seq), _TIMER, t, t.gen))

    # --- shared cores ----------------------------------------------------------------

    def _moved(self, runs: list[Running]) -> None:
        """Each run's end moved: an event at its new end; the one it had is stale (its
        version is passed)."""
        heap, seq = self._heap, self._seq
        for r in runs:
            heappush(heap, (r.finish, next(seq), _SHARED, r.owner, (r, r.ver)))

    def _unshare(self, t: _Task, run: Running, now: float) -> tuple[int, list[Any], int, float]:
        """``run`` of ``t`` ends now: its cores go to the rest; what ``_end`` takes."""
        took = now - run.start
        t.busy_s += took
        self._moved(self.shared.end(run, now))
        return run.slot, run.batch, run.rows, took

    def _instant(self, now: float, kind: int, task: _Task, payload: Any) -> None:
        """Several events at one instant, in the event loop's order: the timers fire,
        then each batch ends (its model learns, its queue pumps), and only then do the
        requests those batches answered go on (their continuations come later)."""
        heap, due = self._heap, [(kind, task, payload)]
        while heap and heap[0][0] == now:
            _, _, kind, task, payload = heappop(heap)
            due.append((kind, task, payload))
        for kind, task, payload in due:
            if kind == _TIMER and payload == task.gen:
                self._pump(task, now)
        answered = []
        for kind, task, payload in due:
            if kind == _COMPLETE:
                self._end(task, payload, now)
                answered.append(payload[1])
            elif kind == _SHARED and payload[1] == payload[0].ver:  # checked as it comes:
                self._end(task, self._unshare(task, payload[0], now), now)  # an end moves
                answered.append(payload[0].batch)
        for batch in answered:
            for item in batch:
                self._chunk_done(item.payload, now, failed=False)

    def _end(self, t: _Task, payload: tuple[int, list[Any], int, float], now: float) -> None:
        """``TaskQueue._execute``'s end: the model learns, the instance is free, the
        queue pumps."""
        slot, _, rows, took = payload
        t.q.learn(rows, took)
        t.q.release(slot, now)
        t.running -= 1
        self._active -= 1
        self._dirty(t)
        self._pump(t, now)

    def _chunk_done(self, node: list[Any], now: float, *, failed: bool) -> None:
        req = node[0]
        if failed:
            node[4] = True
            self._failed[req] = 1
        node[3] -= 1
        if node[3]:
            return
        if not node[4]:
            t: _Task = node[1]
            carry = self._carry
            spawn = []
            for i, child, factor in t.edges:
                carried = carry[i] + node[2] * factor
                n = math.floor(carried + 1e-9)
                carry[i] = carried - n
                if n:
                    spawn.append((child, n))
            self._open[req] += len(spawn)
            for child, n in spawn:
                self._start(child, n, req, node[5], node[6], now)
        left = self._open[req] - 1
        self._open[req] = left
        if left == 0:
            self._answer(req, now)

    def _answer(self, req: int, now: float) -> None:
        self._tick(now)
        self._inside -= 1
        self._finish[req] = now
        trail = self._trail.pop(req)
        if self._failed[req]:
            self._status[req] = DROPPED
        else:
            self._status[req] = ANSWERED
            learn(trail, now)
