"""The planner's MILP: exact answers on small cases, every plan re-checked by an
independent checker on random specs and profiles, optimality against brute force, and
infeasibility that names what binds."""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections import Counter, defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ridgeline.cli import app
from ridgeline.errors import ConfigError, InfeasiblePlan, PlanError
from ridgeline.pipeline.gpu import gpu_type, parse_gpus
from ridgeline.pipeline.plan import load_plan
from ridgeline.pipeline.planned import max_demand, to_plan
from ridgeline.pipeline.planner import (
    Config,
    Features,
    PlannedTask,
    PlannerOptions,
    PlanResult,
    plan_pipeline,
)
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
from ridgeline.pipeline.roofline import modelled_rows
from ridgeline.pipeline.segments import segment_cost
from ridgeline.pipeline.spec import PipelineSpec, load_spec

GPU = "A100-80GB"
runner = CliRunner(env={"COLUMNS": "200"})


def row(variant: str, segment: str, batch: int, ms: float, pool: str = GPU) -> ProfileRow:
    return ProfileRow(variant, pool, segment, batch, ms, batch / ms * 1000.0)


def spec(**over: Any) -> PipelineSpec:
    doc: dict[str, Any] = {
        "name": "p",
        "slo_ms": 100,
        "demand_rps": 100,
        "tasks": {
            "detect": {
                "variants": [{"name": "small", "accuracy": 30}, {"name": "big", "accuracy": 50}]
            },
            "classify": {"variants": [{"name": "cls", "accuracy": 80}]},
        },
        "edges": [{"source": "detect", "target": "classify", "factor": 2}],
    }
    doc.update(over)
    return PipelineSpec.model_validate(doc)


# --- an independent checker -------------------------------------------------------------


def check(result: PlanResult, table: ProfileTable, available: dict[str, float]) -> None:
    """Re-check a plan from its Plan document, the spec and the table alone: demand met
    at most 90 % busy, every path's fill and execution within the SLO (the wait is
    checked against a simulation in test_queueing), compute slices within what is
    available and a layout on the GPUs, the accuracy floor on every path."""
    s, plan = result.spec, to_plan(result)
    rows = {(r.variant, r.pool, r.segment, r.batch): r for r in table}

    def demand(task: str) -> float:
        into = [e for e in s.edges if e.target == task]
        if not into:
            return s.demand_rps
        return sum(demand(e.source) * e.factor_for(plan.tasks[e.source].variant) for e in into)

    latency: dict[str, float] = {}
    whole: dict[str, Counter[str]] = defaultdict(Counter)
    shares: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
    for name, t in plan.tasks.items():
        seg = t.segment
        assert seg.kind in ("mig", "mps")
        label = (
            seg.profile
            if seg.kind == "mig"
            else f"{seg.profile}@{Fraction(seg.share).limit_denominator(12)}"
        )
        r = rows[(t.variant, seg.gpu, label, t.batch_size)]
        assert t.instances * r.throughput_rps * 0.9 >= demand(name) * (1 - 1e-9), name
        fill_ms = (t.batch_size - 1) / demand(name) * 1000
        assert t.max_queue_delay_ms <= r.latency_ms + 1e-6
        latency[name] = min(fill_ms, r.latency_ms) + r.latency_ms
        if seg.kind == "mig":
            whole[seg.gpu][seg.profile] += t.instances
        else:
            shares[seg.gpu, seg.profile] += Fraction(seg.share).limit_denominator(12) * t.instances
    for (gpu, profile), total in shares.items():  # MPS clients take whole slices
        whole[gpu][profile] += math.ceil(total)
    for pool, counts in whole.items():
        compute = sum(gpu_type(pool).profile(p).compute * n for p, n in counts.items())
        assert compute <= available[pool] + 1e-9
        assert gpus_needed(counts) <= math.ceil(available[pool] / 7 - 1e-9), counts
    for path in walk(s):
        assert sum(latency[t] for t in path) <= s.slo_ms + 1e-6, path
        acc = math.prod(
            s.tasks[t].variant(plan.tasks[t].variant).accuracy / s.tasks[t].best_accuracy()
            for t in path
        )
        assert acc >= s.accuracy_floor - 1e-9, path


def walk(s: PipelineSpec) -> list[list[str]]:
    targets = {e.target for e in s.edges}
    out: list[list[str]] = []

    def go(t: str, prefix: list[str]) -> None:
        nxt = [e.target for e in s.edges if e.source == t]
        if not nxt:
            out.append([*prefix, t])
        for n in nxt:
            go(n, [*prefix, t])

    for t in s.tasks:
        if t not in targets:
            go(t, [])
    return out


MAXIMAL_A100_LAYOUTS = [
    # NVIDIA's MIG user guide, A100 valid combinations, over 1g.10gb, 2g.20gb, 3g.40gb and
    # 7g.80gb only (the profiles these tests use), each no other instance can join
    {"7g.80gb": 1},
    {"3g.40gb": 2},
    {"3g.40gb": 1, "2g.20gb": 2},
    {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
    {"3g.40gb": 1, "1g.10gb": 4},
    {"2g.20gb": 3, "1g.10gb": 1},
    {"2g.20gb": 2, "1g.10gb": 3},
    {"2g.20gb": 1, "1g.10gb": 5},
    {"1g.10gb": 7},
]
ORDER = ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")


def gpus_needed(counts: Counter[str]) -> int:
    """The fewest A100s that hold these instances, by dynamic programming over the
    documented layouts (independent of ``gpu.layouts``)."""
    assert set(counts) <= set(ORDER), counts

    @functools.cache
    def need(left: tuple[int, ...]) -> int:
        if not any(left):
            return 0
        return 1 + min(
            need(tuple(max(0, n - lay.get(p, 0)) for n, p in zip(left, ORDER, strict=True)))
            for lay in MAXIMAL_A100_LAYOUTS
            if any(lay.get(p, 0) and n for n, p in zip(left, ORDER, strict=True))
        )

    return need(tuple(counts.get(p, 0) for p in ORDER))


def cost(counts: Counter[str]) -> float:
    """What the instances take of their GPUs: the mean of compute slices (of 7) and
    memory slices (of 8) as fractions of a GPU, times 7."""
    spans = {"1g.10gb": (1, 1), "2g.20gb": (2, 2), "3g.40gb": (3, 4), "7g.80gb": (7, 8)}
    return sum((spans[p][0] / 7 + spans[p][1] / 8) / 2 * 7 * n for p, n in counts.items())


# --- exact answers ----------------------------------------------------------------------


def table_two_tasks() -> ProfileTable:
    return ProfileTable(
        [
            row("small", "1g.10gb", 1, 5.0),  # 200/s
            row("small", "1g.10gb", 4, 10.0),  # 400/s
            row("big", "1g.10gb", 4, 40.0),  # 100/s
            row("big", "3g.40gb", 4, 12.0),  # 333/s
            row("cls", "1g.10gb", 8, 20.0),  # 400/s
            row("cls", "1g.10gb@1/2", 8, 30.0),  # 267/s on half a slice
        ]
    )


def test_the_fewest_slices_that_meet_demand_latency_and_the_floor() -> None:
    """Detect at 100/s must run 'big' ('small' is 60 % as accurate, under the 0.9
    floor). On 1g, big serves 80/s at 80 % busy: two instances, each batch waiting up to
    30 ms to fill, 70 ms in all, which leaves classify 30 ms: too little for either of
    its rows (40 ms on 1g, 60 ms on half a slice). So big on one 3g (24 ms: 3 compute
    and 4 memory slices, cost (3 + 3.5)/2) and classify at 200/s on one 1g slice, whole
    (400/s, 40 ms) or as a lone MPS client of it (213/s at 80 %, 60 ms): a lone client
    takes the slice as well, so both cost (1 + 0.875)/2. In all 4 compute slices, 5
    memory slices, cost 4.1875."""
    t = table_two_tasks()
    result = plan_pipeline(spec(), t, {GPU: 14})
    detect, classify = result.tasks["detect"], result.tasks["classify"]
    assert (detect.variant, detect.config.row.segment, detect.instances) == ("big", "3g.40gb", 1)
    assert classify.instances == 1
    assert classify.config.row.segment in {"1g.10gb", "1g.10gb@1/2"}
    assert (result.slices, result.memory_slices, result.cost) == (
        {GPU: 4.0},
        {GPU: 5.0},
        {GPU: 4.1875},
    )
    assert result.accuracy == 1.0
    check(result, t, {GPU: 14})


def test_a_looser_slo_buys_fewer_slices() -> None:
    loose = plan_pipeline(spec(slo_ms=200), table_two_tasks(), {GPU: 14})
    tight = plan_pipeline(spec(), table_two_tasks(), {GPU: 14})
    assert loose.slices_used < tight.slices_used
    check(loose, table_two_tasks(), {GPU: 14})


def test_a_lower_floor_lets_a_cheaper_variant_in() -> None:
    cheap = plan_pipeline(spec(accuracy_floor=0.5, slo_ms=200), table_two_tasks(), {GPU: 14})
    assert cheap.tasks["detect"].variant == "small"
    assert cheap.accuracy == pytest.approx(0.6)


def test_variant_dependent_factors_set_the_childs_demand() -> None:
    s = spec(
        slo_ms=200,
        accuracy_floor=0.5,
        edges=[{"source": "detect", "target": "classify", "factor": {"small": 1, "big": 3}}],
    )
    result = plan_pipeline(s, table_two_tasks(), {GPU: 14})
    assert result.tasks["detect"].variant == "small"
    assert result.tasks["classify"].demand_rps == 100.0
    check(result, table_two_tasks(), {GPU: 14})


def test_switches_off_narrow_the_choices() -> None:
    t = table_two_tasks()
    no_a = plan_pipeline(
        spec(accuracy_floor=0.5, slo_ms=200), t, {GPU: 14}, Features(False, True, True)
    )
    assert no_a.tasks["detect"].variant == "big"  # only each task's best
    # without spatial partitioning only whole GPUs with MIG off: not the 7g profile
    whole = ProfileTable(
        [*t, *(row(v, seg, 8, 8.0) for v in ("big", "cls") for seg in ("7g.80gb", "gpu"))]
    )
    no_s = plan_pipeline(spec(), whole, {GPU: 14}, Features(True, False, True))
    assert {p.config.row.segment for p in no_s.tasks.values()} == {"gpu"}
    assert (no_s.slices, no_s.memory_slices, no_s.cost) == ({GPU: 14}, {GPU: 16}, {GPU: 14})
    assert Features.parse("a, t").label == "A+T" and Features.parse("none").label == "none"
    with pytest.raises(PlanError, match="features X: write a subset of A,S,T"):
        Features.parse("A,X")


# --- infeasible: what binds -------------------------------------------------------------


def test_an_slo_under_the_fastest_path_names_the_gap() -> None:
    with pytest.raises(InfeasiblePlan, match=r"fastest path detect -> classify already takes") as e:
        plan_pipeline(spec(slo_ms=20), table_two_tasks(), {GPU: 14})
    assert e.value.binding == "latency"


def test_too_few_slices_says_how_many_are_needed() -> None:
    with pytest.raises(InfeasiblePlan, match=r"4 slices needed on A100-80GB, 2 available") as e:
        plan_pipeline(spec(), table_two_tasks(), {GPU: 2})
    assert e.value.binding == "resources"


def test_a_floor_out_of_reach_within_the_slo_says_so() -> None:
    t = ProfileTable(
        [
            row("small", "1g.10gb", 1, 5.0),
            row("big", "1g.10gb", 1, 95.0),
            row("cls", "1g.10gb", 1, 10.0),
        ]
    )
    with pytest.raises(InfeasiblePlan, match=r"accuracy floor 0\.9 needs variants") as e:
        plan_pipeline(spec(), t, {GPU: 56})
    assert e.value.binding == "accuracy"


def test_a_variant_without_profile_rows_is_named() -> None:
    with pytest.raises(
        PlanError, match=r"task 'classify' has no profile rows for its variants \(cls\)"
    ):
        plan_pipeline(spec(), ProfileTable([row("big", "3g.40gb", 4, 12.0)]), {GPU: 14})


def test_max_demand_is_the_edge_of_feasibility() -> None:
    t, avail = table_two_tasks(), {GPU: 7.0}
    top, result = max_demand(spec(), lambda s: plan_pipeline(s, t, avail), rel=0.01)
    assert result is not None
    check(result, t, avail)
    with pytest.raises(InfeasiblePlan):
        plan_pipeline(spec(demand_rps=top * 1.02), t, avail)


# --- properties on random specs and profiles --------------------------------------------

PROFILES = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "1g.10gb@1/2", "1g.10gb@1/3"]
SPEED = {
    "1g.10gb": 1,
    "2g.20gb": 2,
    "3g.40gb": 3,
    "7g.80gb": 7,
    "1g.10gb@1/2": 0.5,
    "1g.10gb@1/3": 0.33,
}


@st.composite
def cases(draw: st.DrawFn) -> tuple[PipelineSpec, ProfileTable, dict[str, float]]:
    n = draw(st.integers(1, 4))
    names = [f"t{i}" for i in range(n)]
    tasks: dict[str, Any] = {}
    rows = []
    for t in names:
        k = draw(st.integers(1, 3))
        variants = []
        for j in range(k):
            v = f"{t}v{j}"
            acc = draw(st.floats(0.5, 1.0))
            variants.append({"name": v, "accuracy": acc})
            work = draw(st.floats(1.0, 30.0))  # ms per item on a 1g slice
            for seg in draw(
                st.lists(st.sampled_from(PROFILES), min_size=1, max_size=4, unique=True)
            ):
                for b in draw(
                    st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3, unique=True)
                ):
                    ms = (2.0 + work * b**0.7) / SPEED[seg]
                    rows.append(row(v, seg, b, ms))
        tasks[t] = {"variants": variants}
    edges = []
    for i in range(1, n):  # a DAG: every later task has a parent among the earlier ones
        parent = names[draw(st.integers(0, i - 1))]
        if draw(st.booleans()):
            f: Any = draw(st.floats(0.5, 3.0))
        else:
            f = {v["name"]: draw(st.floats(0.5, 3.0)) for v in tasks[parent]["variants"]}
        edges.append({"source": parent, "target": names[i], "factor": f})
    s = PipelineSpec.model_validate(
        {
            "name": "r",
            "slo_ms": draw(st.floats(30, 400)),
            "accuracy_floor": draw(st.floats(0.3, 1.0)),
            "demand_rps": draw(st.floats(5, 500)),
            "tasks": tasks,
            "edges": edges,
        }
    )
    return s, ProfileTable(rows), {GPU: float(7 * draw(st.integers(1, 30)))}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_plan_passes_the_independent_checker(
    case: tuple[PipelineSpec, ProfileTable, dict[str, float]],
) -> None:
    s, table, avail = case
    try:
        result = plan_pipeline(s, table, avail)
    except InfeasiblePlan as e:
        assert e.binding in ("latency", "accuracy", "resources")
        return
    check(result, table, avail)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_plan_uses_no_more_slices_than_brute_force(
    case: tuple[PipelineSpec, ProfileTable, dict[str, float]],
) -> None:
    """On specs small enough to enumerate, the MILP's cost equals the least any
    combination of configurations needs (each with its fewest instances) that the
    documented A100 layouts can hold."""
    s, table, avail = case
    assume(len(s.tasks) <= 2)
    best = brute_force(s, table, avail)
    try:
        result = plan_pipeline(s, table, avail, options=PlannerOptions(mip_gap=0.0))
    except InfeasiblePlan:
        assert best is None
        return
    assert best is not None
    assert sum(result.cost.values()) == pytest.approx(best, abs=1e-6)


def brute_force(s: PipelineSpec, table: ProfileTable, avail: dict[str, float]) -> float | None:
    """The least cost over every combination of (row, instance count) per task, each
    option's latency as the planner's own ``PlannedTask`` gives it (this checks the
    MILP's search, not the latency model), its layout by the documented A100 layouts."""
    names = list(s.tasks)
    options = PlannerOptions()
    best: float | None = None
    rows = [[r for r in table if r.variant in {v.name for v in s.tasks[t].variants}] for t in names]
    for combo in itertools.product(*rows):
        pick = dict(zip(names, combo, strict=True))
        variants = {t: r.variant for t, r in pick.items()}
        acc_ok = all(
            math.prod(
                s.tasks[t].variant(variants[t]).accuracy / s.tasks[t].best_accuracy() for t in p
            )
            >= s.accuracy_floor - 1e-12
            for p in walk(s)
        )
        if not acc_ok:
            continue
        each = [
            PlannedTask.candidates(
                Config(t, r, 1.0, segment_cost(GPU, r.segment)), s.demand(t, variants), options
            )
            for t, r in pick.items()
        ]
        for planned in itertools.product(*each):
            by_task = dict(zip(names, planned, strict=True))
            if any(sum(by_task[t].latency_ms for t in p) > options.bound_ms(s) for p in walk(s)):
                continue
            counts: Counter[str] = Counter()
            shares: dict[str, Fraction] = defaultdict(Fraction)
            for p in planned:
                profile, _, share = p.config.row.segment.partition("@")
                if share:
                    shares[profile] += Fraction(share) * p.instances
                else:
                    counts[profile] += p.instances
            for profile, total in shares.items():
                counts[profile] += math.ceil(total)
            compute = sum(gpu_type(GPU).profile(p).compute * n for p, n in counts.items())
            room = gpus_needed(counts) <= math.ceil(avail[GPU] / 7)
            if compute <= avail[GPU] + 1e-9 and room and (best is None or cost(counts) < best):
                best = cost(counts)
    return best


# --- the command ------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "specs"


def test_ridgeline_plan_prints_a_plan_its_placement_and_writes_what_serve_reads(
    tmp_path: Path,
) -> None:
    s = load_spec(EXAMPLES / "traffic.yaml")
    variants = [v for t in s.tasks.values() for v in t.variants]
    profiles = tmp_path / "p.csv"
    profiles.write_text(ProfileTable(modelled_rows(variants, GPU, (1, 4, 16))).to_csv())
    args = ["plan", str(EXAMPLES / "traffic.yaml"), "--profiles", str(profiles)]
    got = runner.invoke(
        app,
        [
            *args,
            "--gpus",
            "4xA100-80GB",  # the check sizes this plan up twice; on 3 GPUs it runs out
            "--json",
            "--out",
            str(tmp_path / "plan.yaml"),
            "--mig-parted",
            str(tmp_path / "mig.yaml"),
        ],
    )
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)  # nothing else on stdout (HiGHS's banner included)
    assert set(doc["tasks"]) == {"detect", "car", "face"}
    assert doc["slices_used"] <= 28 and doc["accuracy"] >= 0.9
    assert sum(doc["placement"]["gpus"].values()) <= 4
    # served in the simulator first, under Poisson arrivals and the bundled trace
    poisson, *trace = doc["check"]["runs"]  # the trace from six sets of starting points
    assert "poisson" in poisson["arrivals"].lower() and poisson["requests"] >= 19_000
    assert len({t["arrivals"] for t in trace}) == 6 and "overlaid" in trace[0]["arrivals"]
    for run in (poisson, *trace):
        assert run["violation_rate"] < 0.005, run
    unchecked = runner.invoke(app, [*args, "--gpus", "4xA100-80GB", "--json", "--no-check"])
    assert "check" not in json.loads(unchecked.stdout)
    plan = load_plan(tmp_path / "plan.yaml")
    assert {t: p.instances for t, p in plan.tasks.items()} == {
        t: v["instances"] for t, v in doc["tasks"].items()
    }
    mig = yaml.safe_load((tmp_path / "mig.yaml").read_text())
    assert mig["version"] == "v1" and mig["mig-configs"]["ridgeline"]
    tight = runner.invoke(app, [*args, "--gpus", "1xA100-80GB", "--demand", "5000"])
    assert tight.exit_code != 0
    assert "slices needed on A100-80GB, 7 available" in tight.output


def test_bad_specs_and_gpus_name_the_problem(tmp_path: Path) -> None:
    cyclic = {
        "name": "c",
        "slo_ms": 100,
        "demand_rps": 1,
        "tasks": {
            "a": {"variants": [{"name": "x", "accuracy": 1}]},
            "b": {"variants": [{"name": "y", "accuracy": 1}]},
        },
        "edges": [{"source": "a", "target": "b"}, {"source": "b", "target": "a"}],
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cyclic))
    with pytest.raises(PlanError, match="the task graph has a cycle: a -> b -> a; remove an edge"):
        load_spec(path)
    partial = {**cyclic, "edges": [{"source": "a", "target": "b", "factor": {"z": 2}}]}
    path.write_text(yaml.safe_dump(partial))
    with pytest.raises(ConfigError, match=r"factor names variants \['z'\], but a has \['x'\]"):
        load_spec(path)
    with pytest.raises(
        ConfigError,
        match="unknown GPU type 'V100'; valid GPU types are: A100-40GB, A100-80GB, H100-80GB",
    ):
        parse_gpus("4xV100")
    with pytest.raises(ConfigError, match=r"unknown A100-80GB MIG profile '5g\.50gb'; valid"):
        gpu_type(GPU).profile("5g.50gb")


def test_the_accuracy_floor_holds_per_path_by_default_or_over_the_whole_graph() -> None:
    """a feeds b and c. Cheap b2 and c2 are 93 % as accurate: each path (a, b2) and
    (a, c2) keeps 0.93 ≥ 0.9, but over the graph 0.93² = 0.865 < 0.9, so the graph floor
    needs one of b or c at its best."""
    s = spec(
        tasks={
            "a": {"variants": [{"name": "a1", "accuracy": 1}]},
            "b": {"variants": [{"name": "b1", "accuracy": 100}, {"name": "b2", "accuracy": 93}]},
            "c": {"variants": [{"name": "c1", "accuracy": 100}, {"name": "c2", "accuracy": 93}]},
        },
        edges=[
            {"source": "a", "target": "b", "factor": 1},
            {"source": "a", "target": "c", "factor": 1},
        ],
    )
    times = {"a1": 5.0, "b1": 40.0, "b2": 5.0, "c1": 40.0, "c2": 5.0}
    t = ProfileTable([row(v, "1g.10gb", 1, ms) for v, ms in times.items()])
    per_path = plan_pipeline(s, t, {GPU: 56})
    assert {n: p.variant for n, p in per_path.tasks.items()} == {"a": "a1", "b": "b2", "c": "c2"}
    assert per_path.accuracy == pytest.approx(0.93)
    assert per_path.graph_accuracy == pytest.approx(0.93**2)
    graph = plan_pipeline(s, t, {GPU: 56}, options=PlannerOptions(accuracy_scope="graph"))
    assert sorted(p.variant for n, p in graph.tasks.items() if n != "a") in (
        ["b1", "c2"],
        ["b2", "c1"],
    )
    assert graph.graph_accuracy == pytest.approx(0.93) and graph.cost[GPU] > per_path.cost[GPU]
