"""What a budget can resolve at all (issue 34): the best any probe could confirm, at
the probe's confidence, in B seconds of load on a server. Not a test: `make bench`.

Issue 34 asks for an answer within ±5 % of the long-run truth in 5 minutes of load on
the fake server "configured as no test or constant was set on" (realtime.py's *fresh*
server, `benchmarks/realtime_fresh.yaml`: a 118 ms stall every 6.5 s under
`p99<85ms,errors<0.1%`). Whether that is possible is a property of the server, not of a
search: near a stall-set boundary the share of requests beyond the bound changes little
with the rate, and telling 0.95 × the truth from the truth takes many requests.

The oracle here knows the truth and spends the whole budget in one run at a rate a
little below it: no warm-up, no search, and every request counted as independent (a
binomial test, which clustered late requests only make harder). For each rate r (a share
of the truth), `RUNS` runs of B seconds of Poisson arrivals on the warm server, each from
a random phase of its stall (`study.truth.phased`), in virtual time (`sim.presets`, the
fake server's latency model): a run *confirms* r when its count beyond the bound (a
failed request counted beyond) is so low that a server exactly at the percentile's
boundary would show as few at most 1 − confidence of the time, and its errors likewise
under their bound. The share of runs that confirm is the chance that even this oracle
confirms r in B seconds; five probes all within 5 % need it at 0.95 × the truth, five
times over.

The truth is `study.truth.true_capacity` (long runs pooled over seeds; not this rule),
with eight times the bank's requests per rate (`TRUTH`).
The long-run share beyond the bound at each rate is printed too (8 runs of 600 s each).

    python benchmarks/resolution.py [--budget 300] [--runs 200] [--sim FILE]

Rows go to docs/benchmarks.md unless RIDGELINE_BENCH_NO_WRITE=1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml
from _doc import add_rows, ensure_section, machine

from ridgeline.health.sampling import binomial_cdf, judged_quantile
from ridgeline.health.slo import parse_slo
from ridgeline.sim.presets import SimPreset, simulate_preset
from ridgeline.study.truth import Poisson, TruthConfig, phased, true_capacity
from ridgeline.telemetry.records import Outcome

ROOT = Path(__file__).resolve().parent.parent
HEADING = "## What 5 minutes of load can resolve (issue 34) (`benchmarks/resolution.py`)"
SHARES = (0.70, 0.80, 0.85, 0.90, 0.95, 1.00)
LONG_S, LONG_RUNS = 600.0, 8
TRUTH = TruthConfig(requests=1_600_000, seeds=16, max_requests=4_000_000)
"""Eight times the bank's runs per rate: where the share beyond the bound moves by 0.1
percentage point over 30 % of the rate, the bank's 200,000 requests place the truth
within some ±10 %."""


def fresh_preset() -> SimPreset:
    """realtime.py's fresh server as a simulated one: the fake server's own config and
    the SLO realtime.py sets on it."""
    model = yaml.safe_load((ROOT / "benchmarks" / "realtime_fresh.yaml").read_text())
    return SimPreset(
        description="the fresh fake server (benchmarks/realtime_fresh.yaml)",
        model=model,
        slo="p99<85ms,errors<0.1%",
    )


def counts(preset: SimPreset, rate: float, seconds: float, seed: int) -> tuple[int, int, int]:
    """(requests, beyond the latency bound or failed, failed) of one run from a random
    phase of the warm server."""
    policy = parse_slo(preset.slo)
    (bound,) = [b.bound_ms for b in policy.latency]
    warm = preset.model_copy(update={"model": preset.model.model_copy(update={"warmup": None})})
    server, state = phased(warm, 1_000 + seed)
    n = max(1, int(rate * seconds))
    rng = np.random.default_rng([34, seed])
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    times = times[times < seconds]
    rec, _ = simulate_preset(server, times, None, state=state, seed=seed)
    ok = np.asarray(rec.outcome) == Outcome.OK
    late = np.asarray(rec.latency_from_schedule) * 1e3 > bound
    return len(times), int(np.sum(late | ~ok)), int(np.sum(~ok))


def confirms(
    n: int, beyond: int, failed: int, share: float, max_error: float, level: float
) -> bool:
    """The most generous sure pass: every request independent, one-sided at ``level``."""
    if binomial_cdf(beyond, n, share) > level:
        return False
    if max_error <= 0.0:
        return failed == 0
    return binomial_cdf(failed, n, max_error) <= level


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--sim", type=Path, default=None, help="a SimPreset YAML (default: fresh)")
    args = ap.parse_args()
    preset = (
        SimPreset.model_validate(yaml.safe_load(args.sim.read_text()))
        if args.sim
        else fresh_preset()
    )
    policy = parse_slo(preset.slo)
    q = judged_quantile(policy)
    assert q is not None, "the SLO needs a percentile bound"
    share = 1.0 - q
    began = time.perf_counter()
    truth = true_capacity(preset, traffic=Poisson(), cfg=TRUTH)
    assert truth.capacity_rps is not None
    t = truth.capacity_rps
    print(f"truth: [{t:.1f}, {truth.failing_rps:.1f}) req/s ({time.perf_counter() - began:.0f} s)")
    rows = []
    for s in SHARES:
        rate = s * t
        long = [counts(preset, rate, LONG_S, 10_000 + k) for k in range(LONG_RUNS)]
        beyond_share = sum(b for _, b, _ in long) / sum(n for n, _, _ in long)
        held = sum(
            confirms(
                *counts(preset, rate, args.budget, k),
                share,
                policy.max_error_rate,
                1.0 - args.confidence,
            )
            for k in range(args.runs)
        )
        p = held / args.runs
        rows.append((s, rate, beyond_share, p))
        print(
            f"{s:.2f} x truth = {rate:7.1f} req/s: long-run share beyond {beyond_share:.3%}; "
            f"the oracle confirms it in {held} of {args.runs} runs of {args.budget:g} s "
            f"({p:.0%}; five in a row {p**5:.1%})",
            flush=True,
        )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") == "1":
        return
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    ensure_section(
        HEADING,
        [
            "Command: `.venv/bin/python benchmarks/resolution.py` (method in its docstring):",
            "the chance that an oracle, knowing the truth and spending the whole budget in one",
            "run at a share of it (every request counted independent, one-sided at the",
            "probe's confidence), confirms that rate, on the fresh fake server in virtual time.",
            "",
            "| date | server | truth (req/s) | rate (share of truth) | long-run share beyond "
            "the bound | oracle confirms in one run of the budget | five in a row |",
            "|---|---|---|---|---|---|---|",
        ],
    )
    note = (
        f"benchmarks/resolution.py --budget {args.budget:g} --runs {args.runs}, {day}, "
        f"at {commit}, {machine()}; virtual time; {time.perf_counter() - began:.0f} s; "
        "one run, every rate"
    )
    add_rows(
        HEADING,
        note,
        [
            f"| {day} | {preset.description}, `{preset.slo}` | "
            f"[{t:.1f}, {truth.failing_rps:.1f}) | {rate:.1f} ({s:.2f}) | {b:.3%} | "
            f"{p:.0%} of {args.runs} ({args.budget:g} s) | {p**5:.1%} |"
            for s, rate, b, p in rows
        ],
    )


if __name__ == "__main__":
    main()
