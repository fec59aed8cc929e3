"""`ridgeline probe --budget 5m` on the held-out half of the validation bank (issue 34).
Not a test: `make bench`.

Each held-out case is probed as ``ridgeline probe sim:CASE --budget 5m --seed K`` does
(the CLI's config, ``study.vanguard.cli_probe_config``, with the budget; K = 0..4), in
virtual time. Its answer and interval (``ci_low``–``ci_high``; no lower end when nothing
held) are set beside the case's true capacity under Poisson arrivals, computed apart by
``study.truth.true_capacity`` (long runs at fixed rates, pooled over seeds: not the
probe's rule). Per case: the answers, whether each interval holds the truth, the worst
over-estimate, and the test-seconds each probe spent (at most the budget); beside it,
the test-seconds of the same case without a budget are in the cost table of
``docs/benchmarks.md`` (issue 34's baseline).

    python benchmarks/budget_bank.py [--budget 300] [--seeds 5] [--case NAME ...]
        [--split dev]   # the development half, to set a rule on: printed, never written

Rows go to docs/benchmarks.md unless RIDGELINE_BENCH_NO_WRITE=1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from multiprocessing import Pool
from pathlib import Path

from _doc import add_rows, bank_half, ensure_section, head_commit, machine

from ridgeline.probe.api import default_slo, make_driver, run_probe
from ridgeline.study.bank import Case
from ridgeline.study.truth import Poisson, TruthConfig, true_capacity
from ridgeline.study.vanguard import cli_probe_config

HEADING = (
    "## A probe within `--budget 5m` on the held-out bank (issue 34) (`benchmarks/budget_bank.py`)"
)


def _probe(job: tuple[str, Path, int, float]) -> tuple[str, int, dict[str, float | str | None]]:
    name, sim_file, seed, budget_s = job
    target = f"sim:{sim_file}"
    cfg = cli_probe_config(default_slo(target) or "", "adaptive", seed)
    cfg = cfg.model_copy(update={"budget_s": budget_s})
    r = run_probe(make_driver(target), cfg)
    return (
        name,
        seed,
        {
            "answer": r.capacity_rps,
            "low": r.ci_low,
            "high": r.ci_high,
            "test_s": r.test_seconds,
            "reason": r.reason[:160],
        },
    )


def _truth(case: Case) -> tuple[str, float | None, float | None]:
    t = true_capacity(case.preset, traffic=Poisson(), cfg=TruthConfig())
    return case.name, t.capacity_rps, t.failing_rps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument(
        "--split",
        choices=["heldout", "dev"],
        default="heldout",
        help="the bank's half to probe; the dev half (to set a rule on) is printed, not written",
    )
    args = ap.parse_args()
    cases = bank_half(args.split, args.case)
    commit = head_commit()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Pool(min(2, os.cpu_count() or 1)) as pool:
        files = {c.name: c.write_sim_file(Path(tmp)) for c in cases}
        jobs = [(c.name, files[c.name], k, args.budget) for c in cases for k in range(args.seeds)]
        probes = pool.map(_probe, jobs)
        truths = {n: (lo, hi) for n, lo, hi in pool.map(_truth, cases)}
    rows, held, over, answered, total = [], 0, 0, 0, 0
    for c in cases:
        truth, _ = truths[c.name]
        mine = sorted((p for p in probes if p[0] == c.name), key=lambda p: p[1])
        cells, spent, worst = [], [], None
        for _, _, r in mine:
            total += 1
            answer, low, high = r["answer"], r["low"], r["high"]
            spent.append(float(r["test_s"]))  # type: ignore[arg-type]
            inside = _holds(r, truth)
            held += inside
            if answer is None:
                cells.append(f"none [{_n(low)}–{_n(high)}]")
                continue
            answered += 1
            err = (float(answer) - truth) / truth if truth else None
            if err is not None and err > 0.0:
                over += 1
            worst = err if worst is None or (err is not None and err > worst) else worst
            cells.append(f"{float(answer):,.0f} [{_n(low)}–{_n(high)}]{'' if inside else ' ✗'}")
        rows.append(
            f"| `{c.name}` | {_n(truth)} | {'; '.join(cells)} | "
            f"{sum(_holds(r, truth) for *_, r in mine)} of {len(mine)} | "
            f"{'—' if worst is None else f'{worst:+.1%}'} | {max(spent):,.0f} |"
        )
    wall = time.perf_counter() - began
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    summary = (
        f"| **all** | | {answered} of {total} probes answered; {over} above the truth | "
        f"**{held} of {total}** | | {args.budget:g} s budget; {wall:,.0f} s wall, {machine()} |"
    )
    print("\n".join([*rows, summary]))
    if args.split == "heldout" and os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1":
        ensure_section(
            HEADING,
            [
                "Command: `.venv/bin/python benchmarks/budget_bank.py` (in `make bench`). Each",
                "held-out case probed as `ridgeline probe sim:CASE --budget 5m --seed K`",
                "(K = 0..4, virtual time) beside its true capacity under Poisson",
                "(`study.truth.true_capacity`, computed apart). Per probe: its answer and",
                "interval (`ci_low`–`ci_high`; `—` where that end is absent), ✗ where the",
                "interval misses the truth; the worst error of an answer (+: an over-estimate);",
                "the most test-seconds a probe spent.",
                "",
                "| case | truth (req/s) | answers [interval] | intervals holding the truth "
                "| worst answer error | test-s (max) |",
                "|---|---|---|---|---|---|",
            ],
        )
        add_rows(HEADING, f"benchmarks/budget_bank.py, {date}, at {commit}", [*rows, summary])


def _holds(r: dict[str, float | str | None], truth: float | None) -> bool:
    low, high = r["low"], r["high"]
    lo = float(low) if isinstance(low, float | int) else 0.0
    hi = float(high) if isinstance(high, float | int) else float("inf")
    return truth is not None and lo <= truth <= hi


def _n(x: float | str | None) -> str:
    return "—" if not isinstance(x, float | int) else f"{float(x):,.0f}"


if __name__ == "__main__":
    sys.exit(main())
