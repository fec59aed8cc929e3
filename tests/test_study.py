"""The validation study: the bank's coverage, the truth on cases with a known answer, the
study on a tiny bank (its tables' exact structure), the same probe as the CLI's, the
statistics counting failures, and the calibration from the study to the allocator."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from _cli import ridgeline
from ridgeline.cli._exit import probe_code
from ridgeline.errors import ConfigError, UnknownKindError
from ridgeline.health.slo import parse_slo
from ridgeline.report.vanguard import (
    BANK,
    RESULTS,
    bank_markdown,
    results_markdown,
    update_document,
)
from ridgeline.sim import SimPreset, load_sim_config
from ridgeline.sizing.calibration import read_calibration, write_calibration
from ridgeline.study.bank import CLASSES, SPLITS, bank_dir, load_bank, pairs, select
from ridgeline.study.stats import (
    cross_hardware,
    measured_calibration,
    over_share,
    regression,
    reproducible,
    summarise,
)
from ridgeline.study.truth import TruthConfig, broken, true_capacity
from ridgeline.study.vanguard import (
    QUICK_DEV_CASES,
    CaseRow,
    ProbeRow,
    StudyConfig,
    StudyResult,
    TruthRow,
    batching_window_s,
    p99_only,
    probe_as_cli,
    relative_error,
    run_study,
)
from ridgeline.workload.traces import bundled_trace_path

BEHAVIOURS = {
    "batching-small-delay",
    "batching-large-delay",
    "heavy-tail",
    "periodic-stall",
    "warmup-by-time",
    "warmup-by-work",
    "interference",
    "low-rate",
    "errors",
}
"""What every half of the bank must hold (variable row counts only in dev)."""


# ---------------------------------------------------------------------------- the bank


@pytest.mark.timeout(60)
def test_the_bank_covers_every_class_and_behaviour_in_both_halves_on_both_hardware() -> None:
    bank = load_bank()
    assert len(bank) >= 16
    for split in SPLITS:
        half = [c for c in bank if c.split == split]
        assert {c.klass for c in half} == set(CLASSES), split
        covered = set().union(*(c.traits for c in half))
        assert covered >= BEHAVIOURS, (split, BEHAVIOURS - covered)
        assert {c.hardware for c in half} == {"a", "b"}, split
        assert any(c.pair for c in half), f"no cross-hardware pair in {split}"
    assert sum("low-rate" in c.traits for c in bank) >= 2
    assert {c.preset.speed for c in bank} == {1.0, 1.6}
    large = [c for c in bank if c.preset.model.batching.max_queue_delay_s >= 0.1]
    assert any(c.preset.model.batching.max_batch_size >= 64 for c in large)
    work = [c.preset.model.warmup for c in bank if "warmup-by-work" in c.traits]
    assert any(w is not None and w.requests == 30_000 and w.factor == 3.0 for w in work)


@pytest.mark.timeout(60)
def test_a_pair_is_one_server_on_two_speeds_and_a_bad_pair_is_refused(tmp_path: Path) -> None:
    found = pairs(load_bank())
    assert len(found) >= 4
    for a, b in found.values():
        assert (a.hardware, b.hardware, a.split) == ("a", "b", b.split)
        assert a.preset.model == b.preset.model and b.preset.speed / a.preset.speed == 1.6
    head = "class: vision\nsplit: dev\npair: p\nbehaviour: x\nserver: {preset: vision}\n"
    (tmp_path / "one.yaml").write_text(f"name: one\nhardware: a\n{head}")
    (tmp_path / "two.yaml").write_text(
        f"name: two\nhardware: b\n{head.replace('{preset: vision}', '{preset: ranking}')}"
    )
    with pytest.raises(ConfigError, match="differ beyond speed"):
        load_bank(tmp_path)
    (tmp_path / "two.yaml").write_text(
        "name: two\nhardware: b\nclass: vision\nsplit: dev\npair: p\nbehaviour: x\n"
        "server: {preset: vision, speed: 1.0}\n"
    )
    with pytest.raises(ConfigError, match="contradicts hardware 'b'"):
        load_bank(tmp_path)
    with pytest.raises(UnknownKindError, match="valid bank cases are"):
        select(load_bank(), ["no-such-case"])


@pytest.mark.timeout(60)
def test_each_case_is_a_plain_sim_file_the_probe_command_reads(tmp_path: Path) -> None:
    for case in load_bank():
        assert load_sim_config(case.write_sim_file(tmp_path)) == case.preset, case.name


@pytest.mark.timeout(60)
def test_quick_runs_every_held_out_case_and_a_dev_sample(tmp_path: Path) -> None:
    bank = load_bank()
    held = {c.name for c in bank if c.split == "heldout"}
    cases = StudyConfig.quick().cases
    assert cases is not None and len(held) >= 12
    assert held <= set(cases)  # every held-out case, chosen by split
    assert set(cases) - held == set(QUICK_DEV_CASES)
    assert {c.name for c in bank if c.name in QUICK_DEV_CASES} == set(QUICK_DEV_CASES)
    # a held-out case added to a bank later is in its quick study, a dev one is not
    for f in bank_dir().glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    for name, split in (("new-held", "heldout"), ("new-dev", "dev")):
        (tmp_path / f"{name}.yaml").write_text(
            f"name: {name}\nclass: vision\nsplit: {split}\nhardware: a\nbehaviour: x\n"
            "server: {preset: vision}\n"
        )
    grown = StudyConfig.quick(bank=tmp_path).cases
    assert grown is not None and set(grown) == set(cases) | {"new-held"}
    assert StudyConfig.quick(cases=("nlp-bert",)).cases == ("nlp-bert",)  # given: kept


# ---------------------------------------------------------------------------- the truth


def _server(slo: str = "p99<10s,errors<0.1%", **model: object) -> SimPreset:
    return SimPreset.model_validate(
        {
            "description": "test server",
            "model": {"base_ms": 10.0, "per_item_ms": 0.0, "instances": 1, **model},
            "slo": slo,
        }
    )


def test_the_plain_judge_counts_failures_beyond_every_bound() -> None:
    policy = parse_slo("p99<100ms,errors<1%")
    fast, slow = np.full(990, 0.05), np.full(10, 0.5)
    ok = np.ones(1000, dtype=bool)
    assert broken(np.concatenate([fast, slow]), ok, policy) is None  # 99.0 % within
    assert broken(np.concatenate([fast[:-1], slow, [0.5]]), ok, policy) == "p99"  # 98.9 %
    failed = ok.copy()
    failed[:1] = False  # one failure, fast as it was: beyond the bound all the same
    assert broken(np.concatenate([fast, slow]), failed, policy) == "p99"
    errors = np.zeros(1000, dtype=bool)
    errors[:10] = True  # 1 % errors, not below 1 %
    assert broken(np.full(1000, 0.01), ~errors, policy) == "errors"


@pytest.mark.timeout(120)
def test_one_constant_server_under_a_loose_bound_is_saturated_near_one_over_its_service() -> None:
    # 10 ms, one instance, no batching, no noise: 100 req/s is the saturated throughput;
    # a p99 bound of 10 s holds an M/D/1 queue up to nearly all of it
    t = true_capacity(_server(), cfg=TruthConfig(requests=100_000))
    assert t.capacity_rps is not None and 97.0 < t.capacity_rps < t.failing_rps <= 100.0
    assert t.failing_rps / t.capacity_rps <= 1.005


@pytest.mark.timeout(120)
def test_stalls_past_the_bound_count_in_the_plain_p99_and_lower_the_truth() -> None:
    # 5 ms service, p99 < 50 ms: an 80 ms stall every 5 s puts 0.6 % of requests past the
    # bound at low load, and its backlog puts more past it as the rate rises
    cfg = TruthConfig(requests=100_000)
    smooth = _server("p99<50ms,errors<0.1%", base_ms=5.0)
    stall = {"every_s": 5.0, "duration_ms": 80.0}
    stalled = _server("p99<50ms,errors<0.1%", base_ms=5.0, periodic_stall=stall)
    without = true_capacity(smooth, cfg=cfg).capacity_rps
    with_stalls = true_capacity(stalled, cfg=cfg)
    assert without is not None and with_stalls.capacity_rps is not None
    assert with_stalls.capacity_rps < 0.9 * without
    assert with_stalls.broken_by == "p99"


@pytest.mark.timeout(120)
def test_a_warming_server_is_judged_warm() -> None:
    cfg = TruthConfig(requests=50_000)
    cold = _server(warmup={"factor": 3.0, "requests": 30_000})
    warm = true_capacity(_server(), cfg=cfg)
    assert true_capacity(cold, cfg=cfg).capacity_rps == warm.capacity_rps is not None


# ---------------------------------------------------------------------------- the study

TINY_CASE = """\
name: {name}
class: {klass}
split: {split}
hardware: {hardware}
{pair}behaviour: a tiny test server
server:
  description: tiny
  model: {{base_ms: {base}, per_item_ms: 8.0, instances: 1, noise_cv: 0.1,
          batching: {{max_batch_size: 4, max_queue_delay_s: 0.016}}}}
  slo: "p99<500ms,errors<0.1%"
"""


def _tiny_bank(root: Path) -> Path:
    """One tiny server on both hardware, a pair; its batches cost 80 ms and 8 ms a row, its
    bound 500 ms: capacities of 30 and 50 req/s, so its probes send few requests (the
    simulator's cost: with 10 ms batches one trace probe sent 21 million and the test took
    150 s), and the tables have the same rows."""
    for name, hardware in (("tiny-a", "a"), ("tiny-b", "b")):
        text = TINY_CASE.format(
            name=name,
            klass="vision",
            split="dev",
            hardware=hardware,
            pair="pair: tiny\n",
            base=80.0,
        )
        (root / f"{name}.yaml").write_text(text)
    return root


def _headings_and_rows(markdown: str) -> list[tuple[str, list[list[str]]]]:
    """Each ``####`` heading with the first two cells of its table's body rows."""
    out: list[tuple[str, list[list[str]]]] = []
    for line in markdown.splitlines():
        if line.startswith("#### "):
            out.append((line[5:], []))
        elif line.startswith("| ") and out and not line.startswith("| split |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cells[0] not in {"case", "strategy", "variant"}:
                out[-1][1].append(cells[:2])
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_study_on_a_tiny_bank_writes_every_table_with_its_rows(tmp_path: Path) -> None:
    (tmp_path / "bank").mkdir()
    cfg = StudyConfig(
        seeds=2,
        dev_seeds=2,
        ablation_seeds=1,
        jobs=1,
        bank=_tiny_bank(tmp_path / "bank"),
        truth=TruthConfig(requests=20_000, run_s=60.0),
        traces=("trace-code",),  # the other takes the same path (and 20 s more)
    )
    seen: list[str] = []
    result = run_study(cfg, on_case=lambda done: seen.append(done.case.name))
    assert sorted(seen) == ["tiny-a", "tiny-b"]
    assert [(p.case, p.strategy, p.seed) for p in result.probes if p.variant == "cli"] == [
        (c, s, k) for c in ("tiny-a", "tiny-b") for s in ("adaptive", "binary") for k in (0, 1)
    ]
    # recorded traffic on every case, dev too: one probe per trace and a truth under each
    traces = ("trace-code",)
    assert [(p.case, p.variant) for p in result.probes if p.variant != "cli"] == [
        (c, v) for c in ("tiny-a", "tiny-b") for v in traces
    ]
    assert [(t.case, t.variant) for t in result.truths] == [
        (c, v) for c in ("tiny-a", "tiny-b") for v in ("poisson", "poisson-reseeded", *traces)
    ]
    md = results_markdown(result, command="ridgeline study vanguard --seeds 2", commit="abc1234")
    assert md.startswith("Generated by `ridgeline study vanguard --seeds 2` on ")
    assert "at commit `abc1234`: 2 cases, 8 probes at the CLI defaults" in md
    structure = _headings_and_rows(md)
    assert [h for h, _ in structure] == [
        "Agreement with the truth (relative error, estimate / truth − 1)",
        "Cost: test-seconds and requests sent",
        "The error regressed on the server's parameters (one row per probe)",
        "Across hardware: predicting b's capacity from a probe on a",
        "Ablations (adaptive; baseline: the same cases and seeds at the CLI defaults)",
        "Recorded traffic (adaptive; each trace replayed whole as overlay, by the probe and "
        "by the truth)",
        "Per case",
    ]
    rows = dict(structure)
    kept = sum(abs(r) <= 0.02 + 1e-9 for r in result.reproducibility.values() if r is not None)
    within = f"truth reproducible within 2 % ({kept} case{'' if kept == 1 else 's'})"
    assert rows["Agreement with the truth (relative error, estimate / truth − 1)"] == [
        [label, strategy]
        for split in ("dev", "all")
        for strategy in ("adaptive", "binary")
        for label in (split, f"{split}, {within}")
    ]
    spent = rows_cost(result)
    assert rows["Cost: test-seconds and requests sent"] == [["dev", spent], ["all", spent]]
    assert rows["Across hardware: predicting b's capacity from a probe on a"] == [
        ["adaptive", _naive_cell(result, "adaptive")],
        ["binary", _naive_cell(result, "binary")],
    ]
    assert rows["Per case"] == [["`tiny-a`", "dev"], ["`tiny-b`", "dev"]]
    assert rows["Ablations (adaptive; baseline: the same cases and seeds at the CLI defaults)"] == [
        ["trace-code", "2"],
    ]
    probes = ["Poisson"] * 2 + ["code trace (CV 13)"]
    assert rows[
        "Recorded traffic (adaptive; each trace replayed whole as overlay, by the probe and "
        "by the truth)"
    ] == [[split, probe] for split in ("dev", "all") for probe in probes]
    assert "Too few probes to regress" in md

    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n\nbefore\n\n<!-- vanguard:results:start -->\nold\n"
        "<!-- vanguard:results:end -->\n\nafter\n"
    )
    blocks = {BANK: bank_markdown(result), RESULTS: md}
    update_document(doc, blocks)
    once = doc.read_text()
    update_document(doc, blocks)
    assert doc.read_text() == once  # the blocks replace themselves
    assert once.startswith("# Title\n\nbefore\n\n<!-- vanguard:results:start -->\nGenerated")
    assert "old" not in once and "\nafter\n" in once
    assert once.rstrip().endswith("<!-- vanguard:bank:end -->")
    assert once.count("| `tiny-a` | vision | dev | a (1.0) | a tiny test server |") == 1


def rows_cost(result: StudyResult) -> str:
    adaptive = summarise(result, "dev", "adaptive")
    assert adaptive is not None
    return f"{adaptive.test_seconds:,.0f}"


def _naive_cell(result: StudyResult, strategy: str) -> str:
    x = cross_hardware(result, strategy)
    assert x is not None
    a = x.naive["dev"]
    sign = lambda v: f"{v * 100:+.1f} %".replace("-", "−")  # noqa: E731
    return f"{sign(a.bias)} ({sign(a.low)} to {sign(a.high)})"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_parallel_processes_give_the_same_study_as_one(tmp_path: Path) -> None:
    """Eight tasks (two cases, both strategies, one seed, four truths) finish out of order
    in two processes and come back in the order one process gives them."""
    bank = _tiny_bank(tmp_path)
    truth = TruthConfig(requests=20_000, run_s=60.0)
    cfg = StudyConfig(seeds=1, dev_seeds=1, ablation_seeds=0, jobs=1, bank=bank, truth=truth)
    one = run_study(cfg)
    two = run_study(cfg.model_copy(update={"jobs": 2}))
    assert len(one.probes) == 4 and len(one.truths) == 4  # a Poisson truth and its reseeded
    strip = {"wall_s"}
    assert [p.model_dump(exclude=strip) for p in one.probes] == [
        p.model_dump(exclude=strip) for p in two.probes
    ]
    assert [t.model_dump(exclude=strip) for t in one.truths] == [
        t.model_dump(exclude=strip) for t in two.truths
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("case", "strategy", "variant"),
    [
        # no rate holds a confirmation: the exit status of a probe without a capacity
        ("vision-interference", "binary", "cli"),
        # a server warming by time: --no-warmup changes the probe (31 steps, not 25)
        ("vision-warmup-time", "adaptive", "no-warmup"),
        # one trace stands for both: the variant differs only in the bundled file named
        # (vision-tail-cv25: 1 s a probe; nlp-tail-a took 80 s of the suite, and
        # vision-warmup-time, 7 million requests a probe, 49 s)
        ("vision-tail-cv25", "adaptive", "trace-code"),
        ("vision-warmup-time", "adaptive", "p99-only"),  # 0.2 s a probe
        ("rec-bigbatch-a", "adaptive", "batching-windows"),
    ],
)
def test_the_study_probes_as_the_probe_command_does(
    tmp_path: Path, case: str, strategy: str, variant: str
) -> None:
    c = select(load_bank(), [case])[0]
    path = c.write_sim_file(tmp_path)
    window = batching_window_s(c) if variant == "batching-windows" else 1.0
    options = {
        "cli": [],
        "no-warmup": ["--no-warmup"],
        "trace-code": ["--trace", str(bundled_trace_path())],
        "trace-conv": ["--trace", str(bundled_trace_path("azure_llm_2023_conv"))],
        "p99-only": ["--slo", p99_only(c.preset.slo)],
        "batching-windows": ["--window", str(window)],
    }[variant]
    run = ridgeline(
        "probe",
        f"sim:{path}",
        "--strategy",
        strategy,
        "--seed",
        "3",
        "--json",
        "--db",
        str(tmp_path / "runs.sqlite"),
        *options,
    )
    cli = json.loads(run.stdout)
    ours = probe_as_cli(path, strategy, 3, variant, window_s=window)  # type: ignore[arg-type]
    assert run.returncode == probe_code(ours), run.stderr  # the exit status it documents
    keys = ("capacity_rps", "ci_low", "ci_high", "confirmed", "steps", "requests_sent", "slo")
    assert {k: cli[k] for k in keys} == {k: getattr(ours, k) for k in keys}
    assert cli["test_seconds"] == pytest.approx(ours.test_seconds, rel=1e-12)
    assert window > 1.0 if variant == "batching-windows" else window == 1.0


def test_the_single_metric_slo_keeps_the_p99_bound_alone() -> None:
    assert p99_only("p99<50ms,errors<0.1%") == "p99<50ms"
    assert p99_only("p50<10ms,p99<2s,errors<0.1%") == "p99<2000ms"
    assert parse_slo(p99_only("p99<50ms,errors<0.1%")).max_error_rate == 0.01
    assert p99_only("p95<80ms") == "p95<80ms"


# ---------------------------------------------------------------------------- statistics


def _case(name: str, split: str, hardware: str, pair: str | None = None) -> CaseRow:
    speed = {"a": 1.0, "b": 1.6}[hardware]
    return CaseRow(
        name=name,
        klass="vision",
        split=split,
        hardware=hardware,
        pair=pair,
        behaviour="made up",
        traits=[],
        slo="p99<50ms",
        speed=speed,
        nominal_rps=1000.0,
        noise_cv=0.1,
        stall_fraction=0.0,
        batching_delay_s=0.0,
        warmup_factor=1.0,
        interference_load=0.0,
    )


def _probe_row(
    case: str, seed: int, capacity: float | None, strategy: str = "adaptive"
) -> ProbeRow:
    return ProbeRow(
        case=case,
        strategy=strategy,
        variant="cli",
        seed=seed,
        capacity_rps=capacity,  # type: ignore[arg-type]
        confirmed=capacity is not None,
        test_seconds=100.0,
        requests_sent=1000,
        status="complete",
        reason="",
        wall_s=0.0,
    )


def _truth_row(case: str, capacity: float | None) -> TruthRow:
    return TruthRow(
        case=case,
        variant="poisson",
        slo="p99<50ms",
        capacity_rps=capacity,
        failing_rps=1.0 if capacity is None else capacity * 1.005,
        broken_by="p99",
        requests_per_rate=1,
        evaluations=1,
        wall_s=0.0,
    )


def _result(cases: list[CaseRow], probes: list[ProbeRow], truths: list[TruthRow]) -> StudyResult:
    return StudyResult(
        seeds=3,
        ablation_seeds=0,
        jobs=1,
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        wall_s=0.0,
        cases=cases,
        truths=truths,
        probes=probes,
    )


def test_a_probe_without_a_capacity_is_an_error_of_minus_100_percent() -> None:
    result = _result(
        [_case("x", "dev", "a"), _case("y", "dev", "a")],
        [
            _probe_row("x", 0, 100.0),
            _probe_row("x", 1, 100.0),
            _probe_row("y", 0, None),
            _probe_row("y", 1, 200.0),
        ],
        [_truth_row("x", 100.0), _truth_row("y", 200.0)],
    )
    s = summarise(result, "dev", "adaptive")
    assert s is not None
    assert (s.probes, s.failures, s.cases) == (4, 1, 2)
    assert s.agreement.bias == pytest.approx(-0.25)  # errors 0, 0, −1, 0
    assert s.mean_cv == pytest.approx((0.0 + math.sqrt(2) * 100 / 100) / 2)


def test_a_case_no_rate_served_is_left_out_and_a_capacity_for_it_is_over() -> None:
    """A server a 1.2 s pause every 90 s puts past a 150 ms p99 at any rate has no
    capacity: its truth is none. Its probes are left out of the bias and limits (their
    error has no value), a probe that reported a capacity for it counts above the truth
    (a capacity the server does not have), and one that reported none does not."""
    result = _result(
        [_case("x", "heldout", "a"), _case("gc", "heldout", "a")],
        [
            _probe_row("x", 0, 110.0),
            _probe_row("x", 1, 100.0),
            _probe_row("gc", 0, 819.0),
            _probe_row("gc", 1, None),
        ],
        [_truth_row("x", 100.0), _truth_row("gc", None)],
    )
    s = summarise(result, "heldout", "adaptive")
    assert s is not None
    assert (s.probes, s.cases, s.untrue, s.phantom) == (2, 1, ("gc",), 1)
    assert s.agreement.bias == pytest.approx(0.05)  # x alone: +10 %, 0 %
    assert s.over == pytest.approx(2 / 4)  # x's +10 % and gc's 819 req/s, of 4 probes
    md = results_markdown(result, command="c", commit="abc1234")
    assert "No rate met the SLO in the truth's long runs of `gc`" in md
    # the regression of the errors on the servers leaves it out too (it raised, after
    # every probe of a study had run)
    many = result.model_copy(
        update={"probes": [*result.probes, *(_probe_row("x", k, 100.0 + k) for k in range(2, 12))]}
    )
    fit = regression(many, "heldout", "adaptive")
    assert fit is not None and fit.probes == 12
    assert "adaptive reported a capacity in 1 of their probes" in md


def _three_cases(estimates: dict[str, tuple[float, float]]) -> StudyResult:
    """Cases x, y, z (truths 100, 200, 400), two adaptive seeds each."""
    truths = {"x": 100.0, "y": 200.0, "z": 400.0}
    return _result(
        [_case(name, "dev", "a") for name in truths],
        [_probe_row(c, k, e) for c, pair in estimates.items() for k, e in enumerate(pair)],
        [_truth_row(c, t) for c, t in truths.items()],
    )


def test_the_over_estimate_share_and_the_icc_of_the_errors_by_hand() -> None:
    # Errors (estimate / truth − 1): x +10 %, +12 %; y −5 %, −3 %; z +30 %, +28 %: each
    # case off by its own amount, the seeds within 1 % of it.
    #   above truth by > 5 %: 0.10, 0.12, 0.30, 0.28: 4 of 6
    #   bias (0.10 + 0.12 − 0.05 − 0.03 + 0.30 + 0.28) / 6 = 0.72 / 6 = 0.12
    #   ICC(1,1), n = 3 cases, k = 2 seeds: case means 0.11, −0.04, 0.29, grand 0.12
    #     BMS = k·Σ(mean − grand)² / (n − 1) = 2·(0.0001 + 0.0256 + 0.0289) / 2 = 0.0546
    #     WMS = Σ(error − case mean)² / (n·(k − 1)) = 6·0.0001 / 3 = 0.0002
    #     (BMS − WMS) / (BMS + (k − 1)·WMS) = 0.0544 / 0.0548 = 136/137 ≈ 0.9927
    #   the errors are the cases' own: near 1, though capacities' ICC says nothing of it
    systematic = summarise(
        _three_cases({"x": (110.0, 112.0), "y": (190.0, 194.0), "z": (520.0, 512.0)}),
        "dev",
        "adaptive",
    )
    assert systematic is not None
    assert systematic.over == pytest.approx(4 / 6)
    assert systematic.agreement.bias == pytest.approx(0.12)
    assert systematic.error_icc == pytest.approx(136 / 137)
    # Errors x +10 %, −10 %; y +15 %, +5 %; z 0 %, +5 %: run-to-run noise, no case's own.
    #   above truth by > 5 %: 0.10 and 0.15 (+5 % exactly, 210 / 200 and 420 / 400, is
    #   not above it): 2 of 6
    #   ICC(1,1): case means 0, 0.10, 0.025, grand 0.25 / 6 = 1/24
    #     BMS = 2·((1/24)² + (7/120)² + (1/60)²) / 2 = 13/2400
    #     WMS = (0.01 + 0.01 + 0.0025 + 0.0025 + 0.000625 + 0.000625) / 3 = 21/2400
    #     (13 − 21) / (13 + 21) = −4/17 ≈ −0.235: below 0, noise
    noisy = summarise(
        _three_cases({"x": (110.0, 90.0), "y": (230.0, 210.0), "z": (400.0, 420.0)}),
        "dev",
        "adaptive",
    )
    assert noisy is not None
    assert noisy.over == pytest.approx(2 / 6)
    assert noisy.error_icc == pytest.approx(-4 / 17)
    # every error 0: the ICC is 0 / 0, none; nothing above the truth
    perfect = summarise(
        _three_cases({"x": (100.0, 100.0), "y": (200.0, 200.0), "z": (400.0, 400.0)}),
        "dev",
        "adaptive",
    )
    assert perfect is not None and perfect.error_icc is None and perfect.over == 0.0
    # no capacity (−100 %) is never an over-estimate; 5.1 % is
    assert over_share([relative_error(None, 100.0), relative_error(105.1, 100.0)]) == 0.5

    md = results_markdown(
        _three_cases({"x": (110.0, 112.0), "y": (190.0, 194.0), "z": (520.0, 512.0)}),
        command="ridgeline study vanguard",
        commit=None,
    )
    head = (
        "| split | strategy | cases | probes | no capacity | bias | 95 % limits of agreement "
        "| above truth by > 5 % | ICC(2,1) of capacities | ICC(1,1) of errors | mean CV "
        "| R² (slope) |"
    )
    assert head in md
    row = next(line for line in md.splitlines() if line.startswith("| dev | adaptive |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:6] == ["3", "6", "0", "+12.0 %"]
    assert (cells[7], cells[9]) == ("66.7 %", "0.993")


# ------------------------------------------------------------ the truth's reproducibility


@pytest.mark.timeout(60)
def test_each_case_gets_a_second_truth_from_another_seed_set(tmp_path: Path) -> None:
    # Both tiny cases, one probe a strategy, no ablations, short truths: about 3 s.
    truth = TruthConfig(requests=5_000, run_s=10.0, seeds=2)
    cfg = StudyConfig(
        seeds=1, dev_seeds=1, ablation_seeds=0, jobs=1, bank=_tiny_bank(tmp_path), truth=truth
    )
    result = run_study(cfg)
    assert [(t.case, t.variant) for t in result.truths] == [
        (c, v) for c in ("tiny-a", "tiny-b") for v in ("poisson", "poisson-reseeded")
    ]
    presets = {c.name: c.preset for c in load_bank(tmp_path)}
    for case, preset in presets.items():
        # the main truth as ever (seeds 0, 1); the second from seeds 1000, 1001
        first = true_capacity(preset, cfg=truth).capacity_rps
        second = true_capacity(preset, cfg=TruthConfig(**{**dict(truth), "first_seed": 1000}))
        assert first is not None and second.capacity_rps is not None
        assert result.truth(case) == first
        assert result.truth(case, "poisson-reseeded") == second.capacity_rps
        assert result.reproducibility[case] == second.capacity_rps / first - 1
    assert any(r != 0 for r in result.reproducibility.values())  # another seed set, another draw
    kept = reproducible(result)
    assert kept is not None
    assert [c.name for c in kept.result.cases] == [
        c for c, r in result.reproducibility.items() if r is not None and abs(r) <= 0.02
    ]
    # in the JSON, and read back
    data = json.loads(result.model_dump_json())
    assert data["reproducibility"] == result.reproducibility
    assert StudyResult.model_validate(data).reproducibility == result.reproducibility


def _reseeded_row(case: str, capacity: float | None) -> TruthRow:
    row = _truth_row(case, 1.0)
    return row.model_copy(update={"variant": "poisson-reseeded", "capacity_rps": capacity})


def test_the_well_conditioned_figures_leave_out_exactly_the_cases_past_2_percent() -> None:
    # Truths t1 / second truths t2: x 100 / 102 (+2.0 %, at the limit: in), w 50 / 49.5
    # (−1 %: in), y 200 / 190 (−5 %: out), z 400 / none (no second truth to say: out).
    # Adaptive errors: x +10 %, 0; w 0, +10 %; y −25 %, −25 %; z 0, 0.
    t1 = {"x": 100.0, "y": 200.0, "z": 400.0, "w": 50.0}
    t2 = {"x": 102.0, "y": 190.0, "z": None, "w": 49.5}
    estimates = {"x": (110.0, 100.0), "y": (150.0, 150.0), "z": (400.0, 400.0), "w": (50.0, 55.0)}
    result = _result(
        [_case(name, "dev", "a") for name in t1],
        [_probe_row(c, k, e) for c, pair in estimates.items() for k, e in enumerate(pair)],
        [_truth_row(c, t) for c, t in t1.items()] + [_reseeded_row(c, t) for c, t in t2.items()],
    )
    assert result.reproducibility == pytest.approx({"x": 0.02, "y": -0.05, "z": None, "w": -0.01})
    kept = reproducible(result)
    assert kept is not None
    assert [c.name for c in kept.result.cases] == ["x", "w"]
    assert [(c.name, r) for c, r in kept.left_out] == [("y", pytest.approx(-0.05)), ("z", None)]
    every = summarise(result, "dev", "adaptive")
    within = summarise(kept.result, "dev", "adaptive")
    assert every is not None and within is not None
    # every case as ever: (0.1 + 0 − 0.25 − 0.25 + 0 + 0 + 0 + 0.1) / 8
    assert (every.cases, every.probes) == (4, 8)
    assert every.agreement.bias == pytest.approx(-0.3 / 8)
    assert every.over == pytest.approx(2 / 8)
    # x and w alone: (0.1 + 0 + 0 + 0.1) / 4, two of four above +5 %
    assert (within.cases, within.probes) == (2, 4)
    assert within.agreement.bias == pytest.approx(0.05)
    assert within.over == pytest.approx(0.5)

    md = results_markdown(result, command="ridgeline study vanguard", commit=None)
    lines = md.splitlines()

    def row(start: str) -> list[str]:
        return [
            c.strip() for c in next(r for r in lines if r.startswith(start)).strip("|").split("|")
        ]

    bias = f"{every.agreement.bias * 100:+.1f} %".replace("-", "−")
    assert row("| dev | adaptive |")[2:6] == ["4", "8", "0", bias]
    cells = row("| dev, truth reproducible within 2 % (2 cases) | adaptive |")
    assert (cells[2:6], cells[7]) == (["2", "4", "0", "+5.0 %"], "50.0 %")
    assert "Left out: `y` (dev, −5.00 %); `z` (dev, n/a)." in md
    # the per-case table's column
    assert row("| `x` | dev |")[3] == "+2.00 %"
    assert row("| `z` | dev |")[3] == "n/a"
    # a result from before the second truth: the figures over every case alone
    old = result.model_copy(update={"truths": [t for t in result.truths if t.variant == "poisson"]})
    assert reproducible(old) is None
    assert "truth reproducible within" not in results_markdown(old, command="x", commit=None)


def test_the_calibration_fitted_on_dev_pairs_is_their_known_factor(tmp_path: Path) -> None:
    # dev: a's estimates 80, 100, 125 (geometric mean 100) against b's truth 150: factor
    # 1.5; a failed probe is left out of the fit and counted. Held out: a's 200 and 200
    # against b's 300, exactly 1.5 again: no bias left.
    cases = [
        _case("d-a", "dev", "a", "d"),
        _case("d-b", "dev", "b", "d"),
        _case("h-a", "heldout", "a", "h"),
        _case("h-b", "heldout", "b", "h"),
    ]
    probes = [
        _probe_row("d-a", 0, 80.0),
        _probe_row("d-a", 1, 100.0),
        _probe_row("d-a", 2, 125.0),
        _probe_row("d-a", 3, None),
        _probe_row("h-a", 0, 200.0),
        _probe_row("h-a", 1, 200.0),
    ]
    truths = [
        _truth_row("d-a", 90.0),
        _truth_row("d-b", 150.0),
        _truth_row("h-a", 190.0),
        _truth_row("h-b", 300.0),
    ]
    result = _result(cases, probes, truths)
    x = cross_hardware(result, "adaptive")
    assert x is not None
    assert x.factor == pytest.approx(1.5)
    assert (x.fitted_on, x.left_out, x.heldout_pairs, x.nominal) == (3, 1, 1, 1.6)
    assert x.heldout is not None and x.heldout.bias == pytest.approx(0.0, abs=1e-12)
    assert x.naive["heldout"].bias == pytest.approx(200 * 1.6 / 300 - 1)
    measured = measured_calibration(result, "test")
    assert measured is not None
    path = write_calibration(measured, tmp_path / "cal.json")
    assert read_calibration(path).factor == pytest.approx(1.5)


@pytest.mark.timeout(120)
def test_allocate_plans_with_a_measured_calibration(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(
        json.dumps(
            {
                "factor": 1.5,
                "from_hardware": "a",
                "to_hardware": "b",
                "fitted_on": 10,
                "heldout_bias": -0.01,
                "source": "ridgeline study vanguard (test)",
            }
        )
    )
    run = ridgeline(
        "allocate",
        "--capacity-rps",
        "100",
        "--demand-rps",
        "1000",
        "--calibration-from",
        str(path),
        "--json",
    )
    assert run.returncode == 0, run.stderr
    a = json.loads(run.stdout)
    # 1000 × 1.2 = 1200 req/s at 100 × 1.5 = 150 a replica: 8 replicas
    assert (a["per_replica_rps"], a["replicas"], a["inputs"]["calibration"]) == (150.0, 8, 1.5)
    both = ridgeline(
        "allocate",
        "--capacity-rps",
        "100",
        "--demand-rps",
        "1000",
        "--calibration",
        "0.9",
        "--calibration-from",
        str(path),
    )
    assert both.returncode == 2 and "keep one" in " ".join(both.stderr.split())
    path.write_text('{"factor": -1}')
    bad = ridgeline(
        "allocate",
        "--capacity-rps",
        "100",
        "--demand-rps",
        "1000",
        "--calibration-from",
        str(path),
    )
    assert bad.returncode == 2 and "is not a measured calibration" in " ".join(bad.stderr.split())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_command_runs_one_case_and_writes_its_document(tmp_path: Path) -> None:
    # a case whose truth and two probes take a second, not four
    out, js = tmp_path / "doc.md", tmp_path / "study.json"
    run = ridgeline(
        "study",
        "vanguard",
        "--case",
        "nlp-bigdelay",
        "--seeds",
        "1",
        "--dev-seeds",
        "1",
        "--ablation-seeds",
        "0",
        "--jobs",
        "1",
        "--out",
        str(out),
        "--json",
        str(js),
        timeout=280,
    )
    assert run.returncode == 0, run.stderr
    assert "[ 1/1] nlp-bigdelay" in run.stderr
    doc = out.read_text()
    assert (
        "`ridgeline study vanguard --seeds 1 --dev-seeds 1 --jobs 1 --case nlp-bigdelay "
        "--ablation-seeds 0`" in doc
    )
    data = json.loads(js.read_text())
    assert [(p["case"], p["strategy"]) for p in data["probes"]] == [
        ("nlp-bigdelay", "adaptive"),
        ("nlp-bigdelay", "binary"),
    ]
