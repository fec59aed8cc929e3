"""Faults that held when issue 14's tester tried them, kept as tests so they keep holding:
several processes writing one run store at once, and a fake server serving a long
stream of requests with every one of them counted and its memory flat."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sqlite3
import urllib.request
from pathlib import Path

import pytest

from _records import answered
from ridgeline.fakeserver import load_preset, running_in_process
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.telemetry.records import Outcome
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import summarize
from ridgeline.telemetry.windows import windows
from ridgeline.workload.arrivals import parse_arrival

WRITERS, RUNS_EACH, REQUESTS = 4, 5, 300


def _write_runs(path: str, writer: int) -> None:
    rec = answered(REQUESTS)
    duration = REQUESTS / 100.0
    with RunStore(path) as store:
        for k in range(RUNS_EACH):
            run_id = store.create_run("run", f"writer-{writer}", {"writer": writer, "k": k})
            summary = summarize(rec, duration, valid=True, invalid_reason=None)
            store.add_step(run_id, 0, summary, windows(rec, duration), rec)
            store.finish_run(run_id, "complete", None)


@pytest.mark.timeout(120)
def test_processes_writing_one_store_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    RunStore(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_runs, args=(str(path), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(100)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    with RunStore(path) as store:
        runs = store.list_runs(limit=1000)
        assert len(runs) == WRITERS * RUNS_EACH
        assert {r["status"] for r in runs} == {"complete"}
        for r in runs:
            step = store.get_run(r["id"])["steps"][0]
            assert store.request_count(step["id"]) == REQUESTS
    (check,) = sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()
    assert check == "ok"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


def _server_successes(model_url: str) -> int:
    with urllib.request.urlopen(f"{model_url}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_soak_counts_every_request_and_the_server_memory_stays_flat() -> None:
    """Three steps of 900 requests (3 s at 300 req/s, half the default preset's 615
    req/s) to a fake server in its own process: every request sent is answered and
    counted on both sides, and the server's resident memory after the third step is
    within 20 MiB of what it was after the first (1,800 requests later)."""
    with running_in_process(load_preset("default"), grpc_port=None) as srv:
        (proc,) = [p for p in multiprocessing.active_children() if p.name.startswith("fake")]
        assert proc.pid is not None
        rss, answered = [], 0
        for seed in range(3):
            schedule = from_arrival(parse_arrival("poisson", 300.0), 3.0, seed=seed)
            step = asyncio.run(measure_step(srv.model_url, schedule, StepConfig()))
            ok = int((step.records.outcome == int(Outcome.OK)).sum())
            assert ok == step.summary.sent == len(schedule.times)
            answered += ok
            assert _server_successes(srv.model_url) == answered
            rss.append(_rss_kib(proc.pid))
    assert rss[2] - rss[0] < 20 * 1024, f"server RSS after each step (KiB): {rss}"
