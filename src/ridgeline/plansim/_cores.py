"""CPU cores shared by instances: processor sharing, in virtual time.

On a host with fewer cores than the plan's CPU instances ask for, the runtime pins
several instances to one core (``Plan.core_assignment``), and batches that run at once
there take turns on it. The simulator models that as processor sharing: a batch's work
is the time it takes alone (its profiled time, noise included), and while it runs it
advances at rate ``1 / n``, where ``n`` is the most batches running at once on any of
its cores (a batch on several cores, one thread each, goes at the pace of its most
crowded core). Two batches of 10 ms that start together on one core both end at 20 ms;
a batch of 10 ms joined at 5 ms by another ends at 15 ms, the other at 20 ms. The
sharing is work-conserving: a core is never idle while a batch pinned to it is
unfinished.

Only instances that share a core with another are tracked here; the rest keep the
engine's plain path (one event per batch, at its start plus its time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_DONE_S = 1e-9
"""Work left below this (a nanosecond) is rounding: the batch ends now."""


class Running:
    """A batch on shared cores: its work left (seconds alone) as of ``last``, its rate,
    when it will end at that rate, and a version that its end event must carry (a
    change of rate moves the end and makes the earlier event stale)."""

    __slots__ = (
        "batch",
        "cores",
        "finish",
        "last",
        "left",
        "owner",
        "rate",
        "rows",
        "slot",
        "start",
        "ver",
    )

    def __init__(
        self,
        owner: Any,
        slot: int,
        batch: list[Any],
        rows: int,
        work_s: float,
        cores: tuple[int, ...],
        now: float,
    ) -> None:
        self.owner = owner
        """The engine's task it runs for."""
        self.slot, self.batch, self.rows, self.cores = slot, batch, rows, cores
        self.start = self.last = now
        self.left = work_s
        self.rate = 0.0
        self.finish = -1.0
        self.ver = 0


class SharedCores:
    """The batches running on each shared core."""

    __slots__ = ("_on",)

    def __init__(self) -> None:
        self._on: dict[int, list[Running]] = {}

    def start(self, run: Running, now: float) -> list[Running]:
        """``run`` starts now; returns every run whose end moved (``run`` among them)."""
        for c in run.cores:
            self._on.setdefault(c, []).append(run)
        return self._reshare(self._beside(run), now)

    def end(self, run: Running, now: float) -> list[Running]:
        """``run`` ends now; returns every other run whose end moved."""
        run.ver = -1
        for c in run.cores:
            self._on[c].remove(run)
        return self._reshare(self._beside(run), now)

    def _beside(self, run: Running) -> list[Running]:
        """The runs on any of ``run``'s cores (``run`` too while it runs), in the order
        they started there."""
        out: list[Running] = []
        for c in run.cores:
            for r in self._on[c]:
                if r not in out:
                    out.append(r)
        return out

    def _reshare(self, runs: list[Running], now: float) -> list[Running]:
        on, moved = self._on, []
        for r in runs:
            rate = 1.0 / max(len(on[c]) for c in r.cores)
            if rate == r.rate:
                continue
            left = r.left - r.rate * (now - r.last)
            r.left = left if left > _DONE_S else 0.0
            r.last, r.rate = now, rate
            finish = now + r.left / rate
            if finish != r.finish:
                r.finish = finish
                r.ver += 1
                moved.append(r)
        return moved


def contended(
    pinned: Mapping[str, Sequence[tuple[int, ...]]],
) -> dict[str, list[tuple[int, ...] | None]]:
    """Per task, each instance's cores if it shares one with another instance, else
    None (it runs as if alone)."""
    users: dict[int, int] = {}
    for slots in pinned.values():
        for cores in slots:
            for c in cores:
                users[c] = users.get(c, 0) + 1
    return {
        name: [cores if any(users[c] > 1 for c in cores) else None for cores in slots]
        for name, slots in pinned.items()
    }
