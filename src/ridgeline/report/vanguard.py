"""The validation study as Markdown: the bank's table and the results' tables, written
between markers into a document (``docs/reproduction-vanguard.md``), and the progress
line printed as each case finishes."""

from __future__ import annotations

import statistics
from pathlib import Path

from ridgeline.analysis.agreement import Agreement
from ridgeline.report import _markers
from ridgeline.study.stats import (
    OVER_MARGIN,
    PREDICTORS,
    REPRODUCIBLE,
    Summary,
    ablations,
    cost,
    cross_hardware,
    recorded_traffic,
    regression,
    reproducible,
    summarise,
)
from ridgeline.study.vanguard import (
    STRATEGIES,
    CaseDone,
    ProbeRow,
    StudyResult,
    relative_error,
)

BANK = "bank"
RESULTS = "results"
SPLIT_NAMES = {"dev": "dev", "heldout": "held-out", "all": "all"}
_PREDICTOR_HEADS = {
    "noise_cv": "noise CV",
    "stall_fraction": "stall fraction",
    "batching_delay_s": "batching delay (s)",
    "warmup_factor": "warmup factor",
    "interference_load": "interference",
    "log10_truth": "log10 truth",
}


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %".replace("-", "−")


def _loa(a: Agreement) -> str:
    return f"{_pct(a.low)} to {_pct(a.high)}"


def _num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}".replace("-", "−")


def _rate(x: float | None) -> str:
    if x is None:
        return "none"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def bank_markdown(result: StudyResult) -> str:
    """The bank: one row per case, with its truth."""
    rows = []
    for c in result.cases:
        rows.append(
            [
                f"`{c.name}`",
                c.klass,
                SPLIT_NAMES[c.split],
                f"{c.hardware} ({c.speed:.1f})",
                c.behaviour,
                f"`{c.slo}`",
                _rate(c.nominal_rps),
                _rate(result.truth(c.name)),
            ]
        )
    head = ["case", "class", "split", "hardware", "behaviour", "SLO", "nominal req/s", "truth"]
    return _markers.table(head, rows)


_AGREEMENT_HEAD = [
    "cases",
    "probes",
    "no capacity",
    "bias",
    "95 % limits of agreement",
    f"above truth by > {OVER_MARGIN * 100:g} %",
]
"""The columns of a summary's agreement (``_agreement_cells``), in both tables that show it."""


def _share(x: float) -> str:
    return f"{x * 100:.1f} %"


def _agreement_cells(s: Summary) -> list[str]:
    a = s.agreement
    return [str(s.cases), str(s.probes), str(s.failures), _pct(a.bias), _loa(a), _share(s.over)]


def _summary_row(s: Summary) -> list[str]:
    r2 = "n/a" if s.r_squared is None else f"{s.r_squared:.3f} ({_num(s.slope)})"
    cells = [*_agreement_cells(s), _num(s.icc, 3), _num(s.error_icc, 3), _num(s.mean_cv, 3), r2]
    return [SPLIT_NAMES[s.split], s.strategy, *cells]


_RELIABILITY_HEAD = ["ICC(2,1) of capacities", "ICC(1,1) of errors"]
"""``Summary.icc`` and ``Summary.error_icc`` (see ``study.stats``)."""


def _within() -> str:
    return f"truth reproducible within {REPRODUCIBLE * 100:g} %"


def _agreement(result: StudyResult) -> str:
    """Each split × strategy over every case, and beneath it the same over the cases whose
    truth reproduces (``stats.reproducible``), those left out named under the table."""
    kept = reproducible(result)
    rows = []
    for split in ("dev", "heldout", None):
        n = None if kept is None else len(_split_cases(kept.result, split))
        for strategy in STRATEGIES:
            s = summarise(result, split, strategy)
            if s is None:
                continue
            rows.append(_summary_row(s))
            if kept is None:
                continue
            w = summarise(kept.result, split, strategy)
            label = f"{SPLIT_NAMES[s.split]}, {_within()} ({n} case{'' if n == 1 else 's'})"
            rows.append([label, strategy, *(_summary_row(w)[2:] if w else ["n/a"] * 10)])
    head = ["split", "strategy", *_AGREEMENT_HEAD, *_RELIABILITY_HEAD, "mean CV", "R² (slope)"]
    table = _markers.table(head, rows) + _untrue(result)
    if kept is None:
        return table + (
            "\n\nNo second truth in this result (it predates them): every figure is over "
            "every case, whatever its truth's own noise."
        )
    left = [f"`{c.name}` ({SPLIT_NAMES[c.split]}, {_reproducibility(r)})" for c, r in kept.left_out]
    note = (
        f"Rows *{_within()}*: the same figures, against the same truth, over the cases whose "
        "truth computed again from an independent seed set is within "
        f"{REPRODUCIBLE * 100:g} % of it (the per-case table's *truth reproducibility*). "
    )
    note += f"Left out: {'; '.join(left)}." if left else "None is left out."
    return f"{table}\n\n{note}"


def _untrue(result: StudyResult) -> str:
    """A note naming the cases no rate met the SLO of (left out of the figures), and the
    probes that reported a capacity for them anyway (counted over the truth)."""
    found = [s for st in STRATEGIES if (s := summarise(result, None, st)) and s.untrue]
    if not found:
        return ""
    notes = [f"{s.strategy} reported a capacity in {s.phantom} of their probes" for s in found]
    names = ", ".join(f"`{c}`" for c in sorted({c for s in found for c in s.untrue}))
    return (
        f"\n\nNo rate met the SLO in the truth's long runs of {names}: left out of the "
        f"figures; {'; '.join(notes)}, each counted above the truth by more than "
        f"{OVER_MARGIN * 100:g} % (a capacity the server does not have)."
    )


def _split_cases(result: StudyResult, split: str | None) -> list[str]:
    return [c.name for c in result.cases if split is None or c.split == split]


def _reproducibility(r: float | None) -> str:
    """Two decimals: a case shown at +2.0 % may be just past the 2 % limit."""
    return "n/a" if r is None else f"{r * 100:+.2f} %".replace("-", "−")


def _cost(result: StudyResult) -> str:
    rows = []
    for split in ("dev", "heldout", None):
        c = cost(result, split)
        if c is None:
            continue
        spent = [summarise(result, split, s) for s in STRATEGIES]
        rows.append(
            [
                SPLIT_NAMES[c.split],
                *[f"{s.test_seconds:,.0f}" if s else "n/a" for s in spent],
                *[f"{s.requests:,}" if s else "n/a" for s in spent],
                f"{c.ratio_of_sums:.2f}",
                f"{c.median_ratio:.2f}",
            ]
        )
    head = [
        "split",
        *(f"{s} test-s" for s in STRATEGIES),
        *(f"{s} requests" for s in STRATEGIES),
        "ratio of sums",
        "median per-case ratio",
    ]
    return _markers.table(head, rows)


def _regressions(result: StudyResult) -> str:
    rows = []
    for split in ("dev", "heldout"):
        for strategy in STRATEGIES:
            r = regression(result, split, strategy)
            if r is None:
                continue
            coefs = [_num(r.coefficients[p], 3) for p in ("intercept", *PREDICTORS)]
            rows.append([SPLIT_NAMES[split], strategy, str(r.probes), *coefs, f"{r.r_squared:.2f}"])
    if not rows:
        return "Too few probes to regress the error on six parameters."
    head = ["split", "strategy", "probes", "intercept"]
    head += [_PREDICTOR_HEADS[p] for p in PREDICTORS] + ["R²"]
    return _markers.table(head, rows)


def _hardware(result: StudyResult) -> str:
    rows = []
    nominal = None
    for strategy in STRATEGIES:
        x = cross_hardware(result, strategy)
        if x is None:
            continue
        nominal = x.nominal
        naive = [
            f"{_pct(x.naive[s].bias)} ({_loa(x.naive[s])})" if s in x.naive else "n/a"
            for s in ("dev", "heldout")
        ]
        factor = "n/a" if x.factor is None else f"{x.factor:.3f} (n = {x.fitted_on})"
        if x.left_out:
            factor += f", {x.left_out} without a capacity left out"
        held = "n/a" if x.heldout is None else f"{_pct(x.heldout.bias)} ({_loa(x.heldout)})"
        rows.append([strategy, *naive, factor, held])
    if nominal is None:
        return "No pair of cases (one server on hardware a and b) in this run."
    head = [
        "strategy",
        f"dev pairs: a × {nominal:g} vs b's truth",
        f"held-out pairs: a × {nominal:g}",
        "factor fitted on dev",
        "held-out pairs: a × factor",
    ]
    return _markers.table(head, rows)


def _ablations(result: StudyResult) -> str:
    rows = []
    left_out = []
    for a in ablations(result):
        baseline = [_pct(a.baseline.bias), _loa(a.baseline)]
        rows.append([a.variant, *_agreement_cells(a.summary), *baseline])
        if a.without_truth:
            left_out.append(f"{a.without_truth} from {a.variant}")
    if not rows:
        return "No ablation ran."
    head = ["variant", *_AGREEMENT_HEAD, "baseline bias", "baseline limits"]
    table = _markers.table(head, rows)
    if left_out:
        table += (
            "\n\nCases left out, no rate tried met the SLO under the variant (its truth is "
            f"none): {'; '.join(left_out)}."
        )
    return table


TRAFFIC_NAMES = {
    "poisson": "Poisson",
    "trace-code": "code trace (CV 13)",
    "trace-conv": "conversation trace (CV 1.1)",
}
"""The recorded-traffic table's names of a probe's or a truth's traffic."""


def _recorded(result: StudyResult) -> str:
    rows = []
    for r in recorded_traffic(result):
        cells = _summary_row(r.summary)[2:]  # the main table's figures, after split, strategy
        probe, truth = TRAFFIC_NAMES[r.probe], TRAFFIC_NAMES[r.truth]
        rows.append([SPLIT_NAMES[r.split], probe, truth, *cells])
    if not rows:
        return "No truth under recorded traffic in this run."
    head = ["split", "probe traffic", "truth traffic", *_AGREEMENT_HEAD, *_RELIABILITY_HEAD]
    table = _markers.table([*head, "mean CV", "R² (slope)"], rows)
    split = {c.name: SPLIT_NAMES[c.split] for c in result.cases}
    none = [
        f"`{t.case}` ({split.get(t.case, '?')}) under the {TRAFFIC_NAMES[t.variant]}"
        for t in result.truths
        if t.capacity_rps is None and t.variant in TRAFFIC_NAMES and t.variant != "poisson"
    ]
    if none:
        table += f"\n\nLeft out, no rate tried met the SLO (the truth is none): {'; '.join(none)}."
    return table


def _of(probes: list[ProbeRow], case: str, strategy: str) -> list[ProbeRow]:
    return [p for p in probes if p.case == case and p.strategy == strategy and p.variant == "cli"]


def _case_cells(rows: list[ProbeRow], truth: float | None) -> list[str]:
    if not rows:
        return ["n/a"] * 4
    found = [p.capacity_rps or 0.0 for p in rows]
    spread = f"{_rate(statistics.fmean(found))} ({_rate(min(found))}–{_rate(max(found))})"
    errors = [relative_error(p.capacity_rps, truth) for p in rows] if truth else []
    err = _pct(statistics.fmean(errors)) if errors else "n/a"
    failed = sum(p.capacity_rps is None for p in rows)
    spent = statistics.fmean(p.test_seconds for p in rows)
    return [spread, err, str(failed), f"{spent:,.0f}"]


def _per_case(result: StudyResult) -> str:
    rows = []
    again = result.reproducibility
    for c in result.cases:
        truth = result.truth(c.name)
        cells = [f"`{c.name}`", SPLIT_NAMES[c.split], _rate(truth)]
        cells.append(_reproducibility(again.get(c.name)))
        for strategy in STRATEGIES:
            cells += _case_cells(_of(result.probes, c.name, strategy), truth)
        rows.append(cells)
    head = ["case", "split", "truth", "truth reproducibility"]
    for s in STRATEGIES:
        head += [f"{s}: mean (min–max)", "error", "no capacity", "test-s"]
    return _markers.table(head, rows) + (
        "\n\n*Truth reproducibility*: the case's Poisson truth computed again from an "
        "independent seed set, over the truth every error is judged against, less 1 "
        "(n/a: no second truth, or no rate met the SLO)."
    )


def results_markdown(result: StudyResult, *, command: str, commit: str | None) -> str:
    """Every results table, under a line saying how and when they were made."""
    ablated = sum(p.variant != "cli" for p in result.probes)
    baseline = len(result.probes) - ablated
    machine = f" on a {result.cpus}-core machine" if result.cpus else ""
    made = (
        f"Generated by `{command}` on {result.started_at:%Y-%m-%d}"
        f"{f' at commit `{commit}`' if commit else ''}: {len(result.cases)} cases, "
        f"{baseline} probes at the CLI defaults ({result.seeds} seeds per held-out case, "
        f"{result.dev_seeds or result.seeds} per dev case, × {len(STRATEGIES)} strategies) "
        f"and {ablated} ablation probes "
        f"({result.ablation_seeds} seeds), {result.wall_s:,.0f} s wall-clock in "
        f"{result.jobs} process{'es' if result.jobs > 1 else ''}{machine}."
    )
    parts = [
        made,
        "#### Agreement with the truth (relative error, estimate / truth − 1)",
        _agreement(result),
        "#### Cost: test-seconds and requests sent",
        _cost(result),
        "#### The error regressed on the server's parameters (one row per probe)",
        _regressions(result),
        "#### Across hardware: predicting b's capacity from a probe on a",
        _hardware(result),
        "#### Ablations (adaptive; baseline: the same cases and seeds at the CLI defaults)",
        _ablations(result),
        "#### Recorded traffic (adaptive; each trace replayed whole as overlay, by the probe "
        "and by the truth)",
        _recorded(result),
        "#### Per case",
        _per_case(result),
    ]
    return "\n\n".join(parts)


def update_document(path: str | Path, blocks: dict[str, str]) -> Path:
    """Write each block between its markers in ``path`` (``<!-- vanguard:NAME:start -->``
    … ``end``), leaving the rest of the document as it is; a block without markers there
    yet is appended, and a missing file is created."""
    return _markers.update_document(
        path, blocks, prefix="vanguard", title="The Vanguard reproduction"
    )


def case_line(done: CaseDone) -> str:
    """``[ 3/23] vision-stall-a  truth 911  adaptive 880 (−3.4 %)  binary …  41 s``"""
    truth = next((t.capacity_rps for t in done.truths if t.variant == "poisson"), None)
    parts = [f"[{done.index:>2}/{done.total}] {done.case.name:<20} truth {_rate(truth):>6}"]
    for strategy in STRATEGIES:
        rows = _of(done.probes, done.case.name, strategy)
        if not rows:
            continue
        mean = statistics.fmean(p.capacity_rps or 0.0 for p in rows)
        err = f" ({_pct(mean / truth - 1)})" if truth else ""
        failed = sum(p.capacity_rps is None for p in rows)
        none = f", {failed} none" if failed else ""
        parts.append(f"{strategy} {_rate(mean):>6}{err}{none}")
    parts.append(f"{done.elapsed_s:,.0f} s")
    return "  ".join(parts)
