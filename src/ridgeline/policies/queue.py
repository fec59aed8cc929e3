"""The one batching queue: when a batch starts, which requests it takes, which are
dropped, and which are refused, with times passed in.

Every server in the project is this queue stepped by a driver (the SimPy pattern): the
fake server's engine and the serving runtime's task queues step it on the real clock
with asyncio timers; the plan simulator steps it on a virtual-time heap; the simulated
server (``sim/_queue.py``) steps it in bulk, asking ``first_dispatch`` for the arrival
at which a waiting queue goes instead of asking at every arrival. The queue owns no
clock, no timer and no task: a driver tells it what happened (``arrive``, ``push``,
``release``) and asks it what to do (``refuses``, ``form``, ``overflow``).

The decisions, each made here once:

* **when a batch starts**: a free instance asks ``batching.decide`` (full batch,
  formable preferred size, or the oldest request has waited the queue delay); on
  ``Wait(until)`` the driver arms one timer for ``until`` or asks again at the next
  arrival or completion;
* **which requests it takes**: the oldest first, while their rows fit the size decided;
  the first one kept always goes, even when a preferred size is smaller than it (a
  request is never split, and a queue whose head never fits would spin);
* **when it became ready** (``Formed.ready``): its last request's arrival, or the queue
  delay's deadline when it went on that deadline (the fake server starts its batch
  there, so timer lateness never accumulates);
* **which instance runs it**: the one free the longest;
* **early dropping** (``dropping``): a request that is expected to miss its deadline
  is refused on arrival and dropped again when its batch forms, unless it arrived at an
  idle server (``keep``);
* **the queue bound**: past ``max_queue`` requests waiting after the queue was served,
  the newest is refused (``overflow``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from enum import StrEnum
from typing import Generic, NamedTuple, TypeVar

from ridgeline.policies.batching import BatchingConfig, Dispatch, Wait, decide
from ridgeline.policies.dropping import (
    SLACK_QUANTILE,
    After,
    ExecModel,
    Slack,
    TaskTiming,
    Trail,
    arrival_gap,
    expected_here_s,
    nothing_after,
    should_drop,
)

__all__ = [
    "BatchQueue",
    "DropReason",
    "Entry",
    "Formed",
    "batch_end",
    "decide",
    "first_dispatch",
    "late",
    "refuses_request",
]

P = TypeVar("P")


class DropReason(StrEnum):
    LATE = "it would finish past its deadline"


class Entry(Generic[P]):
    """One request waiting in the queue; ``payload`` is the driver's own."""

    __slots__ = ("arrival", "deadline", "keep", "payload", "rows", "trail")

    def __init__(
        self,
        payload: P,
        rows: int,
        arrival: float,
        deadline: float = math.inf,
        keep: bool = False,
        trail: Trail | None = None,
    ) -> None:
        self.payload, self.rows, self.arrival = payload, rows, arrival
        self.deadline = deadline
        self.keep = keep
        """Arrived at an idle server: never dropped (``dropping``)."""
        self.trail = trail
        """Its request's checks so far (``dropping.Trail``), which the queue's checks
        join; None: learnt from nowhere."""


class Formed(NamedTuple, Generic[P]):
    """What a free instance does now: run ``batch`` (``rows`` rows) on instance ``slot``;
    ``dropped`` were taken off the queue for it but cannot make their deadline. An empty
    ``batch`` (every request taken was dropped) uses no instance (``slot`` is -1)."""

    slot: int
    batch: list[Entry[P]]
    rows: int
    dropped: list[tuple[Entry[P], DropReason]]
    ready: float
    """When the batch became ready: its last request's arrival, or the queue delay's
    deadline if it went on that deadline."""

    @property
    def taken(self) -> int:
        """Requests that left the queue."""
        return len(self.batch) + len(self.dropped)


def late(now: float, deadline: float, expected_s: float, factor: float = 1.0) -> DropReason | None:
    """Why a request expected to need ``expected_s`` more (scaled by ``factor``, the
    ``Slack`` of the place it is judged) is dropped now; None if it is not."""
    return DropReason.LATE if should_drop(now, deadline, factor * expected_s) else None


def refuses_request(now: float, deadline: float, expected_s: float, idle: bool) -> bool:
    """A whole pipeline's check at a request's arrival: refused if its longest path is
    expected past the deadline, never when every queue is idle (``dropping``)."""
    return not idle and should_drop(now, deadline, expected_s)


class BatchQueue(Generic[P]):
    """One task's queue over ``instances`` identical instances."""

    __slots__ = (
        "_free_at",
        "_timing",
        "cfg",
        "drop",
        "exec",
        "forming",
        "free",
        "gap_s",
        "instances",
        "items",
        "joining",
        "last_s",
        "rows",
    )  # fmt: skip

    def __init__(
        self,
        cfg: BatchingConfig,
        instances: int,
        *,
        drop: bool = False,
        exec_model: ExecModel | None = None,
        started: float = 0.0,
        slack_quantile: float = SLACK_QUANTILE,
    ) -> None:
        self.cfg, self.drop = cfg, drop
        self.exec = exec_model or ExecModel()
        self.items: deque[Entry[P]] = deque()
        self.rows = 0
        """Rows waiting."""
        self.instances = instances
        """Instances batches may go to."""
        self.free: list[int] = list(range(instances))
        self._free_at: list[float] = [started] * instances
        self.gap_s = 0.0
        """The mean gap between rows arriving lately (``dropping.arrival_gap``)."""
        self.last_s: float | None = None
        self._timing: TaskTiming | None = None
        self.joining = Slack(slack_quantile, borrow=False)
        """How many times longer than expected answers took from joining the queue."""
        self.forming = Slack(slack_quantile, borrow=False)
        """How many times longer than expected answers took from their batch forming."""

    # --- what the drop rule sees -------------------------------------------------------

    @property
    def busy(self) -> int:
        return self.instances - len(self.free)

    def timing(self) -> TaskTiming:
        """The queue as the drop rule sees it now; the last snapshot while nothing in it
        has changed (the simulator asks once per request and task downstream, and a
        snapshot is a frozen dataclass: building each was an eighth of its time)."""
        t, busy, cfg = self._timing, self.instances - len(self.free), self.cfg
        if (
            t is None
            or t.queued_rows != self.rows
            or t.busy != busy
            or t.exec is not self.exec
            or t.gap_s != self.gap_s
            or t.instances != self.instances
            or t.batch_size != cfg.max_batch_size
            or t.max_queue_delay_s != cfg.max_queue_delay_s
        ):
            t = self._timing = TaskTiming(
                self.exec,
                self.rows,
                cfg.max_batch_size,
                self.instances,
                cfg.max_queue_delay_s,
                busy,
                self.gap_s,
            )
        return t

    def expected_s(
        self, after: After = nothing_after, ahead_rows: float = 0.0, elapsed_s: float = 0.0
    ) -> float:
        """From joining the queue ``elapsed_s`` from now, with ``ahead_rows`` reaching it
        first (``dropping.reached``), to the end of its longest path (``after``)."""
        return expected_here_s(self.timing(), after, ahead_rows, elapsed_s)

    # --- what happened -----------------------------------------------------------------

    def arrive(self, now: float, rows: int) -> None:
        """``rows`` rows came at ``now`` (queued or not): the arrival pace learns."""
        self.gap_s = arrival_gap(self.gap_s, self.last_s, now, rows)
        self.last_s = now

    def refuses(
        self, entry: Entry[P], now: float, expected: Callable[[], float]
    ) -> DropReason | None:
        """Whether ``entry`` is dropped on arrival (``expected``: its expected time from
        joining, read only when it matters)."""
        if not self.drop:
            return None
        rest = expected()
        if entry.trail is not None:
            entry.trail.append((self.joining, now, rest))
        if entry.keep:
            return None
        return late(now, entry.deadline, rest, self.joining.factor_for(rest))

    def push(self, entry: Entry[P]) -> None:
        self.items.append(entry)
        self.rows += entry.rows

    def overflow(self, entry: Entry[P], limit: int | None) -> bool:
        """After the queue was served: refuse ``entry`` (take it back off) if it is still
        the newest waiting and more than ``limit`` wait."""
        items = self.items
        if limit is None or not items or items[-1] is not entry or len(items) <= limit:
            return False
        items.pop()
        self.rows -= entry.rows
        return True

    def release(self, slot: int, at: float) -> None:
        """Instance ``slot`` is free again since ``at``. The free list stays in the order
        instances came free (ties: in the order they were released), so the one free the
        longest is its first."""
        free, free_at = self.free, self._free_at
        free_at[slot] = at
        if not free or free_at[free[-1]] <= at:
            free.append(slot)
        else:  # released out of order (the fake server's logical ends)
            k = len(free)
            while k and free_at[free[k - 1]] > at:
                k -= 1
            free.insert(k, slot)

    def add_instance(self, at: float) -> int:
        """One more instance, free now; its slot."""
        self._free_at.append(at)
        slot = len(self._free_at) - 1
        self.instances += 1
        self.free.append(slot)
        return slot

    def retire(self, slot: int) -> bool:
        """No batch goes to ``slot`` any more; whether it runs one now (the driver will
        not ``release`` its end)."""
        self.instances -= 1
        busy = slot not in self.free
        if not busy:
            self.free.remove(slot)
        return busy

    def learn(self, rows: int, took_s: float) -> None:
        """A batch of ``rows`` took ``took_s``: the execution model learns."""
        self.exec = self.exec.observe(rows, took_s)

    def clear(self) -> list[Entry[P]]:
        """Everything waiting, taken off the queue (the server is shutting down)."""
        gone = list(self.items)
        self.items.clear()
        self.rows = 0
        return gone

    # --- what to do --------------------------------------------------------------------

    def batches(
        self,
        now: float,
        arm: Callable[[float], object],
        after: After = nothing_after,
    ) -> Iterator[Formed[P]]:
        """Each batch free instances take at ``now``, one at a time (``form``, asked
        again after the driver has started the one before); when the queue waits for a
        deadline, ``arm(until)`` once."""
        while True:
            formed = self.form(now, after)
            if formed is None:
                return
            if isinstance(formed, Wait):
                if formed.until is not None:
                    arm(formed.until)
                return
            yield formed

    def form(self, now: float, after: After = nothing_after) -> Formed[P] | Wait | None:
        """What a free instance does at ``now``: a batch (``Formed``), wait until when
        (``Wait``), or None when nothing waits or no instance is free. ``after``: the
        expected time of the tasks after this one, read only when dropping."""
        items, free = self.items, self.free
        if not items or not free:
            return None
        cfg = self.cfg
        d = decide(self.rows, items[0].arrival, now, cfg)
        if isinstance(d, Wait):
            return d
        size = d.size
        on_time = size == cfg.max_batch_size or size in cfg.preferred_batch_sizes
        head = items[0].arrival
        drop = self.drop
        rest = factor = 0.0
        if drop:  # its batch, then the tasks after as it will find them once the batch ran
            run = self.exec.time(size)
            rest = run + after(0.0, run)
            factor = self.forming.factor_for(rest)
        batch: list[Entry[P]] = []
        dropped: list[tuple[Entry[P], DropReason]] = []
        rows = 0
        while items and (not batch or rows + items[0].rows <= size):
            e = items.popleft()
            self.rows -= e.rows
            if drop and e.trail is not None:
                e.trail.append((self.forming, now, rest))
            if drop and not e.keep:
                why = late(now, e.deadline, rest, factor)
                if why is not None:
                    dropped.append((e, why))
                    continue
            batch.append(e)
            rows += e.rows
        if not batch:
            return Formed(-1, batch, 0, dropped, now)
        ready = batch[-1].arrival
        if not on_time:
            ready = max(ready, head + cfg.max_queue_delay_s)  # sent on its deadline
        return Formed(free.pop(0), batch, rows, dropped, ready)


# --- the bulk driver's questions (``sim/_queue.py``) -----------------------------------


def first_dispatch(
    times: Sequence[float],
    cum: Sequence[int],
    lo: int,
    hi: int,
    queued: int,
    head: float,
    cfg: BatchingConfig,
) -> tuple[int, Dispatch | None]:
    """The first arrival ``k`` in ``[lo, hi)`` at which a waiting queue dispatches, with
    ``queued`` rows waiting (the oldest since ``head``) before ``lo`` arrives and
    ``cum[i]`` rows before arrival ``i``; (-1, None) if none does.

    What asking ``decide`` at each arrival would find, by bisection: the policy is
    monotone (more rows queued, or a later time, never turns a ``Dispatch`` into a
    ``Wait``)."""
    if lo >= hi:
        return -1, None
    last = decide(queued + cum[hi] - cum[lo], head, times[hi - 1], cfg)
    if isinstance(last, Wait):
        return -1, None
    a, b, best = lo, hi - 1, last
    while a < b:
        mid = (a + b) // 2
        d = decide(queued + cum[mid + 1] - cum[lo], head, times[mid], cfg)
        if isinstance(d, Wait):
            a = mid + 1
        else:
            b, best = mid, d
    return a, best


def batch_end(cum: Sequence[int], first: int, avail: int, size: int) -> int:
    """The queue position after a batch of at most ``size`` rows taken from ``first``
    (``cum``: rows before each position, ``avail`` the end of the queue): the oldest
    whose rows fit, the first one always (``BatchQueue.form``'s rule, without drops)."""
    return bisect_right(cum, cum[first] + size, first + 2, avail + 1) - 1
