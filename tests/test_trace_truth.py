"""The truth under recorded traffic (issue 31, item 3): the whole trace replayed as an
overlay of independent copies from random starting points, ``k = rate / mean rate`` of
them (a fractional copy thinned binomially), computed by ``study.truth`` alone. Its
arrivals hold the rate and keep the trace's burstiness as independent copies add up; a
higher rate's arrivals hold a lower one's; the module shares no code with the load
generator it checks; and on a vision-like server the bursty code trace leaves a lower
capacity than Poisson arrivals for a p99 bound (the paper's workload effect)."""

from __future__ import annotations

import ast
import itertools
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import ridgeline.study.truth as truth_module
from ridgeline.report.vanguard import results_markdown
from ridgeline.sim import load_sim_preset
from ridgeline.study.stats import recorded_traffic
from ridgeline.study.truth import Overlaid, Poisson, TruthConfig, true_capacity
from ridgeline.study.vanguard import CaseRow, ProbeRow, StudyResult, TruthRow
from ridgeline.workload.traces import Trace, bundled_trace_path, read_trace

TRACES = ("azure_llm_2023_code", "azure_llm_2023_conv")


@cache
def overlay(name: str) -> Overlaid:
    return Overlaid(read_trace(bundled_trace_path(name)), name=name)


def _one_copy_minute(o: Overlaid) -> tuple[float, float]:
    """The mean and variance of one copy's count over 60 s, computed exactly enough from
    the trace itself (20,000 evenly spaced starts over its cycle, not the overlay's
    draws): what each of ``k`` independent copies adds."""
    period = o.period
    starts = np.linspace(0.0, period, 20_000, endpoint=False)
    cycled = np.concatenate([o.trace.times, o.trace.times + period])
    counts = np.searchsorted(cycled, starts + 60.0) - np.searchsorted(cycled, starts)
    return float(counts.mean()), float(counts.var())


def _minute_counts(o: Overlaid, rate: float, seeds: int) -> np.ndarray:
    """The count of one 60 s run at ``rate`` for each of ``seeds`` seeds."""
    return np.array([len(o.draw(rate, 60.0, 10_000 + s)[0]) for s in range(seeds)])


def test_the_conversation_trace_ships_beside_the_code_trace_with_its_attribution() -> None:
    path = bundled_trace_path("azure_llm_2023_conv")
    assert path.parent == bundled_trace_path("azure_llm_2023_code").parent
    assert "data/*" in (Path(__file__).parents[1] / "pyproject.toml").read_text()  # shipped
    trace = read_trace(path)
    gaps = np.diff(trace.times)
    assert len(trace) == 19_366 and trace.mean_rate == pytest.approx(5.5, abs=0.05)
    assert 1.0 < gaps.std() / gaps.mean() < 1.2  # close to Poisson, as the notes say
    section = (path.parent / "ATTRIBUTION.md").read_text().split("## `azure_llm_2023_conv.csv`")
    assert len(section) == 2
    for needed in ("CC-BY 4.0", "Azure Public Dataset", "Patel et al.", "ISCA 2024"):
        assert needed in section[1].split("\n## ")[0]


@pytest.mark.parametrize("name", TRACES)
def test_the_overlay_holds_the_rate_and_adds_copies_burstiness(name: str) -> None:
    o = overlay(name)
    assert o.mean_rate == pytest.approx(o.trace.mean_rate, rel=1e-12)
    mean1, var1 = _one_copy_minute(o)
    assert mean1 == pytest.approx(60.0 * o.mean_rate, rel=1e-3)  # a cycle's mean is m
    k = 8
    counts = _minute_counts(o, k * o.mean_rate, 3_000)
    # Mean rate: 3,000 independent minutes of 8 copies; the standard error of their mean
    # is sqrt(var / 3000) / mean, 0.65 % for the code trace (a minute's count varies with
    # an index of dispersion near 150) and 0.2 % for the conversation trace: 3 % is
    # over 4.5 standard errors for both.
    assert counts.mean() / 60.0 == pytest.approx(k * o.mean_rate, rel=0.03)
    # Burstiness: k independent copies' counts add, so their variance is k times one
    # copy's (its exact value from the trace). The sample variance of 3,000 minutes
    # has a bootstrap standard error of 2.7 % of itself (code) and 2.4 % (conv); 10 %
    # is about 4 of them. A time-scaled (sped-up) trace would not add so: its minute
    # at 8 times the rate holds 8 of the trace's minutes, whose counts drift together
    # (up to 64 times one minute's variance).
    assert counts.var(ddof=1) / (k * var1) == pytest.approx(1.0, abs=0.10)


@pytest.mark.parametrize("name", TRACES)
def test_a_fractional_copy_is_thinned_binomially(name: str) -> None:
    o = overlay(name)
    whole, part = o.copies(2.5 * o.mean_rate)
    assert whole == 2 and part == pytest.approx(0.5)
    assert o.copies(3.0 * o.mean_rate) == (3, 0.0)
    counts = _minute_counts(o, 0.5 * o.mean_rate, 3_000)
    mean1, var1 = _one_copy_minute(o)
    # half a copy: each request kept with probability 1/2, so the mean is half one
    # copy's (standard error under 1 % of it) and the variance a quarter of one copy's
    # plus the thinning's binomial p(1 − p)·mean (each within the tolerance above)
    assert counts.mean() == pytest.approx(0.5 * mean1, rel=0.03)
    assert counts.var(ddof=1) == pytest.approx(0.25 * var1 + 0.25 * mean1, rel=0.12)


def test_a_higher_rate_holds_a_lower_ones_arrivals_over_the_same_span() -> None:
    # the copies' starts and the thinning's marks are the same at every rate: the
    # bisection's verdicts move with the rate, not with a new draw
    o = overlay("azure_llm_2023_code")
    spans = []
    for rate in (0.7, 1.0, 2.5, 3.0, 7.9, 40.0):
        times, rows = o.draw(rate * o.mean_rate, 600.0, 3)
        spans.append(set(zip(times.round(9).tolist(), rows.tolist(), strict=True)))
    for lower, higher in itertools.pairwise(spans):
        assert lower < higher
    # a long run at the rate holds about n requests
    times = o.times(300.0, 200_000, 1)
    assert times[0] >= 0.0 and np.all(np.diff(times) >= 0)
    assert len(times) == pytest.approx(200_000, rel=0.05)


def test_the_overlay_is_its_own_stream_apart_from_any_probes() -> None:
    o = overlay("azure_llm_2023_conv")
    a, b = o.times(50.0, 10_000, 0), o.times(50.0, 10_000, 1)
    assert not np.array_equal(a[:100], b[:100])  # seeds differ
    assert np.array_equal(a, o.times(50.0, 10_000, 0))  # and repeat
    one = Overlaid(Trace.from_times(np.array([0.0, 1.0])))
    assert one.mean_rate == 1.0 and len(one.draw(1e-3, 1.0, 0)[0]) == 1  # never empty


def test_the_truth_imports_nothing_of_the_load_generator() -> None:
    # the truth checks the probe's traffic; sharing its code would move both together
    tree = ast.parse(Path(truth_module.__file__).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + [
        n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    ]
    assert imported and not [m for m in imported if "loadgen" in m or "probe" in m]
    assert "trace_superposed" not in Path(truth_module.__file__).read_text()


def test_sizes_travel_with_the_trace_rows_where_the_simulator_reads_them() -> None:
    o = overlay("azure_llm_2023_conv")
    times, shapes = o.arrivals(load_sim_preset("vision"), 20.0, 2_000, 0)
    assert shapes is None  # a non-LLM server reads items only: one row each
    llm = load_sim_preset("llm")
    times, shapes = o.arrivals(llm, 20.0, 2_000, 0)
    _, rows = o.draw(20.0, 100.0, 0)
    assert shapes is not None and len(shapes) == len(times) == len(rows)
    prompts = o.trace.columns["prompt_tokens"][rows].tolist()
    assert [s.prompt_tokens for s in shapes] == prompts


SMALL = TruthConfig(requests=20_000, seeds=2, run_s=60.0, tolerance=0.02)


@pytest.mark.timeout(60)
def test_poisson_truths_are_unchanged_by_the_rate_taking_traffic() -> None:
    # before Traffic took a rate (commit 08d8099's truth.py) this config gave exactly this
    t = true_capacity(load_sim_preset("vision"), cfg=SMALL)
    assert t.capacity_rps == 858.9281770396024 and t.broken_by == "p99"


@pytest.mark.timeout(60)
def test_the_bursty_code_trace_leaves_a_vision_server_less_capacity_than_poisson() -> None:
    # 2 instances, batches of 16 within 4 ms, p99 < 50 ms: Poisson arrivals hold near
    # 860 req/s. The code trace's copies keep their bursts (26 times the mean rate for a
    # second), and at ~290 copies a minute's count still varies with an index of
    # dispersion near 150: bursts past the batches' throughput queue, and the p99 fails
    # lower. The conversation trace, close to Poisson per gap, stays near Poisson's.
    vision = load_sim_preset("vision")
    poisson = true_capacity(vision, traffic=Poisson(), cfg=SMALL).capacity_rps
    code = true_capacity(vision, traffic=overlay(TRACES[0]), cfg=SMALL)
    conv = true_capacity(vision, traffic=overlay(TRACES[1]), cfg=SMALL).capacity_rps
    assert poisson is not None and code.capacity_rps is not None and conv is not None
    assert code.capacity_rps < 0.95 * poisson and code.capacity_rps < conv
    assert code.broken_by == "p99"
    assert conv == pytest.approx(poisson, rel=0.05)


# ---------------------------------------------------------------------------- the report


def _case(name: str, split: str) -> CaseRow:
    return CaseRow(
        name=name,
        klass="vision",
        split=split,
        hardware="a",
        pair=None,
        behaviour="made up",
        traits=[],
        slo="p99<50ms",
        speed=1.0,
        nominal_rps=1000.0,
        noise_cv=0.1,
        stall_fraction=0.0,
        batching_delay_s=0.0,
        warmup_factor=1.0,
        interference_load=0.0,
    )


def _probe(case: str, variant: str, seed: int, capacity: float) -> ProbeRow:
    return ProbeRow.model_validate(
        {
            "case": case,
            "strategy": "adaptive",
            "variant": variant,
            "seed": seed,
            "capacity_rps": capacity,
            "confirmed": True,
            "test_seconds": 100.0,
            "requests_sent": 1000,
            "status": "complete",
            "reason": "",
            "wall_s": 0.0,
        }
    )


def _truth(case: str, variant: str, capacity: float | None) -> TruthRow:
    return TruthRow.model_validate(
        {
            "case": case,
            "variant": variant,
            "slo": "p99<50ms",
            "capacity_rps": capacity,
            "failing_rps": (capacity or 1.0) * 1.005,
            "broken_by": "p99",
            "requests_per_rate": 1,
            "evaluations": 1,
            "wall_s": 0.0,
        }
    )


def _made_up() -> StudyResult:
    """Two held-out cases and one dev case. Poisson probes read 1,000 on each (their
    Poisson truth), where the code trace's truth is 500 and the conversation trace's
    1,000; the trace probes read 550 and 1,000; the dev case has no truth under the code
    trace (none met the SLO)."""
    probes, truths = [], []
    for case in ("h1", "h2", "d1"):
        for seed, wobble in enumerate((0.99, 1.01)):
            probes.append(_probe(case, "cli", seed, 1000.0 * wobble))
            probes.append(_probe(case, "trace-code", seed, 550.0 * wobble))
            probes.append(_probe(case, "trace-conv", seed, 1000.0 * wobble))
        code = None if case == "d1" else 500.0
        truths += [_truth(case, "poisson", 1000.0), _truth(case, "trace-code", code)]
        truths.append(_truth(case, "trace-conv", 1000.0))
    return StudyResult(
        seeds=2,
        dev_seeds=2,
        ablation_seeds=2,
        jobs=1,
        started_at=datetime(2026, 12, 5, tzinfo=UTC),
        wall_s=0.0,
        cases=[_case("h1", "heldout"), _case("h2", "heldout"), _case("d1", "dev")],
        truths=truths,
        probes=probes,
    )


def test_the_report_sets_each_traffics_probes_against_each_traffics_truth() -> None:
    result = _made_up()
    rows = {(r.split, r.probe, r.truth): r for r in recorded_traffic(result)}
    held = rows[("heldout", "poisson", "trace-code")]
    assert held.summary.agreement.bias == pytest.approx(1.0)  # 1,000 read against 500
    assert held.summary.over == 1.0 and held.summary.probes == 4 and held.without_truth == 0
    assert rows[("heldout", "trace-code", "trace-code")].summary.agreement.bias == pytest.approx(
        0.1
    )
    assert rows[("heldout", "poisson", "poisson")].summary.agreement.bias == pytest.approx(0.0)
    assert ("dev", "poisson", "trace-code") not in rows  # no dev case has that truth
    assert ("dev", "trace-code", "trace-code") not in rows
    assert ("dev", "poisson", "trace-conv") in rows
    assert rows[("all", "poisson", "trace-code")].without_truth == 1

    md = results_markdown(result, command="ridgeline study vanguard", commit=None)
    section = md.split("#### Recorded traffic", 1)[1].split("####", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[:3] == ["split", "probe traffic", "truth traffic"]
    for column in ("bias", "95 % limits of agreement", "above truth by > 5 %", "mean CV"):
        assert column in head
    assert "ICC(2,1) of capacities" in head and "ICC(1,1) of errors" in head
    cells = {tuple(c.strip() for c in line.strip("|").split("|")[:3]): line for line in lines[2:]}
    assert "+100.0 %" in cells[("held-out", "Poisson", "code trace (CV 13)")]
    assert "+10.0 %" in cells[("held-out", "code trace (CV 13)", "code trace (CV 13)")]
    assert ("dev", "Poisson", "conversation trace (CV 1.1)") in cells
    assert ("dev", "Poisson", "code trace (CV 13)") not in cells
    assert (
        "Left out, no rate tried met the SLO (the truth is none): `d1` (dev) under the code" in md
    )
    assert "(its truth is none): 1 from trace-code." in md  # the ablations leave it out too
    # a result without any truth under a trace shows no such table
    bare = result.model_copy(
        update={"truths": [t for t in result.truths if t.variant == "poisson"]}
    )
    assert recorded_traffic(bare) == []
    assert "No truth under recorded traffic in this run." in results_markdown(
        bare, command="x", commit=None
    )
