"""Load generators: where a step's requests are sent from, behind one contract.

A ``LoadGenerator`` checks that the target answers (``connect``), sends a whole
schedule from now on (``run``) and lets go of what it holds (``close``). Three meet it:

* ``InLoop``: this process's event loop (``replayer.replay``);
* ``InProcesses``: local generator processes, each every N-th arrival (``shard.py``);
* ``OnRay``: generator actors on a Ray cluster (``distributed.py``; Ray is imported
  only when one runs).

``loadgen.step.generator_for`` picks one from a step's settings; the step never asks
which it got.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from ridgeline.errors import TargetError
from ridgeline.loadgen.distributed import replay_on_ray
from ridgeline.loadgen.replayer import Progress, ReplayConfig, replay
from ridgeline.loadgen.schedule import Schedule
from ridgeline.loadgen.shard import Sending, replay_sharded
from ridgeline.loadgen.validity import ValidityConfig
from ridgeline.targets.base import Target
from ridgeline.targets.factory import make_target
from ridgeline.targets.options import TargetOptions
from ridgeline.telemetry.records import Records
from ridgeline.telemetry.summary import WorkerLoad


@dataclass
class Sent:
    """What a generator sent and measured of one schedule."""

    records: Records
    """One row per scheduled request (a lost Ray worker's: NOT_SENT)."""
    measured: Records
    """What the step's validity judges: the records of the generators that finished."""
    processes: int
    """Generators that sent it."""
    parts: list[Records | None] | None = None
    """Each Ray worker's own records (None: it was lost); None off Ray."""
    workers: list[WorkerLoad] | None = None
    """Each Ray worker's load; None off Ray."""
    problems: list[str] = field(default_factory=list)
    """Why a generator makes the step invalid (a worker behind or lost), one line each."""


class LoadGenerator(Protocol):
    """Sends a schedule to one target and hands back its records."""

    async def connect(self) -> None:
        """The connect check, before anything is sent (``TargetUnreachableError``)."""
        ...

    async def run(
        self, schedule: Schedule, *, stop: asyncio.Event, progress: Progress | None
    ) -> Sent:
        """Send ``schedule`` from now on; ``stop`` ends sending early."""
        ...

    async def close(self) -> None:
        """Let go of the connections ``connect`` made (whether or not ``run`` ran)."""
        ...


@dataclass
class _Generator:
    """What every generator is given: the target, its options, how to replay."""

    url: str
    options: TargetOptions
    replay: ReplayConfig

    def sending(self, schedule: Schedule) -> Sending:
        """``schedule``'s requests to the target, as processes and workers share them."""
        return Sending(self.url, self.options, schedule.times, schedule.shapes, self.replay)


@dataclass
class InLoop(_Generator):
    """Sends from this process's event loop, through one connected target."""

    _target: Target | None = None

    async def connect(self) -> None:
        self._target = make_target(self.url, self.options)
        await self._target.connect(self.replay.max_outstanding)

    async def run(
        self, schedule: Schedule, *, stop: asyncio.Event, progress: Progress | None
    ) -> Sent:
        if self._target is None:
            raise TargetError("the in-loop generator was asked to run before it connected")
        records = await replay(
            self._target, schedule.times, schedule.shapes, self.replay, stop=stop, progress=progress
        )
        return Sent(records, records, processes=1)

    async def close(self) -> None:
        if self._target is not None:
            await self._target.close()


@dataclass
class InProcesses(_Generator):
    """Sends from ``processes`` local generator processes sharing one start."""

    processes: int

    async def connect(self) -> None:
        """Checked here, then closed: each process connects on its own."""
        target = make_target(self.url, self.options)
        await target.connect(self.replay.max_outstanding)
        await target.close()

    async def run(
        self, schedule: Schedule, *, stop: asyncio.Event, progress: Progress | None
    ) -> Sent:
        records = await replay_sharded(
            self.sending(schedule), self.processes, stop=stop, progress=progress
        )
        return Sent(records, records, processes=self.processes)

    async def close(self) -> None:
        """Nothing is held: the processes have ended."""


@dataclass
class OnRay(_Generator):
    """Sends from generator actors on the Ray cluster at ``workers``."""

    workers: str
    count: int
    validity: ValidityConfig

    async def connect(self) -> None:
        """Nothing here: every worker makes the connect check before any sends."""

    async def run(
        self, schedule: Schedule, *, stop: asyncio.Event, progress: Progress | None
    ) -> Sent:
        spread = await replay_on_ray(
            self.sending(schedule),
            workers=self.workers,
            count=self.count,
            validity=self.validity,
            stop=stop,
            progress=progress,
        )
        return Sent(
            spread.records,
            spread.measured,
            processes=len(spread.workers),
            parts=spread.parts,
            workers=spread.workers,
            problems=spread.problems,
        )

    async def close(self) -> None:
        """Nothing is held: the actors were ended."""
