"""How confident should the runtime be before it drops a request? (issue 13). Not a
test: `make bench`.

The development set the drop decision's confidence (`policies.dropping.SLACK_QUANTILE`)
was set on: the traffic app's plans on 8 A100-80GB (roofline rows), at the spec's SLO
and at half of it, made by the MILP at the spec demand (unchecked: the check would size
each up until drops vanish), served in the simulator at that demand under Poisson
arrivals and under the bundled trace overlaid (seed 7, 20,000 requests): the share late
or dropped for each slack quantile, and with no dropping at all. Every setting tried is
a row. The other apps, H100 and the real runtime are judged on the value chosen
(`benchmarks/plan_check.py`, `tests/test_serve.py`).

Rows go to docs/benchmarks.md unless RIDGELINE_BENCH_NO_WRITE=1.
"""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from _doc import add_rows, ensure_section, machine

from ridgeline.pipeline.planned import to_plan
from ridgeline.pipeline.planner import plan_pipeline
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.pipeline.roofline import modelled_rows
from ridgeline.pipeline.spec import load_spec
from ridgeline.plansim import SimConfig, arrival_schedule, simulate_plan
from ridgeline.workload.traces import bundled_trace_path

ROOT = Path(__file__).resolve().parent.parent
GPU = "A100-80GB"
QUANTILES = (0.75, 0.9, 0.95, 0.995)
REQUESTS = 20_000
HEADING = "## The drop decision's confidence (`benchmarks/drop_rule.py`)"


def main() -> None:
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    spec = load_spec(ROOT / "examples" / "specs" / "traffic.yaml")
    table = ProfileTable(
        modelled_rows(
            [v for t in spec.tasks.values() for v in t.variants], GPU, (1, 2, 4, 8, 16, 32)
        )
    )
    rows: list[str] = []
    for tight, slo in (("loose", spec.slo_ms), ("tight", spec.slo_ms / 2)):
        s = spec.model_copy(update={"slo_ms": slo})
        d = s.demand_rps
        plan = to_plan(plan_pipeline(s, table, {GPU: 56.0}))
        for q in (None, *QUANTILES):
            cells = []
            for kw in (
                {"arrival": "poisson", "rate": d},
                {"trace": bundled_trace_path(), "target_rate": d},
            ):
                schedule = arrival_schedule(duration_s=REQUESTS / d, seed=7, **kw)  # type: ignore[arg-type]
                cfg = SimConfig(seed=7, drop=q is not None, slack_quantile=q or 0.5)
                r = simulate_plan(plan, schedule, cfg, table)
                cells.append(f"**{r.violation_rate:.2%}** ({r.dropped:,} dropped, {r.late:,} late)")
            rule = "no dropping" if q is None else f"slack quantile {q:g}"
            rows.append(
                f"| {date} | traffic {tight} ({slo:g} ms) at {d:g} req/s, {GPU} | {rule} | "
                f"{cells[0]} | {cells[1]} | {machine()} |"
            )
            print(rows[-1], flush=True)
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1":
        ensure_section(
            HEADING,
            [
                "Command: `.venv/bin/python benchmarks/drop_rule.py` (in `make bench`). The",
                "development set of `SLACK_QUANTILE`: the traffic app's unchecked MILP plans on",
                "8 A100-80GB at its demand, simulated with seed 7, 20,000 requests: the share",
                "late or dropped per drop rule. Chosen: 0.9.",
                "",
                "| date | plan | drop rule | Poisson | bundled trace, overlaid | machine |",
                "|---|---|---|---|---|---|",
            ],
        )
        add_rows(HEADING, f"benchmarks/drop_rule.py, {date}, at {commit}", rows)


if __name__ == "__main__":
    main()
