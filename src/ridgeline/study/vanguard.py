"""``ridgeline study vanguard``: probe every case of the bank again and again, as
``ridgeline probe sim:FILE.yaml`` does with no options, and set the estimates beside the
truth.

For every held-out case, ``seeds`` probes with each strategy (``adaptive``, ``binary``),
seeds 0, 1, …, and ``dev_seeds`` for every dev case (the held-out half is the one judged;
the dev half, three times as large, is tuned on and needs fewer repeats): each is
``ridgeline probe sim:FILE.yaml --strategy S --seed k`` run as a library call (the case
written out as a plain sim file, the driver made by the CLI's own
``make_driver``, the config by ``cli_probe_config``, which builds what the CLI builds from
its defaults). The truth of each case comes from ``truth.true_capacity``.

Every case also gets a second Poisson truth, ``poisson-reseeded``: the same
``TruthConfig`` from an independent set of seeds (``first_seed`` + ``RESEED``, so seeds
1000–1003 beside 0–3). The probes are judged against the first alone; the second says
how well the truth itself is known (``StudyResult.reproducibility``: second / first −
1). On some servers it is ill-conditioned: an 800 ms stall every 60 s under a p99 <
300 ms bound leaves ~1.0 % ± 0.04 % of requests late anywhere from 260 to 340 req/s, so
two seed sets' truths differ by over 10 %, and a probe's error there is the truth's
noise as much as the probe's. ``study.stats`` sets the figures over the cases whose
truth reproduces within 2 % beside those over every case.

The ablations run adaptive on the held-out half with ``ablation_seeds`` seeds, each one
CLI option away from the baseline:

=================  ================================  ====================================
variant            the CLI option                    its truth
=================  ================================  ====================================
trace-code         ``--trace`` the code trace        recomputed under the trace, overlaid
trace-conv         ``--trace`` the chat trace        recomputed under the trace, overlaid
no-warmup          ``--no-warmup``                   the baseline's
batching-windows   ``--window`` 50 × batching delay  the baseline's
p99-only           ``--slo pXX<B`` (no error bound)  recomputed for that SLO
=================  ================================  ====================================

Recorded traffic (``TRACES``: the two bundled Azure traces, the code service's very
bursty, gap CV 13, and the conversation service's close to Poisson, CV 1.1): every case,
dev and held-out, gets a truth under each trace (``truth.Overlaid``: the whole trace's
copies superposed at the rate, as the probe's ``--trace`` replays it by default,
``--trace-scale overlay``, but computed apart from it), and ``ablation_seeds`` adaptive
probes replaying it (``--trace`` that trace). ``study.stats.recorded_traffic`` sets the
probes at the defaults (Poisson) and the trace probes against those truths: whether
synthetic traffic misjudges a server that real traffic loads, and whether replaying the
recording fixes it. With ``ablation_seeds`` 0 none of it runs.

The simulated driver has no batching awareness of its own: the network driver reads a
server's batching delay and widens its windows to 50 delays; the sim driver keeps the
``--window`` it is given (1 s). So the baseline probes a sim server *without* batching
awareness, and the ``batching-windows`` variant gives it the windows the network driver
would choose; it runs on every case whose windows that changes (a batching delay above
20 ms), dev ones included, since elsewhere it is the baseline itself.

Cases run in ``jobs`` processes; every probe and every truth is one task. Statistics over
the result are in ``study.stats``; rendering in ``report.vanguard``.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from ridgeline._same_named import same_named
from ridgeline.health.slo import parse_slo
from ridgeline.loadgen.step import StepConfig
from ridgeline.probe.api import default_slo, make_driver, run_probe
from ridgeline.probe.batching import window_for
from ridgeline.probe.orchestrator import ProbeConfig, ProbeResult
from ridgeline.study._pool import as_finished
from ridgeline.study.bank import Case, interference_load, load_bank, select, stall_fraction
from ridgeline.study.truth import Overlaid, Poisson, Traffic, Truth, TruthConfig, true_capacity
from ridgeline.workload.traces import bundled_trace_path, read_trace

Strategy = Literal["adaptive", "binary"]
TraceVariant = Literal["trace-code", "trace-conv"]
Variant = Literal["cli", "trace-code", "trace-conv", "no-warmup", "batching-windows", "p99-only"]
STRATEGIES: tuple[Strategy, ...] = ("adaptive", "binary")
ABLATIONS: tuple[Variant, ...] = (
    "trace-code",
    "trace-conv",
    "no-warmup",
    "batching-windows",
    "p99-only",
)
TruthVariant = Literal["poisson", "poisson-reseeded", "trace-code", "trace-conv", "p99-only"]
RESEED = 1000
"""The ``poisson-reseeded`` truth's seeds start this far past the main truth's
(``TruthConfig.seeds`` is at most 64, so the two sets never share a seed)."""
TRACES: dict[TraceVariant, str] = {
    "trace-code": "azure_llm_2023_code",
    "trace-conv": "azure_llm_2023_conv",
}
"""Each recorded-traffic variant's bundled trace (``bundled_trace_path``): the Azure LLM
code service's (gap CV 13, 2.6 req/s) and conversation service's (CV 1.1, 5.5 req/s)."""

QUICK_DEV_CASES = (
    "rec-bigbatch-a",
    "rank-tail",
    "vision-stall-a",
    "nlp-bert",
    "rank-pair-a",
    "rank-pair-b",
)
"""``--quick``'s dev sample, beside every held-out case: every class, a pair, a large
batching delay, a stall."""


def quick_cases(bank: list[Case]) -> tuple[str, ...]:
    """The cases ``--quick`` runs: every held-out case of ``bank`` (chosen by split, so a
    case added later is in) and the dev sample ``QUICK_DEV_CASES`` it holds, in the bank's
    order."""
    return tuple(c.name for c in bank if c.split == "heldout" or c.name in QUICK_DEV_CASES)


class StudyConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    seeds: int = Field(5, ge=1, le=100, description="probes per held-out case and strategy")
    dev_seeds: int = Field(3, ge=1, le=100, description="probes per dev case and strategy")
    ablation_seeds: int = Field(2, ge=0, le=100, description="probes per case and ablation")
    jobs: int = Field(2, ge=1, le=64, description="processes")
    cases: tuple[str, ...] | None = Field(None, description="bank cases to run; None: all")
    bank: Path | None = Field(None, description="a bank directory; None: the shipped one")
    truth: TruthConfig = Field(default_factory=TruthConfig)
    traces: tuple[TraceVariant, ...] = Field(
        tuple(TRACES), description="the recorded traffic each case is probed and judged under"
    )

    @classmethod
    def quick(cls, **overrides: Any) -> StudyConfig:
        """A few minutes' study: every held-out case and a dev sample (``quick_cases`` of
        the bank, the shipped one or ``bank``), 2 seeds, 1 per ablation; ``cases`` given
        replace them."""
        if "cases" not in overrides:
            overrides["cases"] = quick_cases(load_bank(overrides.get("bank")))
        return cls.model_validate({"seeds": 2, "dev_seeds": 2, "ablation_seeds": 1, **overrides})

    def seeds_for(self, case: Case) -> int:
        """Probes per strategy for ``case``: ``seeds`` held out, ``dev_seeds`` in dev."""
        return self.seeds if case.split == "heldout" else self.dev_seeds


def cli_probe_config(slo: str, strategy: str, seed: int, *, warmup: bool = True) -> ProbeConfig:
    """The config ``ridgeline probe`` builds when given only ``--slo``, ``--strategy``,
    ``--seed`` (and ``--no-warmup``): every other option at its default. A test holds it
    to the command's own output."""
    return ProbeConfig.model_validate(
        {
            "slo": slo,
            "strategy": strategy,
            "strategy_options": {"min_rate": 1.0, "step_duration_s": 10.0, "precision": 0.02},
            "warmup": warmup,
            "warmup_config": {"rate": None, "requests": None},
            "confirm": True,
            "confirm_margin": 0.0,
            "seed": seed,
        }
    )


def p99_only(slo: str) -> str:
    """The SLO's p99 bound alone (its first latency bound when it has no p99), as
    ``--slo`` would be given it: no error bound (the policy's default then applies)."""
    policy = parse_slo(slo)
    if not policy.latency:
        raise ValueError(f"SLO {slo!r} bounds no latency: it has no single-metric form")
    bound = next((b for b in policy.latency if b.percentile == "p99"), policy.latency[0])
    return f"{bound.percentile}<{bound.bound_ms:g}ms"


def batching_window_s(case: Case) -> float:
    """The window the network driver would use for this server (its batching delay
    read from a model config): ``probe.batching.window_for`` of the delay and 1 s."""
    return window_for(case.preset.model.batching.max_queue_delay_s, StepConfig().window_s)


class ProbeRow(BaseModel):
    case: str
    strategy: Strategy
    variant: Variant
    seed: int
    capacity_rps: float | None
    confirmed: bool | None
    test_seconds: float
    requests_sent: int
    status: str
    reason: str
    wall_s: float


class TruthRow(BaseModel):
    case: str
    variant: TruthVariant
    slo: str
    capacity_rps: float | None
    failing_rps: float
    broken_by: str
    """What the long runs at ``failing_rps`` broke (``truth.Truth.broken_by``)."""
    requests_per_rate: int
    evaluations: int
    wall_s: float
    note: str = ""


class CaseRow(BaseModel):
    name: str
    klass: str
    split: str
    hardware: str
    pair: str | None
    behaviour: str
    traits: list[str]
    slo: str
    speed: float
    nominal_rps: float
    noise_cv: float
    stall_fraction: float
    batching_delay_s: float
    warmup_factor: float
    interference_load: float


class StudyResult(BaseModel):
    seeds: int
    """Probes per held-out case and strategy."""
    dev_seeds: int = 0
    """Probes per dev case and strategy (0: a result from before they differed, ``seeds``)."""
    ablation_seeds: int
    jobs: int
    cpus: int | None = None
    """The machine's processors (``os.cpu_count()``)."""
    started_at: datetime
    wall_s: float
    cases: list[CaseRow]
    truths: list[TruthRow]
    probes: list[ProbeRow]

    def truth(self, case: str, variant: TruthVariant = "poisson") -> float | None:
        for t in self.truths:
            if t.case == case and t.variant == variant:
                return t.capacity_rps
        raise KeyError(f"no {variant} truth for case {case!r}")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reproducibility(self) -> dict[str, float | None]:
        """Per case, how well its truth is known: the ``poisson-reseeded`` truth (another
        seed set) over the ``poisson`` one, less 1; None where either is missing or None
        (a result from before the second truth has none). In the JSON beside the truths."""
        found = {(t.case, t.variant): t.capacity_rps for t in self.truths}
        out: dict[str, float | None] = {}
        for c in self.cases:
            first = found.get((c.name, "poisson"))
            second = found.get((c.name, "poisson-reseeded"))
            out[c.name] = None if not first or second is None else second / first - 1.0
        return out


@dataclass(frozen=True)
class _ProbeTask:
    case: str
    sim_file: Path
    strategy: Strategy
    variant: Variant
    seed: int
    window_s: float
    cost: float


@dataclass(frozen=True)
class _TruthTask:
    case: Case
    variant: Literal["poisson", "poisson-reseeded", "trace-code", "trace-conv"]
    truth: TruthConfig
    single_metric: bool
    """Also the truth under ``p99_only`` of the SLO (after the Poisson truth)."""
    cost: float


def probe_as_cli(
    sim_file: Path,
    strategy: str,
    seed: int,
    variant: Variant = "cli",
    *,
    window_s: float | None = None,
) -> ProbeResult:
    """``ridgeline probe sim:SIM_FILE --strategy S --seed K`` and the variant's option
    (``--trace`` its bundled trace, replayed as overlay by default, ``--no-warmup``,
    ``--slo`` its p99 bound alone, or ``--window`` for ``batching-windows``), as a
    library call: the CLI's driver and config (a test holds it to the command's
    output)."""
    target = f"sim:{sim_file}"
    slo = default_slo(target) or ""
    if variant == "p99-only":
        slo = p99_only(slo)
    if window_s is None:
        window_s = StepConfig().window_s
    cfg = cli_probe_config(slo, strategy, seed, warmup=variant != "no-warmup")
    trace = bundled_trace_path(TRACES[variant]) if variant in TRACES else None
    driver = make_driver(target, step=StepConfig(window_s=window_s), trace=trace)
    return run_probe(driver, cfg)


def _probe(task: _ProbeTask) -> ProbeRow:
    started = time.perf_counter()
    r = probe_as_cli(task.sim_file, task.strategy, task.seed, task.variant, window_s=task.window_s)
    # the task's strategy, variant and seed; the result's capacity, cost and status
    return same_named(
        ProbeRow, r, task, reason=r.reason[:200], wall_s=time.perf_counter() - started
    )


def _truth_row(case: str, variant: TruthVariant, slo: str, t: Truth, note: str = "") -> TruthRow:
    return same_named(TruthRow, t, case=case, variant=variant, slo=slo, wall_s=t.seconds, note=note)


def recorded(variant: TraceVariant) -> Overlaid:
    """The truth's traffic for a recorded-traffic variant: its bundled trace overlaid."""
    return Overlaid(read_trace(bundled_trace_path(TRACES[variant])), name=variant)


def reseeded(cfg: TruthConfig) -> TruthConfig:
    """The ``poisson-reseeded`` truth's config: ``cfg`` from seeds ``RESEED`` further on."""
    return cfg.model_copy(update={"first_seed": cfg.first_seed + RESEED})


def _truths(task: _TruthTask) -> list[TruthRow]:
    """The case's truth under its traffic; with ``single_metric`` also under its SLO's
    p99 bound alone. That one is the same bracket when the runs at the failing rate broke
    the p99 bound (or the rate is the saturated throughput): the looser SLO holds where
    the full one held, and fails where the p99 bound failed; it is computed only when the
    error bound decided. ``poisson-reseeded`` is the Poisson truth from ``reseeded``
    seeds (its task carries the main truth's config)."""
    c, slo = task.case, task.case.preset.slo
    if task.variant == "poisson-reseeded":
        t = true_capacity(c.preset, traffic=Poisson(), cfg=reseeded(task.truth))
        return [_truth_row(c.name, task.variant, slo, t)]
    if task.variant != "poisson":
        traffic: Traffic = recorded(task.variant)
        t = true_capacity(c.preset, traffic=traffic, cfg=task.truth)
        return [_truth_row(c.name, task.variant, slo, t)]
    base = true_capacity(c.preset, traffic=Poisson(), cfg=task.truth)
    rows = [_truth_row(c.name, "poisson", slo, base)]
    if task.single_metric:
        single = p99_only(slo)
        kept = single.split("<", 1)[0]
        if base.broken_by in ("saturation", kept):
            note = f"the Poisson truth's bracket: its failing rate broke {base.broken_by}"
            rows.append(_truth_row(c.name, "p99-only", single, replace(base, seconds=0.0), note))
        else:
            t = true_capacity(c.preset, single, cfg=task.truth)
            rows.append(_truth_row(c.name, "p99-only", single, t))
    return rows


def _run(task: _ProbeTask | _TruthTask) -> list[ProbeRow | TruthRow]:
    if isinstance(task, _ProbeTask):
        return [_probe(task)]
    return list(_truths(task))


def case_row(case: Case) -> CaseRow:
    m = case.preset.model
    return same_named(
        CaseRow,
        case,
        traits=sorted(case.traits),
        slo=case.preset.slo,
        speed=case.preset.speed,
        nominal_rps=case.nominal_rps,
        noise_cv=m.noise_cv,
        stall_fraction=stall_fraction(case),
        batching_delay_s=m.batching.max_queue_delay_s if m.batching.max_batch_size > 1 else 0.0,
        warmup_factor=1.0 if m.warmup is None else m.warmup.factor,
        interference_load=interference_load(case),
    )


def _tasks(
    cases: list[Case], files: dict[str, Path], cfg: StudyConfig
) -> list[_ProbeTask | _TruthTask]:
    """Every task, the dearest first (a probe costs about its windows: ~10,000 requests
    a confirmation at the capacity, so low rates cost most)."""
    tasks: list[_ProbeTask | _TruthTask] = []
    for c in cases:
        cost = 1.0 + 1e4 / max(c.nominal_rps, 1.0)
        n = cfg.seeds_for(c)
        probe: list[tuple[Strategy, Variant, int]] = [(s, "cli", n) for s in STRATEGIES]
        window = batching_window_s(c)
        for v in ABLATIONS:
            if v == "batching-windows" and window == StepConfig().window_s:
                continue
            if v in TRACES and v not in cfg.traces:
                continue
            if v not in ("batching-windows", *TRACES) and c.split != "heldout":
                continue  # the recorded-traffic variants run on both halves
            probe.append(("adaptive", v, cfg.ablation_seeds))
        for strategy, variant, seeds in probe:
            w = window if variant == "batching-windows" else StepConfig().window_s
            for k in range(seeds):
                tasks.append(_ProbeTask(c.name, files[c.name], strategy, variant, k, w, cost))
        ablated = c.split == "heldout" and cfg.ablation_seeds > 0
        tasks.append(_TruthTask(c, "poisson", cfg.truth, ablated, 30.0 + cost))
        tasks.append(_TruthTask(c, "poisson-reseeded", cfg.truth, False, 30.0 + cost))
        if cfg.ablation_seeds > 0:
            for trace in cfg.traces:
                tasks.append(_TruthTask(c, trace, cfg.truth, False, 30.0 + cost))
    return sorted(tasks, key=lambda t: -t.cost)


@dataclass(frozen=True)
class CaseDone:
    """A case whose every task has finished: what the progress line shows."""

    index: int
    total: int
    case: CaseRow
    truths: list[TruthRow]
    probes: list[ProbeRow]
    elapsed_s: float


CaseFn = Callable[[CaseDone], None]


def run_study(cfg: StudyConfig, *, on_case: CaseFn | None = None) -> StudyResult:
    """Probe every case of the bank (``cfg.cases``, or all) and compute its truth."""
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    bank = load_bank(cfg.bank)
    cases = select(bank, list(cfg.cases)) if cfg.cases is not None else bank
    rows = {c.name: case_row(c) for c in cases}
    with tempfile.TemporaryDirectory(prefix="ridgeline-vanguard-") as tmp:
        files = {c.name: c.write_sim_file(Path(tmp)) for c in cases}
        tasks = _tasks(cases, files, cfg)
        left = {c.name: 0 for c in cases}
        for t in tasks:
            left[t.case if isinstance(t, _ProbeTask) else t.case.name] += 1
        truths: list[TruthRow] = []
        probes: list[ProbeRow] = []
        done = 0
        for finished in as_finished(_run, tasks, cfg.jobs):
            for row in finished:
                if isinstance(row, TruthRow):
                    truths.append(row)
                else:
                    probes.append(row)
            case = finished[0].case
            left[case] -= 1
            if left[case] == 0:
                done += 1
                if on_case is not None:
                    on_case(
                        CaseDone(
                            done,
                            len(cases),
                            rows[case],
                            [t for t in truths if t.case == case],
                            [p for p in probes if p.case == case],
                            time.perf_counter() - started,
                        )
                    )
    order = {c.name: i for i, c in enumerate(cases)}
    return StudyResult(
        seeds=cfg.seeds,
        dev_seeds=cfg.dev_seeds,
        ablation_seeds=cfg.ablation_seeds,
        jobs=cfg.jobs,
        cpus=os.cpu_count(),
        started_at=started_at,
        wall_s=time.perf_counter() - started,
        cases=list(rows.values()),
        truths=sorted(truths, key=lambda t: (order[t.case], t.variant)),
        probes=sorted(probes, key=lambda p: (order[p.case], p.variant, p.strategy, p.seed)),
    )


def relative_error(estimate: float | None, truth: float) -> float:
    """estimate / truth − 1; a probe that gave no capacity is −100 %."""
    if not (truth > 0 and math.isfinite(truth)):
        raise ValueError(f"a truth must be a finite capacity > 0, got {truth}")
    return -1.0 if estimate is None else estimate / truth - 1.0
