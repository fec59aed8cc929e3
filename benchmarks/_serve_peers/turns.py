"""Probes of several servers taking turns: one step at a time, in strict rotation.

The host's speed drifts over minutes (these machines are shared): two probes run one
after the other can differ by that drift alone. ``InTurn`` wraps each probe's driver so
that a step (with any settling after it) runs only while its driver holds the shared
turn; ``asyncio.Lock`` hands the turn to waiters first-come first-served, so while both
probes search their steps alternate A B A B and each server is measured in the same
minutes as the other, the other idle meanwhile.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from _serve_peers.settle import SettlingDriver
from ridgeline.loadgen.step import StepResult
from ridgeline.search.base import StepPlan


@dataclass
class InTurn:
    inner: SettlingDriver
    turn: asyncio.Lock
    name: str = "network"

    async def run(self, plan: StepPlan, seed: int, stop: asyncio.Event) -> StepResult:
        async with self.turn:
            return await self.inner.run(plan, seed, stop)

    def describe(self) -> str:
        return self.inner.describe()

    def judge_by(self, latency_bound_ms: float | None) -> None:
        self.inner.judge_by(latency_bound_ms)
