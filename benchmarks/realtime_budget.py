"""Real time under a budget (issue 34): `ridgeline probe URL --budget 5m`, run as a user
runs it, five times, against the long-run truth of the same server. Not a test:
`make bench`.

Issue 34 asks: "`ridgeline probe` of a local server with a capacity between 100 and
1,000 req/s (the fake server, configured as no test or constant was set on), confirmed
within ±5 % of its long-run truth in at most 5 minutes of load, 5 runs, distribution
reported". The server is realtime.py's *fresh* one (`benchmarks/realtime_fresh.yaml`,
drawn once with a fixed seed from stated ranges; no probe constant was set on it) under
its `p99<85ms,errors<0.1%`.

1. The truth, apart from the probe, on a server process of its own: long Poisson runs
   (`ridgeline run URL --rate R --duration RIDGELINE_RT_TRUTH_S (90) --json --seed j`,
   each after RIDGELINE_RT_PAUSE_S idle), judged over all their requests as realtime.py
   judges them (valid; the p99 from the schedule within the bound; errors within the
   SLO's; ≥ 95 % of the scheduled requests answered OK), bisected geometrically between
   RIDGELINE_RT_TRUTH_LOW (100) and RIDGELINE_RT_TRUTH_HIGH (753: the server's raw
   throughput, which no rate can exceed) for RIDGELINE_RT_TRUTH_ROUNDS (7) runs: the
   truth lies between the highest rate held and the lowest failed.
   RIDGELINE_RT_TRUTH="HELD,FAILED" takes that bracket from an earlier run instead (its
   rows say so).
2. Five probes (RIDGELINE_RT_BUDGET_PROBES), seeds 0-4, each on a fresh server process:
   `python -m ridgeline probe URL --slo SLO --budget 5m --json --seed k` (the CLI's
   defaults otherwise), bounded at 5 minutes of load plus 2 of slack (then SIGINT). Per
   probe: its answer and interval (✗ where the interval misses the truth's bracket),
   whether confirmed, its test-seconds and wall time.

An answer is within ±5 % when it lies within 5 % of the truth's bracket (at or above
0.95 × the highest rate held and at or below 1.05 × the lowest failed). Rows are printed
and appended to docs/benchmarks.md unless RIDGELINE_BENCH_NO_WRITE=1. A smoke run:

    RIDGELINE_RT_TRUTH_S=5 RIDGELINE_RT_TRUTH_ROUNDS=2 RIDGELINE_RT_BUDGET_PROBES=1 \
    RIDGELINE_RT_BUDGET=40s RIDGELINE_BENCH_NO_WRITE=1 .venv/bin/python \
    benchmarks/realtime_budget.py
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from _doc import add_rows, ensure_section
from realtime import (
    HOLD_SERVERS,
    PAUSE_S,
    ProbeOutcome,
    _env_float,
    judge,
    long_run,
    machine,
    run_probe,
    serving,
)

from ridgeline.cli._common import parse_duration
from ridgeline.health.slo import parse_slo

HEADING = "## Real time under `--budget 5m` (issue 34) (`benchmarks/realtime_budget.py`)"
SERVER = HOLD_SERVERS["fresh"]


def truth(where: Path) -> tuple[float | None, float | None, list[str]]:
    """(highest rate held, lowest failed, each run's note) by geometric bisection."""
    policy = parse_slo(SERVER.slo)
    duration = _env_float("RIDGELINE_RT_TRUTH_S", 90.0)
    low, high = (
        _env_float("RIDGELINE_RT_TRUTH_LOW", 100.0),
        _env_float("RIDGELINE_RT_TRUTH_HIGH", 753.0),
    )
    held: float | None = None
    failed: float | None = None
    notes = []
    with serving(SERVER, where) as url:
        for k in range(int(_env_float("RIDGELINE_RT_TRUTH_ROUNDS", 7))):
            rate = math.sqrt(low * high)
            time.sleep(PAUSE_S)  # what an earlier run left queued is served first
            passed, note = judge(
                long_run(url, rate, duration, where / "truth.db", seed=k + 1), policy
            )
            notes.append(f"{rate:,.1f} {'✓' if passed else '✗'}")
            print(f"truth: {rate:8.1f}/s {'pass' if passed else 'FAIL'} {note}", flush=True)
            if passed:
                low, held = rate, rate
            else:
                high, failed = rate, rate
    return held, failed, notes


def main() -> None:
    budget = os.environ.get("RIDGELINE_RT_BUDGET", "5m")
    budget_s = parse_duration(budget, "RIDGELINE_RT_BUDGET")
    probes = int(_env_float("RIDGELINE_RT_BUDGET_PROBES", 5))
    server = replace(SERVER, probe_args=("--budget", budget), probe_budget_s=budget_s + 120.0)
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rt-budget-") as tmp:
        where = Path(tmp)
        given = os.environ.get("RIDGELINE_RT_TRUTH")  # "HELD,FAILED" of an earlier run
        held: float | None
        failed: float | None
        if given:
            held, failed = (float(x) for x in given.split(","))
            notes = [f"from an earlier run (RIDGELINE_RT_TRUTH={given})"]
        else:
            held, failed, notes = truth(where)
        truth_s = time.monotonic() - t0
        answers = []
        for seed in range(probes):
            with serving(server, where) as url:
                p = run_probe(url, server, where, seed)
            answers.append(p)
            print(f"probe {seed}: {p.estimate} confirmed={p.confirmed} {p.test_s:.0f} test-s "
                  f"{p.wall_s:.0f} s wall: {p.reason}", flush=True)  # fmt: skip
    lo = None if held is None else 0.95 * held
    hi = None if failed is None else 1.05 * failed

    def within(e: float | None) -> bool:
        return e is not None and (lo is None or e >= lo) and (hi is None or e <= hi)

    def error(e: float | None) -> str:
        if e is None or held is None or failed is None:
            return "—"
        if e < held:
            return f"{e / held - 1:+.1%}"
        return f"{e / failed - 1:+.1%}" if e > failed else "in the bracket"

    def interval(p: ProbeOutcome) -> str:
        low = "—" if p.ci_low is None else f"{p.ci_low:,.1f}"
        high = "—" if p.ci_high is None else f"{p.ci_high:,.1f}"
        return f"[{low}, {high}]"

    def holds(p: ProbeOutcome) -> bool:
        """Whether the interval meets the truth's bracket [held, failed)."""
        return (p.ci_low is None or failed is None or p.ci_low < failed) and (
            p.ci_high is None or held is None or p.ci_high >= held
        )

    bracket = f"[{held or 0:,.1f}, {failed or math.inf:,.1f})"
    rows = [
        f"| {date} | {SERVER.describe()} | `{SERVER.slo}` | `--budget {budget}`, seed {k} | "
        f"{bracket} | {'none' if p.estimate is None else f'{p.estimate:,.1f}/s'}"
        f"{' (confirmed)' if p.confirmed else ''} {interval(p)}"
        f"{'' if holds(p) else ' ✗'} | {error(p.estimate)} | "
        f"{'yes' if within(p.estimate) else 'no'} | {p.test_s:,.0f} s ({p.wall_s:,.0f} s wall) | "
        f"{p.reason[:300]} |"
        for k, p in enumerate(answers)
    ]
    inside = sum(within(p.estimate) for p in answers)
    rows.append(
        f"| **all** | | | {len(answers)} probes | truth runs: {', '.join(notes)} "
        f"({truth_s:,.0f} s) | {sum(p.estimate is not None for p in answers)} answered; "
        f"{sum(holds(p) for p in answers)} of {len(answers)} intervals meet the truth's "
        "bracket | | "
        f"**{inside} of {len(answers)}** | most {max(p.test_s for p in answers):,.0f} s | "
        f"{machine()} |"
    )
    print("\n".join(rows))
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") == "1":
        return
    ensure_section(
        HEADING,
        [
            "Command: `.venv/bin/python benchmarks/realtime_budget.py` (method in its",
            "docstring): the fresh fake server's long-run truth bracketed by bisection",
            "(90 s Poisson runs judged over all their requests), then five probes under",
            "`--budget 5m`, each on a fresh server process. Within ±5 %: the answer lies",
            "within 5 % of the truth's bracket.",
            "",
            "| date | server | SLO | probe | truth bracket (req/s) | answer | error | "
            "within ±5 % | load (wall) | reason |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ],
    )
    add_rows(HEADING, f"benchmarks/realtime_budget.py, {date}, {machine()}", rows)


if __name__ == "__main__":
    main()
