"""The study's statistics: how far the probe's estimates are from the truth, per split and
strategy, across hardware, and under each ablation; all through ``analysis.agreement``.

A probe that gave no capacity is an error of −100 % (an estimate of 0): it is counted in
every agreement figure, never dropped, and counted apart as a failure. Only the
calibration factor, a geometric mean, cannot take a zero: the failures it leaves out are
counted beside it.

Beside the bias and limits of agreement, the share of probes above their truth by more
than ``OVER_MARGIN`` (5 %): an over-estimate is the dangerous direction (a server sized
on it misses its SLO), and a symmetric band does not say how many probes fell there.

Two ICCs, each over a cases × seeds table. ICC(2,1) of the capacities says little on a
bank whose capacities span four decades: the spread between cases dwarfs any error, and
it stays near 1 with limits of ±165 %. ICC(1,1) of the relative errors is the share of
the errors' variance that belongs to the case (a bias that repeats with every seed)
rather than to the run: near 1, the errors are systematic per case (a behaviour the probe
misreads every time); near 0 (or below), they are run-to-run noise. It is one-way
because seeds are not raters: seed k on one case and on another share nothing (other
servers, other rates), so there is no seed effect to take out. It is undefined (None)
when every error of the table is the same, as a perfect probe's are.

Recorded traffic (``recorded_traffic``): the adaptive probes at the defaults (Poisson
arrivals) and those replaying each bundled trace, set against the truth under each
traffic (``RECORDED``), per split, with the main table's figures. A case whose truth
under a trace is None (no rate tried met its SLO) has no relative error: its probes are
left out of that row and counted beside it.

The truth's own noise (``reproducible``): every case's Poisson truth is computed twice,
from two independent seed sets (``vanguard.RESEED``), and the probes judged against the
first. Where the two differ by more than ``REPRODUCIBLE`` (2 %) the truth is
ill-conditioned there (an 800 ms stall a minute under p99 < 300 ms: ~1.0 % ± 0.04 % late
anywhere from 260 to 340 req/s, two seed sets' truths over 10 % apart), and a probe's
error measures the truth's noise as much as the probe's. The main table's figures over
every case stay as they are; the same figures over the cases whose truth reproduces
within 2 % are set beside them, and the cases left out named.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from ridgeline.analysis.agreement import Agreement, bland_altman, calibration, cv, icc, linear_fit
from ridgeline.sizing.calibration import MeasuredCalibration
from ridgeline.study.vanguard import (
    ABLATIONS,
    STRATEGIES,
    TRACES,
    CaseRow,
    ProbeRow,
    StudyResult,
    TruthVariant,
    Variant,
    relative_error,
)

PREDICTORS = (
    "noise_cv",
    "stall_fraction",
    "batching_delay_s",
    "warmup_factor",
    "interference_load",
    "log10_truth",
)
"""What the relative error is regressed on, one value per case."""

OVER_MARGIN = 0.05
"""An estimate above its truth by more than this share is an over-estimate."""

REPRODUCIBLE = 0.02
"""A case's truth reproduces when its second seed set's truth is within this share of
the first's (|t2 / t1 − 1| ≤ 2 %, to rounding)."""

_TRUTH_OF: dict[Variant, TruthVariant] = {
    "cli": "poisson",
    "trace-code": "trace-code",
    "trace-conv": "trace-conv",
    "no-warmup": "poisson",
    "batching-windows": "poisson",
    "p99-only": "p99-only",
}


RECORDED: tuple[tuple[Variant, TruthVariant], ...] = (
    ("cli", "poisson"),
    ("cli", "trace-code"),
    ("cli", "trace-conv"),
    ("trace-code", "trace-code"),
    ("trace-conv", "trace-conv"),
)
"""The recorded-traffic table's (probe variant, truth) pairs: the probes at the defaults
(Poisson) against the truth under each traffic, and each trace's probes against its own."""


@dataclass(frozen=True, slots=True)
class Summary:
    """One split × strategy (× variant, × truth): the estimates against the truth."""

    split: str
    strategy: str
    variant: str
    cases: int
    probes: int
    failures: int
    """Probes that gave no capacity (each an error of −100 % in the figures)."""
    agreement: Agreement
    over: float
    """The share of probes whose estimate is above the truth by more than
    ``OVER_MARGIN`` (relative error > +5 %)."""
    icc: float | None
    """ICC(2,1) of the cases × seeds table of capacities (None: fewer than 2 × 2)."""
    error_icc: float | None
    """ICC(1,1) of the cases × seeds table of relative errors (None: fewer than 2 × 2,
    or every error the same)."""
    mean_cv: float | None
    """Mean over cases of the seeds' coefficient of variation (cases with any capacity)."""
    r_squared: float | None
    slope: float | None
    """Of the estimate regressed on the truth (None: too few probes)."""
    test_seconds: float
    requests: int
    truth: str = ""
    """The truth the estimates were set against (``TruthVariant``; "" for the variant's own)."""
    untrue: tuple[str, ...] = ()
    """Cases left out of the figures: no rate met their SLO in the truth's long runs."""
    phantom: int = 0
    """Probes of those cases that reported a capacity anyway: over-estimates of a server
    that has none, counted in ``over`` (their error has no finite value)."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """One row of the recorded-traffic table: a split's probes under one traffic against
    the truth under another (or the same)."""

    split: str
    probe: str
    """The probes' traffic: ``poisson`` (the CLI defaults) or a ``TRACES`` variant."""
    truth: TruthVariant
    summary: Summary
    without_truth: int
    """Cases of the split left out: their truth under this traffic is None."""


@dataclass(frozen=True, slots=True)
class Regression:
    split: str
    strategy: str
    probes: int
    coefficients: dict[str, float]
    """The intercept (``intercept``) and one slope per ``PREDICTORS`` name."""
    r_squared: float


@dataclass(frozen=True, slots=True)
class Cost:
    split: str
    ratio_of_sums: float
    """Adaptive's test-seconds over binary's, all probes of the split summed."""
    median_ratio: float
    """The median over cases of each case's ratio (its probes summed)."""


@dataclass(frozen=True, slots=True)
class CrossHardware:
    """Hardware a's estimates predicting hardware b's truth, for each pair."""

    strategy: str
    nominal: float
    """The speed ratio b / a."""
    naive: dict[str, Agreement]
    """Per split: a's estimate × the speed ratio against b's truth."""
    factor: float | None
    """Fitted on the dev pairs: b's truth ≈ a's estimate × factor (None: nothing to fit)."""
    fitted_on: int
    left_out: int
    """Dev probes on a that gave no capacity: a factor cannot be fitted to them."""
    heldout: Agreement | None
    """The held-out pairs: a's estimate × factor against b's truth."""
    heldout_pairs: int


@dataclass(frozen=True, slots=True)
class Ablation:
    variant: str
    summary: Summary
    baseline: Agreement
    """Adaptive at the CLI defaults on the same cases and seeds, against its truth."""
    without_truth: int = 0
    """Cases the ablation ran on left out: their truth under it is None."""


def _split_cases(result: StudyResult, split: str | None) -> list[CaseRow]:
    return [c for c in result.cases if split is None or c.split == split]


def _probes(
    result: StudyResult,
    cases: Sequence[CaseRow],
    strategy: str,
    variant: Variant,
    seeds: int | None = None,
) -> list[ProbeRow]:
    names = {c.name for c in cases}
    return [
        p
        for p in result.probes
        if p.case in names
        and p.strategy == strategy
        and p.variant == variant
        and (seeds is None or p.seed < seeds)
    ]


def _with_truth(
    result: StudyResult, rows: Sequence[ProbeRow], truth: TruthVariant
) -> tuple[list[ProbeRow], list[str]]:
    """``rows`` of the cases with a capacity under ``truth``, and the cases left out: no
    rate met their SLO, so there is no capacity for a probe to be near."""
    untrue = sorted({p.case for p in rows if result.truth(p.case, truth) is None})
    return [p for p in rows if p.case not in untrue], untrue


def _truths(result: StudyResult, rows: Sequence[ProbeRow], truth: TruthVariant) -> list[float]:
    out = []
    for p in rows:
        t = result.truth(p.case, truth)
        if t is None:
            raise ValueError(f"case {p.case!r} has no {truth} truth: no rate met its SLO")
        out.append(t)
    return out


def summarise(
    result: StudyResult,
    split: str | None,
    strategy: str,
    variant: Variant = "cli",
    *,
    seeds: int | None = None,
    truth: TruthVariant | None = None,
) -> Summary | None:
    """The figures for one split (None: both) and strategy against ``truth`` (by default
    the variant's own); None when nothing ran."""
    cases = _split_cases(result, split)
    every = _probes(result, cases, strategy, variant, seeds)
    against = truth or _TRUTH_OF[variant]
    rows, untrue = _with_truth(result, every, against)
    # one that reported a capacity for a case without one counts as over the truth
    phantom = sum(p.capacity_rps is not None for p in every if p.case in untrue)
    if not rows:
        return None
    truths = _truths(result, rows, against)
    estimates = [p.capacity_rps or 0.0 for p in rows]
    agreement = bland_altman(estimates, truths)  # no capacity: 0, an error of −100 %
    errors = [relative_error(p.capacity_rps, t) for p, t in zip(rows, truths, strict=True)]
    table = _by_case(rows, estimates)
    cvs = [cv(r) for r in table if sum(r) > 0]
    fit = linear_fit(estimates, [truths]) if len(rows) > 2 else None
    return Summary(
        split=split or "all",
        strategy=strategy,
        variant=variant,
        cases=len(table),
        probes=len(rows),
        failures=sum(p.capacity_rps is None for p in rows),
        agreement=agreement,
        over=(over_share(errors) * len(errors) + phantom) / len(every),
        icc=_icc(table, "2,1"),
        error_icc=_icc(_by_case(rows, errors), "1,1"),
        mean_cv=statistics.fmean(cvs) if cvs else None,
        r_squared=None if fit is None else fit.r_squared,
        slope=None if fit is None else fit.coefficients[1],
        test_seconds=sum(p.test_seconds for p in rows),
        requests=sum(p.requests_sent for p in rows),
        truth=truth or "",
        untrue=tuple(untrue),
        phantom=phantom,
    )


def over_share(errors: Sequence[float]) -> float:
    """The share of ``errors`` (estimate / truth − 1) above ``OVER_MARGIN``; an error of
    exactly 5 % (to rounding) is not above it."""
    return sum(e > OVER_MARGIN + 1e-9 for e in errors) / len(errors)


def _by_case(rows: Sequence[ProbeRow], values: Sequence[float]) -> list[list[float]]:
    """One row per case of ``values`` (one per probe), in seed order."""
    by_case: dict[str, dict[int, float]] = {}
    for p, v in zip(rows, values, strict=True):
        by_case.setdefault(p.case, {})[p.seed] = v
    return [[v for _, v in sorted(seeds_of.items())] for seeds_of in by_case.values()]


def _icc(table: list[list[float]], form: Literal["1,1", "2,1"]) -> float | None:
    """``icc`` of the table cut to the seeds every case has; None with fewer than 2 cases
    or 2 seeds, or where it is 0 / 0 (every value the same, for one)."""
    width = min(len(r) for r in table)
    cut = [r[:width] for r in table]
    if len(cut) < 2 or width < 2 or len({v for r in cut for v in r}) == 1:
        return None  # (all the same: their mean may round off them, and 0 / 0 read 0.3)
    try:
        return icc(cut, form)
    except ZeroDivisionError:
        return None


def _predictors(case: CaseRow, truth: float) -> list[float]:
    return [
        case.noise_cv,
        case.stall_fraction,
        case.batching_delay_s,
        case.warmup_factor,
        case.interference_load,
        math.log10(truth),
    ]


def regression(result: StudyResult, split: str, strategy: str) -> Regression | None:
    """The relative error of each probe regressed on its server's parameters; None with
    too few probes to fit them."""
    cases = {c.name: c for c in _split_cases(result, split)}
    rows, _ = _with_truth(result, _probes(result, list(cases.values()), strategy, "cli"), "poisson")
    if len(rows) <= len(PREDICTORS) + 1:
        return None
    truths = _truths(result, rows, "poisson")
    errors = [relative_error(p.capacity_rps, t) for p, t in zip(rows, truths, strict=True)]
    x = np.asarray([_predictors(cases[p.case], t) for p, t in zip(rows, truths, strict=True)])
    fit = linear_fit(errors, [x[:, j] for j in range(x.shape[1])])
    names = ("intercept", *PREDICTORS)
    return Regression(
        split, strategy, len(rows), dict(zip(names, fit.coefficients, strict=True)), fit.r_squared
    )


def cost(result: StudyResult, split: str | None) -> Cost | None:
    """Adaptive's test-seconds against binary's; None unless both ran on some case."""
    cases = _split_cases(result, split)
    per_case: dict[str, list[float]] = {}
    for c in cases:
        spent = [sum(p.test_seconds for p in _probes(result, [c], s, "cli")) for s in STRATEGIES]
        if all(spent):
            per_case[c.name] = spent
    if not per_case:
        return None
    adaptive = sum(a for a, _ in per_case.values())
    binary = sum(b for _, b in per_case.values())
    ratios = [a / b for a, b in per_case.values()]
    return Cost(split or "all", adaptive / binary, statistics.median(ratios))


def cross_hardware(result: StudyResult, strategy: str) -> CrossHardware | None:
    """For every pair (one server on hardware a and b): b's truth predicted from a's
    estimates, by the speed ratio and by a factor fitted on the dev pairs."""
    by_name = {c.name: c for c in result.cases}
    pairs: dict[str, dict[str, CaseRow]] = {}
    for c in result.cases:
        if c.pair is not None:
            pairs.setdefault(c.pair, {})[c.hardware] = c
    complete = [(p["a"], p["b"]) for p in pairs.values() if {"a", "b"} <= set(p)]
    if not complete:
        return None
    nominal = complete[0][1].speed / complete[0][0].speed
    points: dict[str, list[tuple[float | None, float]]] = {}
    for a, b in complete:
        truth_b = result.truth(b.name)
        if truth_b is None:
            continue
        for p in _probes(result, [by_name[a.name]], strategy, "cli"):
            points.setdefault(a.split, []).append((p.capacity_rps, truth_b))
    naive = {
        split: bland_altman([(e or 0.0) * nominal for e, _ in pts], [t for _, t in pts])
        for split, pts in points.items()
    }
    dev = [(e, t) for e, t in points.get("dev", []) if e is not None]
    factor = calibration([e for e, _ in dev], [t for _, t in dev]).factor if dev else None
    held = points.get("heldout", [])
    heldout = None
    if factor is not None and held:
        heldout = bland_altman([(e or 0.0) * factor for e, _ in held], [t for _, t in held])
    return CrossHardware(
        strategy=strategy,
        nominal=nominal,
        naive=naive,
        factor=factor,
        fitted_on=len(dev),
        left_out=len(points.get("dev", [])) - len(dev),
        heldout=heldout,
        heldout_pairs=sum(1 for a, _ in complete if a.split == "heldout"),
    )


def ablations(result: StudyResult) -> list[Ablation]:
    """Each ablation against adaptive at the CLI defaults on the same cases and seeds;
    cases whose truth under the ablation is None (no rate met the SLO: a bursty trace on a
    slow server) are left out of both, and counted."""
    out = []
    for variant in ABLATIONS:
        rows = [p for p in result.probes if p.variant == variant]
        if not rows:
            continue
        names = {p.case for p in rows}
        truth = _TRUTH_OF[variant]
        known = {t.case: t.capacity_rps for t in result.truths if t.variant == truth}
        cases = [c for c in result.cases if c.name in names and known.get(c.name) is not None]
        s = summarise(_only(result, cases), None, "adaptive", variant)
        seeds = max(p.seed for p in rows) + 1
        base = summarise(_only(result, cases), None, "adaptive", "cli", seeds=seeds)
        if s is not None and base is not None:
            without = sum(1 for n in names if n in known and known[n] is None)
            out.append(Ablation(variant, s, base.agreement, without))
    return out


def recorded_traffic(result: StudyResult) -> list[Recorded]:
    """Adaptive's probes under each traffic against the truth under each (``RECORDED``),
    per split (dev, held-out, both), over the cases with a truth under that traffic; a
    pair that has no probes or no such truth in ``result`` gives no row, and a result
    without any truth under a trace none at all."""
    out: list[Recorded] = []
    if not any(t.variant in TRACES for t in result.truths):
        return out  # no truth under recorded traffic: the main table says the rest
    for split in ("dev", "heldout", None):
        cases = _split_cases(result, split)
        for variant, truth in RECORDED:
            known = {t.case: t.capacity_rps for t in result.truths if t.variant == truth}
            kept = [c for c in cases if known.get(c.name) is not None]
            s = summarise(_only(result, kept), None, "adaptive", variant, truth=truth)
            if s is None:
                continue
            probe = "poisson" if variant == "cli" else variant
            without = sum(1 for c in cases if c.name in known and known[c.name] is None)
            out.append(
                Recorded(split or "all", probe, truth, replace(s, split=split or "all"), without)
            )
    return out


@dataclass(frozen=True, slots=True)
class Reproducible:
    """The cases whose truth reproduces (``REPRODUCIBLE``), and those left out."""

    result: StudyResult
    """``result`` cut to the cases whose truth reproduces within 2 %."""
    left_out: list[tuple[CaseRow, float | None]]
    """Every other case, with its reproducibility (None: no second truth, or no truth)."""


def reproducible(result: StudyResult) -> Reproducible | None:
    """``result`` cut to the cases whose ``poisson-reseeded`` truth is within
    ``REPRODUCIBLE`` of the ``poisson`` one (``StudyResult.reproducibility``); None when
    ``result`` holds no second truth at all (one from before it was computed)."""
    if not any(t.variant == "poisson-reseeded" for t in result.truths):
        return None
    of = result.reproducibility
    kept, left = [], []
    for c in result.cases:
        r = of.get(c.name)
        if r is not None and abs(r) <= REPRODUCIBLE + 1e-9:
            kept.append(c)
        else:
            left.append((c, r))
    return Reproducible(_only(result, kept), left)


def _only(result: StudyResult, cases: list[CaseRow]) -> StudyResult:
    return result.model_copy(update={"cases": cases})


def measured_calibration(
    result: StudyResult, source: str, strategy: str = "adaptive"
) -> MeasuredCalibration | None:
    """The dev pairs' factor as the allocator reads it (``--calibration-from``); None
    when no dev pair gave a capacity on hardware a."""
    x = cross_hardware(result, strategy)
    if x is None or x.factor is None:
        return None
    return MeasuredCalibration(
        factor=x.factor,
        from_hardware="a",
        to_hardware="b",
        fitted_on=x.fitted_on,
        heldout_bias=None if x.heldout is None else x.heldout.bias,
        source=f"{source}: {strategy} probes on hardware a, dev pairs' truths on b",
    )
