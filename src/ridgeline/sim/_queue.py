"""The simulator's event loop: one FIFO queue, ``instances`` executors, batches as
``policies.queue`` forms them.

It is the fake server's ``BatchQueue`` stepped in bulk in virtual time, one *batch* at
a time rather than one event at a time, asking the queue module's questions on columns
(the simulated server has no early dropping):

* While every instance is busy, arrivals only join the queue (or are refused when it holds
  ``max_queue`` requests), so the loop jumps straight to the next completion and admits
  everything that arrived by then with one ``bisect``.
* When an instance is free it asks ``decide`` at that moment; on ``Wait(until)`` each
  arrival up to ``until`` would ask again. Those probes are pure, so instead of one per
  arrival the loop asks ``first_dispatch`` for the first arrival at which it dispatches.
  This assumes the policy is monotone: more rows queued, or a later time, never turns a
  ``Dispatch`` into a ``Wait`` (true of ``decide``: it dispatches on a full batch, a
  formable preferred size, or a passed deadline).
* A batch starts the moment it is dispatched, on any free instance (they are identical),
  and ends when ``service`` says. (The engine starts it at its last request's arrival or
  its deadline, to absorb timer lateness; in virtual time that is the dispatch moment,
  except when a multi-row arrival overflows the batch it completes: then the engine's
  batch starts at an earlier arrival, before the decision, and the simulator's does not.)

Ties: requests arriving at the very moment an instance completes join the queue first,
then the instance decides. Requests arriving together are decided one by one, as the
engine does.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heapreplace

from ridgeline.policies.batching import BatchingConfig, Dispatch, Wait
from ridgeline.policies.queue import batch_end, decide, first_dispatch

Service = Callable[[int, float, int], float]
"""(rows, start, requests served before) → end of the batch, both in step time."""


@dataclass(frozen=True, slots=True)
class QueueRun:
    """What happened to each request, by batch."""

    order: list[int] | None
    """Original index of each admitted request, in queue order (None: none was refused,
    so all, in order)."""
    rejected: list[int]
    """Original indices refused at once because the queue was full."""
    firsts: list[int]
    """Queue position of each batch's first request; a batch runs to the next one's."""
    ends: list[float]
    """When each batch completed."""
    served: int
    """Requests executed."""


def run_queue(
    times: list[float],
    cum: list[int],
    cfg: BatchingConfig,
    instances: int,
    max_queue: int | None,
    service: Service,
) -> QueueRun:
    """Simulate requests arriving at ``times`` (sorted) with ``cum[i]`` rows before
    request ``i`` (``cum[0] == 0``), all instances free at time 0."""
    n = len(times)
    unit = cum[n] == n  # every request one row: a batch of size s takes s requests
    limited = max_queue is not None
    limit = n if max_queue is None else max_queue
    # The queue: arrival times, cumulative rows and original indices of the admitted
    # requests. Until the first refusal they are the arrivals themselves (no copy); from
    # then on they are compacted over refusals.
    at, ac = times, cum
    compact = False
    order: list[int] = []
    rejected: list[int] = []
    firsts: list[int] = []
    ends: list[float] = []
    # Per instance (busy until, completion pending): a completion at the current time is an
    # event, after the arrivals of that instant; a batch that took no time frees at once.
    heap = [(0.0, False)] * instances
    clock = 0.0  # time of the last decision
    nxt = 0  # next arrival not yet seen
    avail = 0  # requests admitted so far; the queue is [qh, avail)
    qh = 0
    served = 0

    def admit(lo: int, hi: int) -> None:
        at.extend(times[lo:hi])
        shift = ac[-1] - cum[lo]
        ac.extend([c + shift for c in cum[lo + 1 : hi + 1]])
        order.extend(range(lo, hi))

    def compacted(kept: int) -> None:
        """Before the first refusal: the queue becomes a copy of the first ``kept``."""
        nonlocal at, ac, compact
        at, ac, compact = times[:kept], cum[: kept + 1], True
        order.extend(range(kept))

    while True:
        now, pending = heap[0]
        if now > clock or (pending and now == clock):
            # Every instance is busy until `now`: arrivals by then only queue.
            heapreplace(heap, (now, False))
            hi = bisect_right(times, now, nxt)
            take = hi - nxt
            if limited:
                take = min(take, max(limit - (avail - qh), 0))
            if take < hi - nxt and not compact:
                compacted(avail)
            if compact:
                admit(nxt, nxt + take)
                rejected.extend(range(nxt + take, hi))
            avail += take
            nxt = hi
        else:
            now = clock
        d: Dispatch | Wait
        if qh == avail:
            # Empty queue, free instance: the next arrival asks at once.
            if nxt == n:
                break
            now = times[nxt]
            if compact:
                admit(nxt, nxt + 1)
            avail += 1
            nxt += 1
            d = decide(ac[avail] - ac[qh], at[qh], now, cfg)
            if isinstance(d, Wait) and avail - qh > limit:
                if compact:
                    at.pop(), ac.pop(), order.pop()
                else:
                    compacted(avail - 1)
                avail -= 1
                rejected.append(nxt - 1)
                clock = now
                continue
        else:
            d = decide(ac[avail] - ac[qh], at[qh], now, cfg)
        while isinstance(d, Wait):
            until = math.inf if d.until is None else d.until
            head, queued = at[qh], ac[avail] - ac[qh]
            hi = bisect_right(times, until, nxt)
            sure = min(hi, nxt + max(limit - (avail - qh), 0))
            k, found = first_dispatch(times, cum, nxt, sure, queued, head, cfg)
            stop = sure if found is None else k + 1
            if compact:
                admit(nxt, stop)
            avail += stop - nxt
            nxt = stop
            if found is not None:
                now, d = times[k], found
                break
            queued = ac[avail] - ac[qh]
            for i in range(sure, hi):  # the queue is full: each arrival asks, then is refused
                di = decide(queued + cum[i + 1] - cum[i], head, times[i], cfg)
                nxt = i + 1
                if isinstance(di, Dispatch):
                    if compact:
                        admit(i, i + 1)
                    avail += 1
                    now, d = times[i], di
                    break
                if not compact:
                    compacted(avail)
                rejected.append(i)
            if isinstance(d, Dispatch):
                break
            if until <= now or math.isinf(until):
                raise RuntimeError(f"batching policy waits for {until} at {now}: it never sends")
            now = until
            d = decide(ac[avail] - ac[qh], head, now, cfg)
        # Dispatch the oldest requests whose rows fit in d.size (the head always goes).
        m = min(qh + max(d.size, 1), avail) if unit else batch_end(ac, qh, avail, d.size)
        end = service(ac[m] - ac[qh], now, served)
        served += m - qh
        heapreplace(heap, (end, end > now))
        firsts.append(qh)
        ends.append(end)
        qh = m
        clock = now
    return QueueRun(order if compact else None, rejected, firsts, ends, served)
