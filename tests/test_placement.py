"""Placement: NVIDIA's documented MIG layouts, a worked example pinned slot by slot, the
packer's laws on random plans (each GPU checked against the profile table directly as
well as by ``gpu.fits``), its errors, and the mig-parted config it writes."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ridgeline.errors import InfeasiblePlan, PlanError
from ridgeline.pipeline.gpu import Placed, fits, gpu_type
from ridgeline.pipeline.placement import Placement, Slot, min_gpus, place
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.planned import max_demand, to_plan
from ridgeline.pipeline.planner import Features, PlanResult, plan_pipeline
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
from ridgeline.pipeline.segments import GpuSegment, MigSegment, MpsSegment, segment_types
from ridgeline.pipeline.spec import PipelineSpec

A100 = "A100-80GB"
H100 = "H100-80GB"


def plan(**tasks: dict[str, Any]) -> Plan:
    """A plan of independent tasks (no edges), each with a synthetic model."""
    return Plan.model_validate(
        {
            "name": "p",
            "slo_ms": 100,
            "tasks": {
                name: {
                    "variant": "v",
                    "synthetic": {"base_ms": 1, "per_item_ms": 1},
                    "batch_size": 1,
                    "latency_budget_ms": 1,
                    **task,
                }
                for name, task in tasks.items()
            },
        }
    )


def mig(profile: str, instances: int, gpu: str = A100) -> dict[str, Any]:
    return {"segment": {"kind": "mig", "gpu": gpu, "profile": profile}, "instances": instances}


def mps(profile: str, share: float, instances: int, gpu: str = A100) -> dict[str, Any]:
    segment = {"kind": "mps", "gpu": gpu, "profile": profile, "share": share}
    return {"segment": segment, "instances": instances}


def at(profile: str, start: int, gpu: str = A100) -> Placed:
    return Placed(gpu_type(gpu).profile(profile), start)


# ---- the independent checks: from the profile table, not from placement's code -------


def assert_valid_gpu(slots: list[Slot]) -> None:
    """One GPU's slots: one type, starts the table allows, disjoint memory spans inside
    the 8 slices, at most 7 compute slices, MPS shares within each slice."""
    (gpu,) = {s.gpu for s in slots}
    if any(s.profile == "gpu" for s in slots):  # MIG off: the GPU holds one instance
        assert len(slots) == 1 and len(slots[0].instances) == 1, slots
        return
    table = {p.name: p for p in gpu_type(gpu).profiles}
    used: set[int] = set()
    compute = 0
    for s in slots:
        p = table[s.profile]
        assert s.start in p.starts, f"{s.profile} at {s.start}"
        span = set(range(s.start, s.start + p.memory_slices))
        assert span <= set(range(8)), f"{s.profile} at {s.start} runs off the GPU"
        assert not span & used, f"{s.profile} at {s.start} overlaps"
        used |= span
        compute += p.compute
        assert sum(i.share for i in s.instances) <= 1 + 1e-9
    assert compute <= 7
    assert fits(Placed(table[s.profile], s.start) for s in slots) is None


def by_gpu(placement: Placement) -> dict[int, list[Slot]]:
    out: dict[int, list[Slot]] = defaultdict(list)
    for s in placement.slots:
        out[s.gpu_index].append(s)
    return out


def assert_each_instance_once(p: Plan, placement: Placement) -> None:
    """Every GPU instance of the plan is in exactly one slot, of its own segment."""
    seen = Counter((i.task, i.index) for s in placement.slots for i in s.instances)
    gpu_tasks = {t: tp for t, tp in p.tasks.items() if tp.segment.kind != "cpu"}
    assert seen == Counter((t, i) for t, tp in gpu_tasks.items() for i in range(tp.instances))
    for s in placement.slots:
        for i in s.instances:
            seg = gpu_tasks[i.task].segment
            assert isinstance(seg, MigSegment | MpsSegment | GpuSegment)
            assert (s.gpu, s.profile) == (seg.gpu, seg.profile)
            assert i.share == (seg.share if isinstance(seg, MpsSegment) else 1.0)


# ---- NVIDIA's documented layouts ------------------------------------------------------


@pytest.mark.parametrize(
    "layout",
    [
        [("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)],
        [("3g.40gb", 0), ("3g.40gb", 4)],
        [("1g.10gb", s) for s in range(7)],
        [("3g.40gb", 4), ("2g.20gb", 2), ("1g.10gb", 1), ("1g.10gb", 0)],
        [("7g.80gb", 0)],
    ],
)
def test_layouts_nvidia_documents_for_the_a100_fit(layout: list[tuple[str, int]]) -> None:
    assert fits(at(name, start) for name, start in layout) is None


@pytest.mark.parametrize(
    ("layout", "reason"),
    [
        ([("1g.10gb", 7)], "1g.10gb cannot start at memory slice 7"),
        ([("2g.20gb", 1)], "2g.20gb cannot start at memory slice 1"),
        ([("3g.40gb", 0), ("2g.20gb", 2)], "2g.20gb at 2 overlaps 3g.40gb@0"),
        ([("4g.40gb", 0), ("4g.40gb", 0)], "4g.40gb at 0 overlaps 4g.40gb@0"),
    ],
)
def test_invalid_layouts_are_refused_with_a_reason(
    layout: list[tuple[str, int]], reason: str
) -> None:
    why = fits(at(name, start) for name, start in layout)
    assert why is not None and reason in why


@pytest.mark.parametrize(
    ("profiles", "gpus"),
    [
        (["4g.40gb", "2g.20gb", "1g.10gb"], 1),
        (["3g.40gb", "3g.40gb"], 1),
        (["1g.10gb"] * 7, 1),
        (["1g.20gb"] * 4, 1),
        # fits only if filled from the top: 3g@4, 2g@2, 1g@1, 1g@0
        (["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], 1),
        (["4g.40gb", "4g.40gb"], 2),
        (["7g.80gb", "1g.10gb"], 2),
    ],
)
def test_the_packer_puts_a_documented_layout_on_one_gpu_and_no_more(
    profiles: list[str], gpus: int
) -> None:
    p = plan(**{f"t{k}": mig(name, 1) for k, name in enumerate(profiles)})
    placement = place(p, {A100: 8})
    assert placement.gpus == {A100: gpus}
    for slots in by_gpu(placement).values():
        assert_valid_gpu(slots)
    assert_each_instance_once(p, placement)


# ---- a worked example ------------------------------------------------------------------


def example() -> Plan:
    return plan(
        detect=mig("3g.40gb", 3),
        classify=mig("1g.10gb", 4),
        face=mps("1g.10gb", 1 / 3, 3),
        ocr={"segment": {"kind": "cpu", "cores": 2}, "instances": 2},
    )


def test_a_worked_example_is_valid_complete_and_as_tight_as_the_bound() -> None:
    p = example()
    placement = place(p, {A100: 8})
    for slots in by_gpu(placement).values():
        assert_valid_gpu(slots)
    assert_each_instance_once(p, placement)
    # 14 compute slices would fit 2 GPUs, but 3 × 4 + 4 + 1 = 17 memory slices need 3
    assert placement.gpus == {A100: 3}
    assert min_gpus(p) == {A100: 3}
    (face,) = [s for s in placement.slots if s.instances[0].task == "face"]
    assert [(i.task, i.index) for i in face.instances] == [("face", 0), ("face", 1), ("face", 2)]


def test_the_device_map_says_where_each_instance_of_each_task_runs() -> None:
    assert place(example(), {A100: 8}).device_map() == {
        "detect": [(0, "3g.40gb", 4), (1, "3g.40gb", 4), (2, "3g.40gb", 4)],
        "classify": [(0, "1g.10gb", 3), (0, "1g.10gb", 2), (0, "1g.10gb", 1), (0, "1g.10gb", 0)],
        "face": [(1, "1g.10gb", 3)] * 3,
    }


def test_mps_shares_of_different_sizes_share_a_slice_while_they_sum_to_one() -> None:
    placement = place(plan(a=mps("1g.10gb", 0.5, 1), b=mps("1g.10gb", 1 / 3, 1)), {A100: 1})
    (slot,) = placement.slots
    assert sorted((i.task, i.share) for i in slot.instances) == [("a", 0.5), ("b", 1 / 3)]
    halves = place(plan(a=mps("1g.10gb", 0.5, 3)), {A100: 1})
    assert sorted(len(s.instances) for s in halves.slots) == [1, 2]


def test_gpu_indices_run_over_the_gpus_given_type_after_type() -> None:
    placement = place(plan(a=mig("7g.80gb", 1, H100), b=mig("7g.80gb", 2)), {A100: 4, H100: 2})
    assert placement.gpus == {A100: 2, H100: 1}
    assert [(s.gpu_index, s.gpu) for s in placement.slots] == [(0, A100), (1, A100), (4, H100)]


def test_a_plan_without_gpu_tasks_places_nothing() -> None:
    placement = place(plan(ocr={"instances": 3}), {})
    assert (placement.gpus, placement.slots, placement.device_map()) == ({}, (), {})


# ---- the packer's laws on random plans -------------------------------------------------


@st.composite
def gpu_plans(draw: st.DrawFn) -> Plan:
    tasks: dict[str, dict[str, Any]] = {}
    for k in range(draw(st.integers(1, 4))):
        gpu = draw(st.sampled_from([A100, H100]))
        profile = draw(st.sampled_from([p.name for p in gpu_type(gpu).profiles]))
        n = draw(st.integers(1, 6))
        if draw(st.integers(0, 2)) == 0:
            tasks[f"t{k}"] = mps(profile, draw(st.sampled_from([0.5, 1 / 3])), n, gpu)
        else:
            tasks[f"t{k}"] = mig(profile, n, gpu)
    return plan(**tasks)


@settings(max_examples=100, deadline=None)
@given(gpu_plans())
def test_every_placement_is_valid_complete_and_no_smaller_than_the_bound(p: Plan) -> None:
    placement = place(p, {A100: 32, H100: 32})
    gpus = by_gpu(placement)
    for slots in gpus.values():
        assert_valid_gpu(slots)
    assert_each_instance_once(p, placement)
    used = Counter(slots[0].gpu for slots in gpus.values())
    assert placement.gpus == dict(used)
    bound = min_gpus(p)
    assert all(used[gpu] >= n for gpu, n in bound.items())
    assert all(i < 32 for i in gpus if gpus[i][0].gpu == A100)


# ---- errors ----------------------------------------------------------------------------


def test_too_few_gpus_name_the_type_the_counts_and_the_instance_left_over() -> None:
    with pytest.raises(PlanError) as e:
        place(plan(detect=mig("3g.40gb", 3)), {A100: 1})
    assert str(e.value) == (
        "cannot place plan 'p' on A100-80GB: its MIG instances (3 × 3g.40gb) need at least "
        "2 A100-80GB GPUs in any layout NVIDIA allows, and 1 was given. Give at least 2 "
        "A100-80GB GPUs, or plan fewer or smaller instances"
    )


def test_a_type_not_given_at_all_counts_as_none() -> None:
    with pytest.raises(PlanError, match=r"at least 1 H100-80GB GPU in any .* and 0 were given"):
        place(plan(a=mig("1g.10gb", 1, H100)), {A100: 8})


def test_the_packer_finds_layouts_first_fit_decreasing_misses() -> None:
    # 3g+2g+2g fits one A100 twice over; first-fit decreasing paired the 3g's first and
    # needed a third GPU for the fourth 2g
    p = plan(big=mig("3g.40gb", 2), small=mig("2g.20gb", 4))
    assert min_gpus(p) == {A100: 2}
    placement = place(p, {A100: 2})
    assert placement.gpus == {A100: 2}
    for slots in by_gpu(placement).values():
        assert_valid_gpu(slots)
    assert_each_instance_once(p, placement)


def test_a_negative_gpu_count_is_refused() -> None:
    with pytest.raises(PlanError, match="give 0 or more"):
        place(plan(a=mig("1g.10gb", 1)), {A100: -1})


# ---- mig-parted ------------------------------------------------------------------------


def test_the_mig_parted_config_has_the_slots_counts_per_device() -> None:
    placement = place(example(), {A100: 8})
    doc = yaml.safe_load(placement.mig_parted())
    assert doc["version"] == "v1"
    entries = doc["mig-configs"]["ridgeline"]
    assert all(e["mig-enabled"] is True for e in entries)
    counts = {d: e["mig-devices"] for e in entries for d in e["devices"]}
    from_slots: dict[int, Counter[str]] = defaultdict(Counter)
    for s in placement.slots:
        from_slots[s.gpu_index][s.profile] += 1
    assert counts == {i: dict(c) for i, c in from_slots.items()}
    assert counts == {
        0: {"3g.40gb": 1, "1g.10gb": 4},
        1: {"3g.40gb": 1, "1g.10gb": 1},
        2: {"3g.40gb": 1},
    }


def test_gpus_with_the_same_layout_share_one_mig_parted_entry() -> None:
    doc = yaml.safe_load(place(plan(a=mig("3g.40gb", 4)), {A100: 8}).mig_parted("x"))
    assert doc["mig-configs"]["x"] == [
        {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}
    ]


# ---- every plan the planner returns places ---------------------------------------------

H200 = "H200-141GB"
SETTINGS = ["A,S,T", "A,S", "A,T", "S,T", "A", "S", "T", "none"]


@st.composite
def planned(draw: st.DrawFn) -> tuple[PipelineSpec, ProfileTable, dict[str, int]]:
    """A random pipeline (a chain or a fan-out of 1–3 tasks), profile rows on a random
    mix of GPU types (every profile, MPS shares of the smallest, batches 1–8) and a
    random count of each."""
    pools = draw(
        st.lists(
            st.sampled_from([A100, H100, H200, "A100-40GB"]), min_size=1, max_size=3, unique=True
        )
    )
    gpus = {g: draw(st.integers(1, 6)) for g in pools}
    rows, tasks = [], {}
    names = [f"t{i}" for i in range(draw(st.integers(1, 3)))]
    for t in names:
        variants = []
        for j in range(draw(st.integers(1, 2))):
            v = f"{t}v{j}"
            variants.append({"name": v, "accuracy": draw(st.floats(0.6, 1.0))})
            work = draw(st.floats(0.5, 20.0))  # ms per item on the whole GPU
            for g in pools:
                for seg in segment_types(g):
                    speed = seg.sms() / gpu_type(g).sms
                    for b in (1, 4, 8):
                        ms = (1.0 + work * b**0.8) / speed
                        rows.append(ProfileRow(v, g, seg.label, b, ms, b / ms * 1000.0))
        tasks[t] = {"variants": variants}
    fan = draw(st.booleans())
    edges = [
        {
            "source": names[0] if fan else names[i - 1],
            "target": names[i],
            "factor": draw(st.floats(0.5, 2.0)),
        }
        for i in range(1, len(names))
    ]
    spec = PipelineSpec.model_validate(
        {
            "name": "r",
            "slo_ms": draw(st.floats(40, 400)),
            "accuracy_floor": draw(st.floats(0.5, 1.0)),
            "demand_rps": draw(st.floats(5, 3000)),
            "tasks": tasks,
            "edges": edges,
        }
    )
    return spec, ProfileTable(rows), gpus


def assert_places(result: PlanResult, gpus: dict[str, int]) -> None:
    p = to_plan(result)
    placement = place(p, gpus)
    for slots in by_gpu(placement).values():
        assert_valid_gpu(slots)
    assert_each_instance_once(p, placement)
    assert all(placement.gpus[g] <= n for g, n in gpus.items() if g in placement.gpus)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planned())
def test_every_plan_and_every_ablation_setting_places_on_the_gpus_given(
    case: tuple[PipelineSpec, ProfileTable, dict[str, int]],
) -> None:
    spec, table, gpus = case
    available = {g: 7.0 * n for g, n in gpus.items()}
    for setting in SETTINGS:
        try:
            result = plan_pipeline(spec, table, available, Features.parse(setting))
        except InfeasiblePlan:
            continue
        assert_places(result, gpus)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planned(), st.sampled_from(SETTINGS))
def test_the_max_demand_plan_places_on_the_gpus_given(
    case: tuple[PipelineSpec, ProfileTable, dict[str, int]], setting: str
) -> None:
    spec, table, gpus = case
    available = {g: 7.0 * n for g, n in gpus.items()}
    top, result = max_demand(
        spec, lambda s: plan_pipeline(s, table, available, Features.parse(setting)), 0.05
    )
    if result is None:
        return
    assert top > 0
    assert_places(result, gpus)


def test_a_gpu_with_mig_off_holds_one_instance_and_mig_parted_turns_mig_off() -> None:
    p = plan(a={"segment": {"kind": "gpu", "gpu": A100}, "instances": 2}, b=mig("3g.40gb", 1))
    placement = place(p, {A100: 3})
    assert placement.gpus == {A100: 3}
    assert placement.device_map() == {"b": [(0, "3g.40gb", 4)], "a": [(1, "gpu", 0), (2, "gpu", 0)]}
    assert min_gpus(p) == {A100: 3}
    doc = yaml.safe_load(placement.mig_parted())
    assert doc["mig-configs"]["ridgeline"] == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 1}},
        {"devices": [1, 2], "mig-enabled": False},
    ]
    with pytest.raises(PlanError, match="need at least 3 A100-80GB GPUs"):
        place(p, {A100: 2})


def test_a_gpu_with_mig_off_has_every_sm_the_7g_profile_has_fewer() -> None:
    g = gpu_type(A100)
    assert (g.profile("gpu").sms, g.profile("7g.80gb").sms) == (108, 98)
    assert (g.profile("gpu").compute, g.profile("gpu").memory_slices) == (7, 8)
