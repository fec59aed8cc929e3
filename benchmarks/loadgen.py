"""Load-generator benchmarks (issue: open-loop load engine). Not a test: `make bench`.

1. Schedule rate against a null in-process target, one process, at p99 lateness ≤ 1 ms.
2. The highest open-loop rate held over v2 HTTP against the fake server (its own
   process, zero service time) with p99 lateness ≤ 1 ms and no errors, from 1 and from
   2 generator processes.
3. In the same run, against the same server: locust (FastHttpUser, constant_throughput)
   — the highest rate it holds — and wrk (closed loop: the server's ceiling).

"Held" means every scheduled request sent, answered without error, achieved ≥ 99 % of
offered; for ridgeline also p99 lateness ≤ 1 ms (locust cannot report lateness, so it is
judged on achieved rate alone — a criterion more lenient to it).
Results are printed as Markdown rows and appended to docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ridgeline.fakeserver import load_preset, running_in_process
from ridgeline.loadgen.replayer import ReplayConfig
from ridgeline.loadgen.runloop import run_coroutine
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, measure_step
from ridgeline.workload.arrivals import parse_arrival

ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps(
    {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [1, 16],
                "data": [float(i) for i in range(16)],
            }
        ]
    }
)


def ours(url: str, rate: float, duration: float, processes: int = 1) -> dict[str, float]:
    sched = from_arrival(parse_arrival("constant", rate), duration)
    cfg = StepConfig(processes=processes, replay=ReplayConfig(timeout_s=5.0))
    res = run_coroutine(measure_step(url, sched, cfg)).summary
    held = (
        res.valid
        and res.errors + res.timeouts + res.incomplete == 0
        and res.achieved_rps >= 0.99 * res.offered_rps
    )
    return {
        "rate": rate,
        "held": float(held),
        "achieved": res.achieved_rps,
        "lateness_p99_ms": res.lateness_ms.p99 or 0.0,
        "p99_ms": res.latency_ms.p99 or 0.0,
    }


def locust(host: str, rate: float, duration: float) -> dict[str, float]:
    per_user = 10.0
    users = max(1, round(rate / per_user))
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "RIDGELINE_BENCH_BODY": BODY,
            "RIDGELINE_BENCH_PER_USER_RPS": str(per_user),
        }
        subprocess.run(
            [
                sys.executable,
                "-m",
                "locust",
                "-f",
                str(ROOT / "benchmarks" / "locustfile.py"),
                "--headless",
                "-u",
                str(users),
                "-r",
                str(users),
                "-t",
                f"{duration + 2:g}s",
                "--host",
                host,
                "--csv",
                f"{tmp}/l",
                "--only-summary",
                "--loglevel",
                "ERROR",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=duration + 60,
        )
        with open(f"{tmp}/l_stats_history.csv") as f:
            rows = list(csv.DictReader(f))
    rows = [r for r in rows if r["Name"] == "Aggregated"]
    # steady part only: from 2 s after the start (all users spawned) to the end
    t0 = int(rows[0]["Timestamp"]) + 2
    steady = [r for r in rows if int(r["Timestamp"]) >= t0]
    first, last = steady[0], steady[-1]
    span = int(last["Timestamp"]) - int(first["Timestamp"])
    done = int(last["Total Request Count"]) - int(first["Total Request Count"])
    fails = int(last["Total Failure Count"])
    achieved = done / span if span > 0 else 0.0
    return {
        "rate": users * per_user,
        "held": float(fails == 0 and achieved >= 0.99 * users * per_user),
        "achieved": achieved,
    }


def highest_held(
    measure: Callable[[float], dict[str, float]], start: float, bisections: int = 4
) -> tuple[float, list[dict[str, float]]]:
    """Double the rate until a step is not held, then bisect between held and not."""
    trail: list[dict[str, float]] = []
    lo, hi, rate = 0.0, None, start
    while hi is None:
        r = measure(rate)
        trail.append(r)
        print(f"  {r}", flush=True)
        if r["held"]:
            lo, rate = rate, rate * 2
        else:
            hi = rate
        if rate > 2_000_000:
            break
    for _ in range(bisections if hi is not None else 0):
        mid = (lo + hi) / 2  # type: ignore[operator]
        r = measure(mid)
        trail.append(r)
        print(f"  {r}", flush=True)
        lo, hi = (mid, hi) if r["held"] else (lo, mid)
    return lo, trail


def wrk(model_url: str, duration: float) -> float | None:
    if shutil.which("wrk") is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(
            f'wrk.method = "POST"\nwrk.body = {json.dumps(BODY)}\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
    out = subprocess.run(
        ["wrk", "-t1", "-c32", f"-d{duration:g}s", "-s", f.name, model_url + "/infer"],
        capture_output=True,
        text=True,
        check=True,
    )
    for line in out.stdout.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    return None


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()}"


def main() -> None:
    duration = float(os.environ.get("RIDGELINE_BENCH_DURATION", "4"))
    print("1. null in-process target, 1 process", flush=True)
    null_rate, _ = highest_held(lambda r: ours("null://", r, duration), 25_000, bisections=3)
    results = {"null_rps": null_rate}
    with running_in_process(load_preset("fast"), grpc_port=None) as srv:
        for p in (1, 2):
            print(f"2. v2 HTTP, fake server, {p} generator process(es)", flush=True)
            results[f"http_{p}p_rps"], _ = highest_held(
                lambda r, p=p: ours(srv.model_url, r, duration, p), 500
            )
        print("3. locust FastHttpUser constant_throughput, 1 process", flush=True)
        results["locust_rps"], _ = highest_held(lambda r: locust(srv.http_url, r, duration), 500)
        print("3. wrk, 1 thread, 32 connections (closed loop)", flush=True)
        results["wrk_rps"] = wrk(srv.model_url, duration) or float("nan")
    locust_rps = results["locust_rps"]
    ratio = results["http_1p_rps"] / locust_rps if locust_rps else float("inf")
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    rows = [
        f"| {date} | loadgen | schedule rate, null in-process target, 1 process,"
        " p99 lateness ≤ 1 ms"
        f" | {results['null_rps']:,.0f}/s | goal ≥ 100,000/s |",
        f"| {date} | loadgen | v2 HTTP to fake server (own process), 1 generator process,"
        " held"
        f" | {results['http_1p_rps']:,.0f}/s | locust {results['locust_rps']:,.0f}/s:"
        f" **{ratio:.2f}×** (goal ≥ 2×) |",
        f"| {date} | loadgen | v2 HTTP to fake server, 2 generator processes, held"
        f" | {results['http_2p_rps']:,.0f}/s | wrk (closed loop, 32 conns) "
        f"{results['wrk_rps']:,.0f}/s |",
    ]
    print("\n".join(rows))
    print(json.dumps(results))
    doc = ROOT / "docs" / "benchmarks.md"
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1" and doc.exists():
        with doc.open("a") as f:
            f.write(f"\n<!-- make bench, {date}, {machine()} -->\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    t = time.time()
    main()
    print(f"took {time.time() - t:.0f} s")
