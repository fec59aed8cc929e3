"""Server metrics scraped from a real Prometheus text endpoint on loopback."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from _loopback import serving
from _timing import await_until
from ridgeline.telemetry.scrape import Scraper, parse_metrics
from ridgeline.telemetry.windows import Window


def test_parse_flattens_labels_and_knows_counters() -> None:
    reg = CollectorRegistry()
    c = Counter("nv_inference_count", "rows", ["model"], registry=reg)
    g = Gauge("queue_length", "q", registry=reg)
    c.labels(model="m").inc(7)
    g.set(3)
    values, counters = parse_metrics(generate_latest(reg).decode())
    assert values['nv_inference_count_total{model="m"}'] == 7.0
    assert values["queue_length"] == 3.0
    assert 'nv_inference_count_total{model="m"}' in counters
    assert "queue_length" not in counters


async def test_scraper_gives_windows_counter_deltas() -> None:
    reg = CollectorRegistry()
    c = Counter("served", "requests", registry=reg)

    async def metrics(_: web.Request) -> web.Response:
        c.inc(5)  # five more per scrape
        return web.Response(body=generate_latest(reg), content_type="text/plain")

    async with serving("/metrics", metrics) as url:
        scraper = Scraper(url, interval_s=0.1)
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(scraper.run(time.perf_counter(), stop))
        await await_until(lambda: len(scraper.samples) >= 5, 30, "five scrapes")
        stop.set()
        await task
    assert scraper.failures == 0
    assert len(scraper.samples) >= 5
    firsts = [s["served_total"] for _, s in scraper.samples]
    assert firsts == [5.0 * (i + 1) for i in range(len(firsts))]
    w = Window.model_validate(
        dict(
            index=0,
            start_s=0.0,
            end_s=0.3,
            offered=0,
            ok=0,
            failed=0,
            dropped=0,
            completed_ok=0,
            offered_rps=0,
            achieved_rps=0,
            error_rate=0,
            latency_ms={},
            lateness_p99_ms=None,
        )
    )
    scraper.attach([w])
    assert w.server["served_total"] == 15.0  # samples near 0.0 s and 0.3 s
