"""Planner benchmarks (issue: the JigsawServe MILP). Not a test: `make bench`.

For the three example applications (`examples/specs/`), on calibrated A100-80GB profiles
(the roofline of `pipeline/roofline.py` with its constants fitted to MIGProfiler's
measurements, docs/gpu-model.md; batches 1–32, every MIG profile and MPS shares of 1/2
and 1/3 of a 1g slice):

1. Solve time at 1, 8, 100 and 1,000 GPUs (exact MIG layouts, the queueing bound): the
   demand is 70 % of the most those GPUs serve (found by `max_demand`); the time is the
   median of 3 solves of `plan_pipeline` (two passes: least cost, then accuracy) and the
   gap is HiGHS's relative gap after the first pass. Goal: ≤ 1 s at 100 GPUs with a gap
   ≤ 1 %; 1,000 GPUs reported.
2. Ablation on 8 GPUs: the largest demand each of none, A, S, T, A+T, A+S, S+T, A+S+T
   serves (bisection to 1 %), its ratio to none and to A+T (Loki-like), and the slices
   each uses at one fixed demand (what none serves). Written to docs/ablation.md.

Rows go to docs/benchmarks.md unless RIDGELINE_BENCH_NO_WRITE=1.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from _doc import add_rows, ensure_section, machine

from ridgeline.errors import InfeasiblePlan
from ridgeline.pipeline.planned import PlanFn, max_demand
from ridgeline.pipeline.planner import Features, PlanResult, plan_pipeline
from ridgeline.pipeline.profiles import ProfileTable
from ridgeline.pipeline.roofline import modelled_rows
from ridgeline.pipeline.spec import PipelineSpec, load_spec

ROOT = Path(__file__).resolve().parent.parent
GPU = "A100-80GB"
APPS = ("social-media", "traffic", "ar-assistant")
BATCHES = (1, 2, 4, 8, 16, 32)
HEADING = "## Planner (`benchmarks/planner.py`)"
SETTINGS = ("none", "A", "S", "T", "A,T", "A,S", "S,T", "A,S,T")
ABLATION_GPUS = 8
ABLATION = ROOT / "docs" / "ablation.md"


def table_for(spec: PipelineSpec) -> ProfileTable:
    variants = [v for t in spec.tasks.values() for v in t.variants]
    return ProfileTable(modelled_rows(variants, GPU, BATCHES))


def slices(n: int) -> dict[str, float]:
    return {GPU: 7.0 * n}


def solve_time(spec: PipelineSpec, table: ProfileTable, gpus: int) -> tuple[float, float, float]:
    """(demand, median seconds, gap) at 70 % of what ``gpus`` serve."""
    top, _ = max_demand(spec, lambda s: plan_pipeline(s, table, slices(gpus)))
    demand = 0.7 * top
    runs: list[PlanResult] = []
    for _ in range(3):
        runs.append(
            plan_pipeline(spec.model_copy(update={"demand_rps": demand}), table, slices(gpus))
        )
    return demand, statistics.median(r.solve_s for r in runs), max(r.gap for r in runs)


def _planner(table: ProfileTable, setting: str) -> PlanFn:
    """Plans on ABLATION_GPUS with the features of ``setting``."""
    features, available = Features.parse(setting), slices(ABLATION_GPUS)
    return lambda spec: plan_pipeline(spec, table, available, features)


def ablation(spec: PipelineSpec, table: ProfileTable) -> dict[str, tuple[float, float | None]]:
    """Per setting: (max demand on ABLATION_GPUS, cost at what none serves)."""
    tops = {s: max_demand(spec, _planner(table, s))[0] for s in SETTINGS}
    fixed = spec.model_copy(update={"demand_rps": tops["none"] or spec.demand_rps / 10})
    out: dict[str, tuple[float, float | None]] = {}
    for s in SETTINGS:
        try:
            used: float | None = plan_pipeline(
                fixed, table, slices(ABLATION_GPUS), Features.parse(s)
            ).cost.get(GPU)
        except InfeasiblePlan:
            used = None
        out[s] = (tops[s], used)
    return out


def main() -> None:
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    t0 = time.time()
    rows: list[str] = []
    ablations: dict[str, dict[str, tuple[float, float | None]]] = {}
    for app in APPS:
        spec = load_spec(ROOT / "examples" / "specs" / f"{app}.yaml")
        table = table_for(spec)
        times = {g: solve_time(spec, table, g) for g in (1, 8, 100, 1000)}
        print(app, times, flush=True)
        cells = "; ".join(
            f"{g} GPU{'s' if g > 1 else ''}: {s * 1000:,.0f} ms at {d:,.0f}/s (gap {gap:.2%})"
            for g, (d, s, gap) in times.items()
        )
        ok = times[100][1] <= 1.0 and times[100][2] <= 0.01
        kind = "/".join(sorted({r.source for r in table}))
        rows.append(
            f"| {date} | planner solve time | {app}: {len(table)} {kind} A100-80GB rows,"
            f" demand at 70 % of the most the GPUs serve | {cells} | goal ≤ 1 s at 100 GPUs,"
            f" gap ≤ 1 %: **{'met' if ok else 'not met'}** | {machine()} |"
        )
        ablations[app] = ablation(spec, table)
        print(app, ablations[app], flush=True)
    print("\n".join(rows))
    print(f"took {time.time() - t0:.0f} s")
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1":
        ensure_section(
            HEADING,
            [
                "Command: `make bench` (or `.venv/bin/python benchmarks/planner.py`). A100-80GB",
                "profiles from the roofline (`pipeline/roofline.py`, its constants fitted to",
                "MIGProfiler's measurements: `docs/gpu-model.md`); HiGHS, one thread, relative",
                "gap 1 %; median of 3 solves. The ablation is in `docs/ablation.md`.",
                "",
                "| date | what | setup | result | goal | machine |",
                "|---|---|---|---|---|---|",
            ],
        )
        add_rows(HEADING, f"benchmarks/planner.py, {date}", rows)
        write_ablation(date, ablations)


def write_ablation(date: str, ablations: dict[str, dict[str, tuple[float, float | None]]]) -> None:
    """The generated table of docs/ablation.md (between its markers)."""
    lines = [
        f"<!-- generated by benchmarks/planner.py on {date}; do not edit by hand -->",
        "",
        f"Max serviceable demand on {ABLATION_GPUS} × A100-80GB (req/s), its ratio to none"
        " and to A+T, and the cost (compute-slice equivalents, `docs/planner.md`) at the"
        " demand none serves:",
        "",
        "| application | setting | max demand | × none | × A+T | cost at none's max |",
        "|---|---|---|---|---|---|",
    ]
    for app, res in ablations.items():
        none, at = res["none"][0], res["A,T"][0]
        for s, (top, used) in res.items():
            label = Features.parse(s).label
            lines.append(
                f"| {app} | {label} | {top:,.1f} | {_ratio(top, none)} | {_ratio(top, at)} |"
                f" {'—' if used is None else f'{used:.1f}'} |"
            )
    empty = "# Ablation\n\n<!-- table -->\n<!-- /table -->\n"
    text = ABLATION.read_text() if ABLATION.exists() else empty
    head, _, rest = text.partition("<!-- table -->")
    _, _, tail = rest.partition("<!-- /table -->")
    ABLATION.write_text(head + "<!-- table -->\n" + "\n".join(lines) + "\n<!-- /table -->" + tail)


def _ratio(a: float, b: float) -> str:
    return "—" if b <= 0 else f"{a / b:.2f}×"


if __name__ == "__main__":
    main()
