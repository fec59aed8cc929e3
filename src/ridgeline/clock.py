"""Clocks. Everything that decides takes a Clock and never reads time itself.

``MonotonicClock`` reads ``time.perf_counter`` (CLOCK_MONOTONIC on Linux, shared by all
processes of a machine, so generator shards agree on a start time). ``VirtualClock`` is
advanced by hand, for tests and simulations that assert exact timelines.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.perf_counter()


class VirtualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a virtual clock cannot go back")
        self._t += seconds

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError("a virtual clock cannot go back")
        self._t = t
