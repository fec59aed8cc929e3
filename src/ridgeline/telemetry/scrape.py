"""Server metrics scraped from a Prometheus text endpoint beside the load.

Samples are taken every ``interval_s`` during a step; each window then gets counter
deltas and gauge values over its span, keyed ``name`` or ``name{label="v",...}``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ridgeline.aio import wait_event
from ridgeline.errors import TargetUnreachableError
from ridgeline.telemetry.summary import ServerMetrics
from ridgeline.telemetry.windows import Window

Sample = dict[str, float]


def parse_metrics(text: str) -> tuple[Sample, set[str]]:
    """Flatten Prometheus exposition text; also return the keys that are counters."""
    values: Sample = {}
    counters: set[str] = set()
    for family in text_string_to_metric_families(text):
        monotone = family.type in ("counter", "histogram", "summary")
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            key = f"{s.name}{{{labels}}}" if labels else s.name
            values[key] = float(s.value)
            if monotone and not s.name.endswith(("_created", "_gsum")):
                counters.add(key)
    return values, counters


@dataclass
class Scraper:
    url: str
    interval_s: float = 1.0
    samples: list[tuple[float, Sample]] = field(default_factory=list)
    counters: set[str] = field(default_factory=set)
    failures: int = 0

    async def scrape_once(self, session: aiohttp.ClientSession, t0: float) -> None:
        async with session.get(self.url) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise TargetUnreachableError(
                    f"metrics endpoint {self.url} answered HTTP {resp.status}"
                )
        values, counters = parse_metrics(text)
        self.counters |= counters
        self.samples.append((time.perf_counter() - t0, values))

    async def run(self, t0: float, stop: asyncio.Event) -> None:
        """Scrape until ``stop`` is set; failures are counted, not raised."""
        timeout = aiohttp.ClientTimeout(total=max(self.interval_s, 1.0))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    await self.scrape_once(session, t0)
                except (aiohttp.ClientError, TimeoutError, TargetUnreachableError, ValueError):
                    self.failures += 1
                if stop.is_set():
                    return
                await wait_event(stop, self.interval_s)

    def attach(self, wins: list[Window]) -> None:
        """Give each window the counter deltas and gauge values between the samples
        nearest its start and its end."""
        if len(self.samples) < 2:
            return
        for w in wins:
            before = _nearest(self.samples, w.start_s)
            after = _nearest(self.samples, w.end_s)
            if before is after:
                continue
            w.server = {
                k: (v - before.get(k, 0.0)) if k in self.counters else v for k, v in after.items()
            }

    def summary(self) -> ServerMetrics:
        """The step's figures: each counter's increase between the first sample and the
        last, each gauge's peak over all of them."""
        increase: dict[str, float] = {}
        peak: dict[str, float] = {}
        if self.samples:
            first, last = self.samples[0][1], self.samples[-1][1]
            for key, value in last.items():
                if key in self.counters:
                    increase[key] = value - first.get(key, 0.0)
                else:
                    peak[key] = max(sample.get(key, value) for _, sample in self.samples)
        return ServerMetrics(
            url=self.url,
            increase=increase,
            peak=peak,
            scrapes=len(self.samples),
            failures=self.failures,
        )


def _nearest(samples: list[tuple[float, Sample]], t: float) -> Sample:
    return min(samples, key=lambda s: abs(s[0] - t))[1]
