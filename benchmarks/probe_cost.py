"""Where a default probe's test-seconds go, case by case (issue 34). Not a test:
`.venv/bin/python benchmarks/probe_cost.py [--split dev|heldout] [--seeds 1] [--json PATH]`,
or `… --floor-of PRESET --truth RPS [--slo S] [--precision P]` for one preset's floor.

Each bank case is probed as ``ridgeline probe sim:CASE --seed K`` does at its defaults
(``study.vanguard.cli_probe_config``, adaptive, K = 0..seeds−1, virtual time), and its
trajectory split by phase: the warm-up; the first search and its confirmations (up to
the first recheck of the failure that bounded it); and what follows (the rechecks, the
searches resumed above them, a confirmation run again once slower behaviour was seen:
``orchestrator.probe``'s ``MAX_RESUMES`` loop and ``_still_covered``). Beside them: the
share of all load spent in confirmations, the answer the first part had confirmed and
the final one, each against the case's true capacity (``study.truth.true_capacity``,
computed apart: long runs at fixed rates). The question it answers: what the load after
the first confirmed answer buys; beside it each case's floor (``floor_s``: one decisive
run, as independent requests and as clustered ones). Rows go to docs/benchmarks.md for
the held-out half, unless RIDGELINE_BENCH_NO_WRITE=1; the dev half (to set a rule on) is
printed only.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
from _doc import add_rows, bank_half, ensure_section, head_commit, machine

from ridgeline.health import parse_slo
from ridgeline.health.metrics import METRICS
from ridgeline.health.sampling import QUANTILES, binomial_cdf
from ridgeline.probe.api import default_slo, make_driver, run_probe
from ridgeline.sim import SimPreset, load_sim_preset
from ridgeline.study.bank import Case
from ridgeline.study.truth import Poisson, TruthConfig, longest_period, runs_at, true_capacity
from ridgeline.study.vanguard import cli_probe_config
from ridgeline.telemetry.records import Outcome

HEADING = "## Where a default probe's load goes (issue 34) (`benchmarks/probe_cost.py`)"


def _probe(job: tuple[str, Path, int, bool]) -> dict[str, Any]:
    name, sim_file, seed, sequential = job
    target = f"sim:{sim_file}"
    cfg = cli_probe_config(default_slo(target) or "", "adaptive", seed)
    if sequential:
        cfg = cfg.model_copy(update={"sequential": True})
    r = run_probe(make_driver(target), cfg)
    steps = r.trajectory
    own = [float(v["duration_s"]) - float(v.get("pooled_s", 0.0)) for v in steps]
    first = next((i for i, v in enumerate(steps) if v["purpose"] == "recheck"), len(steps))
    held = [
        float(v["rate"])
        for v in steps[:first]
        if v["purpose"] == "confirm" and v["state"] in ("healthy", "warn") and v["decided"]
    ]
    return {
        "case": name,
        "seed": seed,
        "answer": r.capacity_rps,
        "first": held[-1] if held else None,
        "test_s": r.test_seconds,
        "warmup_s": r.warmup_s,
        "search_s": sum(own[:first]),
        "after_s": sum(own[first:]),
        "confirm_s": sum(o for o, v in zip(own, steps, strict=True) if v["purpose"] == "confirm"),
        "resumed": "searched on above" in r.reason,
        "trajectory": [
            {k: v[k] for k in ("purpose", "rate", "duration_s", "pooled_s", "state", "decided")}
            for v in steps
        ],
    }


PRECISION, CONFIDENCE = 0.02, 0.95
"""The probe's defaults: what the floor is the floor of."""


def _truth(case: Case) -> tuple[str, float | None, Floor | None]:
    truth = true_capacity(case.preset, traffic=Poisson(), cfg=TruthConfig()).capacity_rps
    return case.name, truth, None if truth is None else floor_s(case.preset, truth)


BLOCKS = 20
"""Batch means: the truth's runs at a rate are cut into about this many blocks of equal
length (whole blocks within each run) to measure how late requests cluster; into blocks
of the server's longest period when it has one (a run of whole periods sees each stall
once, and a block shorter than one would count the stall's phase as clustering)."""
UNSEEN_S = 60.0
"""No decisive run is shorter: a probe that has not read the server cannot rule out a
stall every minute in less (issue 34: "faster must not mean blind to a stall every
minute"), whatever the server it probes turns out to be."""


@dataclass(frozen=True)
class Floor:
    """One decisive run's length at ``(1 − precision)`` of the truth (``floor_s``)."""

    independent_s: float
    """As though requests were independent, and at least the longest period."""
    dispersion: float
    """How many requests one late request counts for, at the tightest bound (≥ 1)."""
    clustered_s: float
    """The same with requests worth ``1 / dispersion`` of one each, and at least
    ``UNSEEN_S``."""


def floor_s(
    preset: SimPreset, truth: float, slo: str | None = None, precision: float = PRECISION
) -> Floor | None:
    """The least load any probe at the defaults could answer ``preset`` in: one run at
    ``(1 − precision)`` of the truth long enough to show its tightest percentile bound
    held at ``CONFIDENCE`` (a one-sided binomial test on the share beyond the bound that
    the truth's own runs at that rate measured), and at least the server's longest
    period (``study.truth.longest_period``: a stall's or a neighbour's) so that one run
    covers it: once as though requests were independent (as the issue words it: a lower
    bound), once with each worth ``1 / dispersion`` of one (``dispersion``, measured
    here by batch means on those runs, apart from the probe's own estimate in
    ``health.timescale``) and at least ``UNSEEN_S`` (the floor proposed instead). None
    where that rate's share beyond the bound reaches the percentile's allowance (no run
    length shows it held) or the SLO bounds no percentile. Warm-up is not in it."""
    policy = parse_slo(slo or preset.slo)
    bounds = [b for b in policy.latency if b.percentile in QUANTILES]
    if not bounds:
        return None
    rate = truth * (1.0 - precision)
    runs = runs_at(preset, rate)
    spans = [float(r.scheduled.max()) if r.scheduled.size else 0.0 for r in runs]
    period = longest_period(preset)
    block = period or sum(spans) / BLOCKS
    worst = (0, 1.0)  # requests needed as independent ones, and their dispersion
    for b in bounds:
        q = QUANTILES[b.percentile]
        counts: list[tuple[int, int]] = []
        beyond = total = 0
        for rec, span in zip(runs, spans, strict=True):
            sent = rec.outcome != int(Outcome.NOT_SENT)
            s = METRICS[b.metric].samples(rec, sent)
            late = ~(s.values <= b.bound_ms / 1000.0)
            beyond, total = beyond + int(late.sum()), total + late.size
            whole = int(span // block)
            if whole:
                which = (s.when // block).astype(np.int64)
                keep = which < whole  # the tail short of a whole block left out
                counts += zip(
                    np.bincount(which[keep], weights=late[keep], minlength=whole).astype(int),
                    np.bincount(which[keep], minlength=whole),
                    strict=True,
                )
        share = beyond / total if total else 1.0
        if share >= 1.0 - q:
            return None
        n = _independent(share, 1.0 - q)
        d = dispersion(counts)
        if n * d > worst[0] * worst[1]:
            worst = (n, d)
    n, d = worst
    return Floor(max(n / rate, period), d, max(n * d / rate, period, UNSEEN_S))


def _independent(share: float, allowed: float) -> int:
    """The fewest independent requests whose share ``share`` beyond the bound a one-sided
    binomial test at ``CONFIDENCE`` shows below ``allowed``."""
    n = 1
    while binomial_cdf(round(n * share), n, allowed) > 1.0 - CONFIDENCE:
        n *= 2
    lo = n // 2
    while n - lo > 1:
        mid = (lo + n) // 2
        if binomial_cdf(round(mid * share), mid, allowed) > 1.0 - CONFIDENCE:
            lo = mid
        else:
            n = mid
    return n


def dispersion(counts: list[tuple[int, int]]) -> float:
    """How many requests one late request counts for (at least 1): the variance of the
    blocks' counts beyond the bound (``counts``: beyond, requests) about the pooled
    share, over what independent requests would give (batch means)."""
    c = np.array([b for b, _ in counts], dtype=float)
    n = np.array([m for _, m in counts], dtype=float)
    if c.size < 2 or n.sum() == 0:
        return 1.0
    p = c.sum() / n.sum()
    if p <= 0.0 or p >= 1.0:
        return 1.0
    spread = float(np.sum((c - p * n) ** 2)) * c.size / (c.size - 1)
    return float(max(1.0, spread / (p * (1.0 - p) * float(n.sum()))))


def _rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _err(x: float | None, truth: float | None) -> str:
    return "—" if x is None or not truth else f"{x / truth - 1:+.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--split", choices=["heldout", "dev"], default="heldout")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--json", type=Path, help="also write every probe, its steps too, here")
    ap.add_argument(
        "--sequential", action="store_true", help="the probes with --sequential (printed only)"
    )
    ap.add_argument(
        "--floor-of",
        metavar="PRESET",
        help="only print one sim preset's floor (with --truth, --slo, --precision)",
    )
    ap.add_argument("--truth", type=float, help="with --floor-of: its true capacity, req/s")
    ap.add_argument("--slo", help="with --floor-of: the SLO (default: the preset's)")
    ap.add_argument("--precision", type=float, default=PRECISION)
    args = ap.parse_args()
    if args.floor_of is not None:
        if args.truth is None:
            ap.error("--floor-of needs --truth (the preset's true capacity under --slo)")
        floor = floor_s(load_sim_preset(args.floor_of), args.truth, args.slo, args.precision)
        print(json.dumps(None if floor is None else asdict(floor)))
        return
    cases = bank_half(args.split, args.case)
    commit = head_commit()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Pool(min(2, os.cpu_count() or 1)) as pool:
        files = {c.name: c.write_sim_file(Path(tmp)) for c in cases}
        jobs = [
            (c.name, files[c.name], k, args.sequential) for c in cases for k in range(args.seeds)
        ]
        probes = pool.map(_probe, jobs)
        found = pool.map(_truth, cases)
    truths = {name: truth for name, truth, _ in found}
    floors = {name: floor for name, _, floor in found}
    if args.json is not None:
        kept = {k: None if f is None else asdict(f) for k, f in floors.items()}
        args.json.write_text(json.dumps({"truths": truths, "floors": kept, "probes": probes}))
    rows, total = [], {"test": 0.0, "after": 0.0, "confirm": 0.0}
    over: list[float] = []
    over_clustered: list[float] = []
    moved = better = worse = 0
    for p in sorted(probes, key=lambda p: (p["case"], p["seed"])):
        truth, floor = truths[p["case"]], floors[p["case"]]
        times = None if floor is None else p["test_s"] / floor.independent_s
        clustered = None if floor is None else p["test_s"] / floor.clustered_s
        if times is not None and clustered is not None:
            over.append(times)
            over_clustered.append(clustered)
        total["test"] += p["test_s"]
        total["after"] += p["after_s"]
        total["confirm"] += p["confirm_s"]
        if p["answer"] != p["first"] and truth and p["answer"] and p["first"]:
            moved += 1
            closer = abs(p["answer"] / truth - 1) < abs(p["first"] / truth - 1)
            better, worse = better + closer, worse + (not closer)
        rows.append(
            f"| `{p['case']}` | {p['seed']} | {_rate(truth)} | "
            f"{p['test_s']:,.0f} | {'—' if not floor else f'{floor.independent_s:,.0f}'} | "
            f"{'—' if times is None else f'{times:,.1f}×'} | "
            f"{p['warmup_s']:,.0f} | {p['search_s']:,.0f} | "
            f"{p['after_s']:,.0f} | {p['confirm_s'] / max(p['test_s'], 1e-9):.0%} | "
            f"{_err(p['first'], truth)} | {_err(p['answer'], truth)} | "
            f"{'yes' if p['resumed'] else 'no'} | "
            f"{'—' if not floor else f'{floor.dispersion:,.1f}'} | "
            f"{'—' if not floor else f'{floor.clustered_s:,.0f}'} | "
            f"{'—' if clustered is None else f'{clustered:,.1f}×'} |"
        )
    wall = time.perf_counter() - began
    above = sum(t > 3.0 for t in over)
    summary = (
        f"| **all** | | | {total['test']:,.0f} | | {above} of {len(over)} above 3× | | | "
        f"{total['after']:,.0f} "
        f"({total['after'] / max(total['test'], 1e-9):.0%}) | "
        f"{total['confirm'] / max(total['test'], 1e-9):.0%} | | {moved} answers moved after "
        f"the first: {better} closer to the truth, {worse} farther | | | | "
        f"{sum(t > 3.0 for t in over_clustered)} of {len(over_clustered)} above 3× |"
    )
    print("\n".join([*rows, summary]))
    print(f"{wall:,.0f} s wall, {machine()}")
    written = not args.sequential and os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1"
    if args.split == "heldout" and written:
        ensure_section(
            HEADING,
            [
                "Command: `.venv/bin/python benchmarks/probe_cost.py` (method in its",
                "docstring). Per probe at CLI defaults (virtual time): its test-seconds; the",
                "warm-up's; the first search's with its confirmations; the load after it (the",
                "rechecks of the bounding failure, searches resumed above, confirmations run",
                "again); the share in confirmations; the first confirmed answer's error and",
                "the final one's against the truth; whether a resumed search set the answer.",
                "",
                "| case | seed | truth (req/s) | test-s | floor (s) | test-s / floor | warm-up "
                "| first search | after it | in confirmations | first answer | final answer "
                "| resumed | dispersion | clustered floor (s) | test-s / clustered floor |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            ],
        )
        date = datetime.now(UTC).strftime("%Y-%m-%d")
        add_rows(HEADING, f"benchmarks/probe_cost.py, {date}, at {commit}, {machine()}", [
            *rows, summary])  # fmt: skip


if __name__ == "__main__":
    main()
