"""Capacity-search benchmarks (issue: the Vanguard method). Not a test: `make bench`.

1. Simulated servers for four architecture classes (virtual time). Ground truth per class:
   long constant-rate simulated runs (TRUTH_S each, the majority of TRUTH_SEEDS seeds) on
   a fine rate grid around the boundary, each judged by the same health engine; truth =
   the highest sustainable rate.
   Then every strategy probes a fresh simulated server, once per seed (SEEDS): the
   largest error of its estimates against the truth and its mean test-seconds; the
   ratio of adaptive's test-seconds to binary's and sweep's. Every strategy gets the same
   range, precision (2 %) and step length (10 s), and the orchestrator's confirmation.
2. Warmup: the `vision-warmup` preset (3× slower for its first 60 s), probed by adaptive
   and binary search starting at 400/s, with warmup handling on and off, against the
   truth of its steady state (`vision`).
3. Real time, on loopback: adaptive against the fake server (REAL_RUNS times), and the
   capacity measured by long constant-rate runs (bisection, LONG_S each) under the same
   SLO.
Rows are printed as Markdown and appended to docs/benchmarks.md.
RIDGELINE_BENCH_SECTIONS=classes,warmup,real (the default) picks the sections to run.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from _doc import DOC, add_rows

from ridgeline.aio import run_coroutine
from ridgeline.fakeserver import load_preset, running_in_process
from ridgeline.health.hysteresis import HysteresisConfig
from ridgeline.health.slo import parse_slo
from ridgeline.loadgen.step import StepConfig
from ridgeline.probe.assess import assess_step
from ridgeline.probe.drivers import Driver, NetworkDriver, SimDriver
from ridgeline.probe.orchestrator import ProbeConfig, ProbeResult, probe
from ridgeline.search.base import StepPlan
from ridgeline.sim import load_sim_preset
from ridgeline.synthetic.model import capacity_rps

ROOT = Path(__file__).resolve().parent.parent
TRUTH_S = float(os.environ.get("RIDGELINE_BENCH_TRUTH_S", "120"))
TRUTH_SEEDS = int(os.environ.get("RIDGELINE_BENCH_TRUTH_SEEDS", "3"))
CLASSES = tuple(
    os.environ.get("RIDGELINE_BENCH_CLASSES", "recommendation,ranking,vision,nlp").split(",")
)
STRATEGIES = ("adaptive", "binary", "sweep")


def sustainable(
    driver_factory: Callable[[], Driver],
    slo: str,
    rate: float,
    duration: float,
    seeds: int = TRUTH_SEEDS,
) -> bool:
    """The majority verdict of ``seeds`` long runs (each on a fresh server, its own seed):
    one long run's p99 is itself noisy on a heavy-tailed server."""

    async def once(seed: int) -> bool:
        plan = StepPlan(rate, duration, "truth")
        result = await driver_factory().run(plan, seed, asyncio.Event())
        a = assess_step(
            result, plan, parse_slo(slo), HysteresisConfig(), warmup=False, step_index=0, t0_s=0.0
        )
        return a.verdict.sustainable

    votes = [run_coroutine(once(seed)) for seed in range(1, seeds + 1)]
    return sum(votes) * 2 > len(votes)


def truth_by_bisection(
    make: Callable[[], Driver],
    slo: str,
    lo: float,
    hi: float,
    duration: float,
    rel: float,
    seeds: int = TRUTH_SEEDS,
) -> float:
    """Highest rate whose long runs are sustainable, to relative width ``rel``: bisection to
    narrow it, then a fine grid (rel/4 spacing) across the last bracket."""
    while sustainable(make, slo, hi, duration, seeds):
        lo, hi = hi, hi * 2
    while (hi - lo) / lo > rel:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sustainable(make, slo, mid, duration, seeds) else (lo, mid)
    grid = [lo + k * (hi - lo) / 4 for k in range(5)]
    ok = [r for r in grid if sustainable(make, slo, r, duration, seeds)]
    return max(ok) if ok else lo


def sim_probe(
    preset: str,
    strategy: str,
    slo: str,
    min_rate: float,
    max_rate: float,
    warmup: bool = True,
    step: float = 10.0,
    seed: int = 0,
    **extra: object,
) -> ProbeResult:
    """Every strategy gets the same range [min_rate, max_rate] (max_rate: 1.2 × the
    modelled capacity, a ceiling a user knows roughly), precision 2 %, 10 s steps, and
    the same confirmation rule (≥ 30 s and ≥ 10,000 requests, backing off by how far it
    failed): adaptive runs its own, the others the probe's."""
    driver = SimDriver(load_sim_preset(preset), label=preset)
    options: dict[str, object] = {
        "min_rate": min_rate,
        "max_rate": max_rate,
        "step_duration_s": step,
        "precision": 0.02,
        "max_steps": 1000,
        "max_test_seconds": 1e6,
        **extra,
    }
    cfg = ProbeConfig(
        slo=slo,
        strategy=strategy,
        warmup=warmup,
        seed=seed,
        strategy_options=options,
        confirm=strategy != "stability",  # stability is the check itself
    )
    return run_coroutine(probe(driver, cfg))


def warm_probe(strategy: str, slo: str, cap: float, warmup: bool, seed: int) -> ProbeResult:
    cfg = ProbeConfig(
        slo=slo,
        strategy=strategy,
        warmup=warmup,
        seed=seed,
        strategy_options={
            "min_rate": 20.0,
            "start_rate": 400.0,
            "max_rate": cap,
            "step_duration_s": 10.0,
            "precision": 0.02,
        },
    )
    return run_coroutine(probe(SimDriver(load_sim_preset("vision-warmup")), cfg))


SEEDS = range(int(os.environ.get("RIDGELINE_BENCH_SEEDS", "3")))


def summarise(rs: list[ProbeResult], truth: float) -> dict[str, float]:
    """Over seeds: the error of largest magnitude, and the mean test-seconds."""
    errors = [((r.capacity_rps or 0.0) - truth) / truth for r in rs]
    return {"worst": max(errors, key=abs), "seconds": sum(r.test_seconds for r in rs) / len(rs)}


def err(r: ProbeResult, truth: float) -> str:
    if r.capacity_rps is None:
        return "none"
    return f"{(r.capacity_rps - truth) / truth:+.1%}"


def main() -> None:
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    rows: list[str] = []
    t_start = time.time()
    sections = os.environ.get("RIDGELINE_BENCH_SECTIONS", "classes,warmup,real").split(",")
    for cls in CLASSES if "classes" in sections else ():
        preset = load_sim_preset(cls)
        cap = capacity_rps(preset.model) * preset.speed
        min_rate = max(cap / 50, 0.5)
        truth = truth_by_bisection(
            lambda cls=cls: SimDriver(load_sim_preset(cls), label=cls),
            preset.slo,
            min_rate,
            cap,
            TRUTH_S,
            0.01,
        )
        runs = {
            s: [sim_probe(cls, s, preset.slo, min_rate, 1.2 * cap, seed=k) for k in SEEDS]
            for s in STRATEGIES
        }
        stats = {s: summarise(rs, truth) for s, rs in runs.items()}
        # stability checks a rate rather than searching: does one long step (5 steps)
        # tell 5 % below the truth from 5 % above it?
        held = {
            f: sum(
                sim_probe(
                    cls, "stability", preset.slo, min_rate, 1.2 * cap, seed=k, rate=f * truth
                ).capacity_rps
                is not None
                for k in SEEDS
            )
            for f in (0.95, 1.05)
        }
        print(cls, truth, stats, held, flush=True)
        a, b, sw = (stats[s] for s in STRATEGIES)
        rows.append(
            f"| {date} | search (sim) | {cls}: `{preset.slo}`, truth {truth:,.1f}/s"
            f" | adaptive: worst error {a['worst']:+.1%}, {a['seconds']:,.0f} test-s"
            f" | binary {b['worst']:+.1%}, {b['seconds']:,.0f} s; sweep {sw['worst']:+.1%},"
            f" {sw['seconds']:,.0f} s; adaptive/binary **{a['seconds'] / b['seconds']:.2f}**,"
            f" adaptive/sweep **{a['seconds'] / sw['seconds']:.2f}**; stability (50 s) held"
            f" {held[0.95]}/{len(SEEDS)} at −5 %, {held[1.05]}/{len(SEEDS)} at +5 % |"
        )
    # warmup on/off: a user who starts near the expected capacity (400/s), on a server
    # 3x slower for its first 60 s
    vision = load_sim_preset("vision")
    truth = 0.0
    if "warmup" in sections:
        truth = truth_by_bisection(
            lambda: SimDriver(load_sim_preset("vision"), label="vision"),
            vision.slo,
            1.0,
            1000.0,
            TRUTH_S,
            0.01,
        )
    cap = 1.2 * capacity_rps(vision.model)
    for strategy in ("adaptive", "binary") if "warmup" in sections else ():
        res = {
            w: [warm_probe(strategy, vision.slo, cap, w, seed) for seed in SEEDS]
            for w in (True, False)
        }
        on, off = summarise(res[True], truth), summarise(res[False], truth)
        excluded = sum(r.warmup_excluded_s for r in res[True]) / len(res[True])
        rows.append(
            f"| {date} | search (sim) | vision-warmup (3× slower for 60 s), {strategy}, start"
            f" 400/s, truth (steady) {truth:,.1f}/s | warmup handling on: worst"
            f" {on['worst']:+.1%} ({excluded:.0f} s excluded) | off: worst {off['worst']:+.1%} |"
        )
    if "real" in sections:
        rows += real_time(date)
    print("\n".join(rows))
    print(f"took {time.time() - t_start:.0f} s")
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1" and DOC.exists():
        add_rows("## Capacity search", f"benchmarks/search.py, {date}", rows)


LONG_S = float(os.environ.get("RIDGELINE_BENCH_LONG_S", "30"))
REAL_SLO = "p99<50ms,errors<1%"
REAL_RUNS = int(os.environ.get("RIDGELINE_BENCH_REAL_RUNS", "3"))


def real_time(date: str) -> list[str]:
    """Adaptive on loopback (REAL_RUNS times) vs long constant-rate runs, same SLO, same
    server: one run can meet a stall of the shared host, so the row shows every run."""
    model = load_preset("default")
    with running_in_process(model, grpc_port=None) as srv:

        def make() -> NetworkDriver:
            return NetworkDriver(srv.model_url, StepConfig())

        t = time.time()
        truth = truth_by_bisection(make, REAL_SLO, 100.0, 800.0, LONG_S, 0.03, seeds=1)
        truth_s = time.time() - t
        cfg = ProbeConfig(
            slo=REAL_SLO,
            strategy="adaptive",
            strategy_options={"min_rate": 50.0, "step_duration_s": 5.0, "precision": 0.03},
        )
        results = []
        for _ in range(REAL_RUNS):
            t = time.time()
            res = run_coroutine(probe(make(), cfg))
            results.append((res, time.time() - t))
            print("real", truth, res.capacity_rps, res.test_seconds, flush=True)
            for v in res.trajectory:  # the path, for whoever reads the log
                print(f"  {v['rate']:.1f} {v['purpose']} {v['state']} score {v['score']:.2f}")
    worst = max((r for r, _ in results), key=lambda r: abs((r.capacity_rps or 0) / truth - 1))
    runs = ", ".join(f"{r.capacity_rps or 0:,.0f}/s ({err(r, truth)})" for r, _ in results)
    seconds = sum(r.test_seconds for r, _ in results) / len(results)
    wall = sum(w for _, w in results) / len(results)
    return [
        f"| {date} | search (real time, loopback) | fake server `default`, `{REAL_SLO}`:"
        f" long constant-rate runs ({LONG_S:.0f} s each) {truth:,.0f}/s in {truth_s:.0f} s"
        f" | adaptive, {len(results)} runs: {runs}; worst **{err(worst, truth)}**; mean"
        f" {seconds:.0f} test-s ({wall:.0f} s wall) | goal ±10 % |"
    ]


if __name__ == "__main__":
    main()
