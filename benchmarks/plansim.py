"""Plan-simulator throughput: requests simulated per minute of wall time. Not a test.

The example plan (`examples/plans/traffic-cpu.yaml`: detect → car ×2, face ×1, one CPU
core each) with the example profile table, Poisson arrivals at 120/s (the detector about
70 % busy, batches forming), batch-time noise CV 0.1, early dropping on: REQUESTS
requests, made and simulated (`arrival_schedule` + `simulate_plan`, the whole call
`ridgeline simulate` makes), timed end to end; the median of RUNS runs. Goal: ≥ 1,000,000
requests a wall minute on a slow 2-core machine.

    .venv/bin/python benchmarks/plansim.py [--requests 1000000] [--runs 3] [--cpu-cores N]
        [--no-doc]

`--cpu-cores 2` pins the instances to two cores as the runtime would (detect and face
share one) and times the simulator with processor sharing on.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from _doc import add_rows, ensure_section, machine

from ridgeline.pipeline.plan import load_plan
from ridgeline.pipeline.profiles import load_profiles
from ridgeline.plansim import PlanSimResult, SimConfig, arrival_schedule, simulate_plan

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "examples" / "plans" / "traffic-cpu.yaml"
PROFILES = ROOT / "examples" / "profiles" / "traffic-cpu.csv"
RATE = 120.0
GOAL = 1_000_000
HEADING = "## Plan simulator (`benchmarks/plansim.py`)"
INTRO = [
    "Command: `.venv/bin/python benchmarks/plansim.py`. The example plan (three tasks, the",
    "example profile table) under Poisson arrivals at 120/s, noise CV 0.1, early dropping on:",
    "the arrivals made and simulated, timed end to end, median of 3 runs.",
    "",
    "| date | what | setup | result | goal | machine |",
    "|---|---|---|---|---|---|",
]


def once(requests: int, seed: int, cpu_cores: int | None) -> tuple[float, PlanSimResult]:
    plan, profiles = load_plan(PLAN), load_profiles(PROFILES)
    began = time.perf_counter()
    schedule = arrival_schedule("poisson", rate=RATE, duration_s=requests / RATE, seed=seed)
    result = simulate_plan(
        plan, schedule, SimConfig(seed=seed, noise_cv=0.1, cpu_cores=cpu_cores), profiles
    )
    return time.perf_counter() - began, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000, help="requests per run")
    parser.add_argument("--runs", type=int, default=3, help="runs (median)")
    parser.add_argument(
        "--cpu-cores", type=int, default=None, help="host cores shared (default: none)"
    )
    parser.add_argument("--no-doc", action="store_true", help="print only")
    args = parser.parse_args()
    per_min = []
    for seed in range(args.runs):
        wall, r = once(args.requests, seed, args.cpu_cores)
        per_min.append(r.requests / wall * 60.0)
        busy = ", ".join(f"{t.name} {t.utilisation:.0%}" for t in r.tasks)
        print(
            f"seed {seed}: {r.requests:,} requests ({r.simulated_s:,.0f} simulated s) in "
            f"{wall:.2f} s: {per_min[-1]:,.0f}/min; p99 {r.latency_ms['p99']:.1f} ms, "
            f"violations {r.violation_rate:.3%}; busy {busy}",
            flush=True,
        )
    median = statistics.median(per_min)
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    runs = ", ".join(f"{m / 1e6:.2f} M" for m in per_min)
    row = (
        f"| {date} | plan simulator throughput | `examples/plans/traffic-cpu.yaml` (3 tasks, "
        f"example profiles), Poisson {RATE:g}/s, {args.requests:,} requests a run"
        f"{'' if args.cpu_cores is None else f', on {args.cpu_cores} shared cores'} |"
        f" {median / 1e6:.2f} M requests / wall minute (runs: {runs}) | ≥ 1 M/min: "
        f"**{'met' if median >= GOAL else 'not met'}** | {machine()} |"
    )
    print(row)
    if not args.no_doc:
        ensure_section(HEADING, INTRO)
        add_rows(HEADING, f"benchmarks/plansim.py, {date}", [row])


if __name__ == "__main__":
    main()
