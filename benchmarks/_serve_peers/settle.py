"""A network driver that lets a server work off its backlog before the next step.

When a step overloads a server, requests time out at the client, but the server goes on
parsing and running them (none of the three cancels work whose client has gone), so the
next step would start behind a backlog the search did not ask for. After a step with
timeouts or unanswered requests, ``SettlingDriver`` sends lone requests until one is
answered about as fast as on the idle server — the same rule for every server measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from ridgeline.loadgen.step import StepResult
from ridgeline.probe.drivers import NetworkDriver
from ridgeline.search.base import StepPlan
from ridgeline.targets.factory import make_target
from ridgeline.targets.options import TargetOptions
from ridgeline.v2.spec import TensorSpec
from ridgeline.workload.payloads import RequestShape


@dataclass
class SettlingDriver:
    inner: NetworkDriver
    inputs: tuple[TensorSpec, ...]
    max_wait_s: float = 60.0
    name: str = "network"
    idle_s: float | None = None
    """The fastest lone request seen: the idle server's latency."""

    async def run(self, plan: StepPlan, seed: int, stop: asyncio.Event) -> StepResult:
        if self.idle_s is None:
            self.idle_s = min(await self._lone(5))
        result = await self.inner.run(plan, seed, stop)
        s = result.summary
        if (s.timeouts or s.incomplete) and not stop.is_set():
            await self._settle(stop)
        return result

    def describe(self) -> str:
        return self.inner.describe()

    def judge_by(self, latency_bound_ms: float | None) -> None:
        self.inner.judge_by(latency_bound_ms)

    async def _settle(self, stop: asyncio.Event) -> None:
        assert self.idle_s is not None
        began = time.perf_counter()
        while not stop.is_set() and time.perf_counter() - began < self.max_wait_s:
            (latency,) = await self._lone(1)
            self.idle_s = min(self.idle_s, latency)
            if latency <= 2 * self.idle_s + 0.005:
                print(f"  (backlog worked off in {time.perf_counter() - began:.1f} s)", flush=True)
                return
            await asyncio.sleep(0.5)
        print(f"  (still behind after {self.max_wait_s:g} s: going on)", flush=True)

    async def _lone(self, count: int) -> list[float]:
        """The latencies of ``count`` requests sent one after another."""
        target = make_target(self.inner.url, TargetOptions(inputs=self.inputs))
        await target.connect(1)
        try:
            latencies = []
            for _ in range(count):
                began = time.perf_counter()
                with contextlib.suppress(TimeoutError):  # a stuck server: counted as slow
                    await asyncio.wait_for(target.send(RequestShape()), self.max_wait_s)
                latencies.append(time.perf_counter() - began)
            return latencies
        finally:
            await target.close()
