"""Placement: the GPU instances a plan chose, packed onto physical GPUs.

A plan says *what* each task runs on (``3g.40gb``, or an MPS share of ``1g.10gb``) and
how many instances; a real GPU also needs *where*: which GPU, and at which memory slice
each MIG instance starts, so that the set on every GPU is a layout NVIDIA allows
(``gpu.fits``). This module turns a plan into that layout:

1. MPS clients become MIG slices. Clients of one GPU type and profile are packed into
   slices first-fit decreasing by share, so k clients of 1/k fill one slice and shares
   of different sizes (one task's 1/2 with another's 1/3) may share a slice while they
   sum to at most 1. That is what the planner's cost assumes (a share of 1/k costs 1/k
   of a slice), so a plan's slice count stays close to what it pays for.
2. MIG instances (whole ones, and the slices hosting MPS clients) go onto GPUs by an
   exact packing: per GPU type, a small integer program (HiGHS) picks how many GPUs take
   each of the type's maximal layouts (``gpu.layouts``, NVIDIA's valid combinations with
   one placement each) so that every profile's instances find a slot, on the fewest
   GPUs. The instances then take the slots of their profile, GPU by GPU. It is exact:
   if any valid layout of the instances on the GPUs given exists, this finds one, and
   ``min_gpus`` is the true minimum. The planner's MILP lays its instances out over the
   same layouts, so every plan it returns places.

GPU indices run over the GPUs given, type after type in the order of the ``gpus``
mapping (``{"A100-80GB": 8, "H100-80GB": 4}``: A100s are 0–7, H100s 8–11), each type's
used GPUs first. On a node with one GPU type they are the indices ``nvidia-smi`` shows.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import highspy
import numpy as np
import yaml

from ridgeline.errors import PlanError
from ridgeline.pipeline._highs import Row, integer_model
from ridgeline.pipeline.gpu import NO_MIG, Layout, MigProfile, gpu_type, layouts
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.segments import GpuSegment, MigSegment, MpsSegment

_EPS = 1e-9
"""Slack on share sums: three clients of a float 1/3 must fill one slice."""


@dataclass(frozen=True, slots=True)
class InstanceRef:
    """One instance of a task: ``index`` counts from 0 to the task's instances − 1."""

    task: str
    index: int
    share: float
    """1.0 for a whole MIG instance; its share of the slice for an MPS client."""

    @property
    def label(self) -> str:
        return f"{self.task}#{self.index}"


@dataclass(frozen=True, slots=True)
class Slot:
    """One MIG instance on one GPU and the task instances it hosts: one whole one, or
    MPS clients whose shares sum to at most 1."""

    gpu_index: int
    gpu: str
    """The GPU type's name."""
    profile: str
    start: int
    """The memory slice it starts at."""
    instances: tuple[InstanceRef, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where every GPU instance of a plan runs. CPU tasks are not in it."""

    gpus: dict[str, int]
    """GPUs used, per type (types with none used are left out)."""
    slots: tuple[Slot, ...]
    """Ordered by GPU index, then start."""

    def device_map(self) -> dict[str, list[tuple[int, str, int]]]:
        """Per task, per instance index: ``(gpu_index, profile, start)``.

        ``device_map()["detect"][2]`` is where ``detect#2`` runs; the list has one entry
        per instance, so MPS clients sharing a slice show the same triple."""
        where: dict[str, dict[int, tuple[int, str, int]]] = defaultdict(dict)
        for s in self.slots:
            for i in s.instances:
                where[i.task][i.index] = (s.gpu_index, s.profile, s.start)
        return {task: [by_index[i] for i in sorted(by_index)] for task, by_index in where.items()}

    def mig_parted(self, config: str = "ridgeline") -> str:
        """The layout as an NVIDIA mig-parted config (``nvidia-mig-parted apply -f FILE
        -c ridgeline``); GPUs with the same profile counts share one entry, and a GPU
        a plan runs with MIG off has ``mig-enabled: false``.

        mig-parted takes counts per profile, not starts: the starts here are one valid
        layout of those counts, not necessarily the one the driver picks, so look a
        worker's MIG device up by profile (``nvidia-smi -L``) once it is applied."""
        entries: dict[tuple[tuple[str, int], ...], list[int]] = {}
        for index, counts in self._counts().items():
            entries.setdefault(tuple(counts.items()), []).append(index)
        doc = {
            "version": "v1",
            "mig-configs": {
                config: [
                    {"devices": devices, "mig-enabled": False}
                    if NO_MIG in dict(counts)
                    else {"devices": devices, "mig-enabled": True, "mig-devices": dict(counts)}
                    for counts, devices in entries.items()
                ]
            },
        }
        return yaml.safe_dump(doc, sort_keys=False)

    def _counts(self) -> dict[int, dict[str, int]]:
        """Per GPU index, instances per profile, largest profile first."""
        out: dict[int, Counter[str]] = defaultdict(Counter)
        for s in sorted(self.slots, key=_largest_first):
            out[s.gpu_index][s.profile] += 1
        return {i: dict(c) for i, c in sorted(out.items())}


def _largest_first(slot: Slot) -> tuple[int, int, str]:
    p = gpu_type(slot.gpu).profile(slot.profile)
    return (-p.compute, -p.memory_slices, p.name)


@dataclass(frozen=True, slots=True)
class _Unit:
    """One MIG instance to place: a whole task instance, or a slice of MPS clients."""

    gpu: str
    profile: MigProfile
    instances: tuple[InstanceRef, ...]
    mps: bool = False

    @property
    def label(self) -> str:
        names = ", ".join(i.label for i in self.instances)
        if self.mps:
            return f"{names} (MPS clients of one {self.profile.name} slice)"
        return f"{names} ({self.profile.name})"

    def order(self) -> tuple[int, int, str, int]:
        """First-fit-decreasing order: most compute first, then most memory."""
        first = self.instances[0]
        return (-self.profile.compute, -self.profile.memory_slices, first.task, first.index)


def place(plan: Plan, gpus: Mapping[str, int]) -> Placement:
    """Lay the plan's GPU instances out on ``gpus`` (available GPUs per type); see the
    module docstring. Raises PlanError when a type has too few GPUs for any valid
    layout, naming the type, the GPUs given and the fewest that hold the instances."""
    for name, count in gpus.items():
        if count < 0:
            raise PlanError(f"gpus: {name} has count {count}; give 0 or more GPUs")
    by_type: dict[str, list[_Unit]] = defaultdict(list)
    for u in _units(plan):
        by_type[u.gpu].append(u)
    offsets = _offsets(gpus, by_type)
    slots: list[Slot] = []
    used: dict[str, int] = {}
    for gpu, units in by_type.items():
        whole = [u for u in units if u.profile.name == NO_MIG]
        units = [u for u in units if u.profile.name != NO_MIG]
        chosen = _fewest_layouts(gpu, Counter(u.profile.name for u in units))
        given = gpus.get(gpu, 0)
        if len(chosen) + len(whole) > given:
            raise PlanError(_no_room(plan, gpu, given, len(chosen) + len(whole)))
        used[gpu] = len(chosen) + len(whole)
        for g, u in enumerate(sorted(whole, key=_Unit.order), start=len(chosen)):
            slots.append(Slot(offsets[gpu] + g, gpu, NO_MIG, 0, u.instances))
        waiting: dict[str, list[_Unit]] = defaultdict(list)
        for u in sorted(units, key=_Unit.order, reverse=True):
            waiting[u.profile.name].append(u)
        for g, layout in enumerate(chosen):
            for placed in sorted(layout.placed, key=lambda q: (-q.profile.compute, -q.start)):
                if waiting[placed.profile.name]:
                    u = waiting[placed.profile.name].pop()
                    slots.append(
                        Slot(offsets[gpu] + g, gpu, u.profile.name, placed.start, u.instances)
                    )
    return Placement(used, tuple(sorted(slots, key=lambda s: (s.gpu_index, s.start))))


def min_gpus(plan: Plan) -> dict[str, int]:
    """The fewest GPUs of each type that hold the plan's MIG instances in a layout NVIDIA
    allows (exact: ``_fewest_layouts``). Memory binds as often as compute: three
    ``3g.40gb`` and five ``1g.10gb`` take 14 compute slices, two GPUs' worth, but a GPU
    holds two 3g at most, so they need three."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for (gpu, profile), n in _slice_counts(plan).items():
        counts[gpu][profile.name] += n
    return {gpu: c.pop(NO_MIG, 0) + len(_fewest_layouts(gpu, c)) for gpu, c in counts.items()}


def _fewest_layouts(gpu: str, need: Mapping[str, int]) -> list[Layout]:
    """The fewest GPUs' layouts (with repeats, largest first) whose slots hold ``need``
    instances per profile: an integer program over ``gpu.layouts``."""
    options = layouts(gpu)
    bound = float(sum(need.values()))
    rows: list[Row] = [
        (
            float(n),
            math.inf,
            {j: float(c) for j, lay in enumerate(options) if (c := lay.counts.get(p, 0))},
        )
        for p, n in need.items()
        if n > 0
    ]
    if not rows:
        return []
    h = integer_model([bound] * len(options), rows, time_limit_s=10.0, mip_gap=0.0)
    h.changeColsCost(len(options), np.arange(len(options), dtype=np.int32), np.ones(len(options)))
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise PlanError(
            f"laying out {dict(need)} on {gpu}: HiGHS ended with "
            f"{h.modelStatusToString(h.getModelStatus())}"
        )
    taken = [round(v) for v in h.getSolution().col_value]
    return [lay for lay, n in zip(options, taken, strict=True) for _ in range(n)]


def _slice_counts(plan: Plan) -> Counter[tuple[str, MigProfile]]:
    """Fewest MIG instances per (GPU type, profile) the plan's GPU tasks need."""
    whole: Counter[tuple[str, MigProfile]] = Counter()
    shares: defaultdict[tuple[str, MigProfile], float] = defaultdict(float)
    for tp in plan.tasks.values():
        seg = tp.segment
        if isinstance(seg, MigSegment | GpuSegment):
            whole[seg.gpu, gpu_type(seg.gpu).profile(seg.profile)] += tp.instances
        elif isinstance(seg, MpsSegment):
            shares[seg.gpu, gpu_type(seg.gpu).profile(seg.profile)] += seg.share * tp.instances
    for key, total in shares.items():
        whole[key] += math.ceil(total - _EPS)
    return whole


def _units(plan: Plan) -> list[_Unit]:
    """Every MIG instance to place: whole task instances, then MPS clients grouped into
    slices per (GPU type, profile)."""
    units: list[_Unit] = []
    clients: defaultdict[tuple[str, MigProfile], list[InstanceRef]] = defaultdict(list)
    for task, tp in plan.tasks.items():
        seg = tp.segment
        if isinstance(seg, MigSegment | GpuSegment):
            p = gpu_type(seg.gpu).profile(seg.profile)
            units += [_Unit(seg.gpu, p, (InstanceRef(task, i, 1.0),)) for i in range(tp.instances)]
        elif isinstance(seg, MpsSegment):
            p = gpu_type(seg.gpu).profile(seg.profile)
            clients[seg.gpu, p] += [InstanceRef(task, i, seg.share) for i in range(tp.instances)]
    for (gpu, p), refs in clients.items():
        units += [_Unit(gpu, p, group, mps=True) for group in _mps_slices(refs)]
    return units


def _mps_slices(clients: Iterable[InstanceRef]) -> list[tuple[InstanceRef, ...]]:
    """Clients packed first-fit decreasing by share into slices of capacity 1. Equal
    shares are taken task by task, so a task's clients fill consecutive slices and a
    slice mixes tasks only where one's clients leave room."""
    slices: list[list[InstanceRef]] = []
    for c in sorted(clients, key=lambda c: (-c.share, c.task, c.index)):
        home = next((s for s in slices if sum(x.share for x in s) + c.share <= 1 + _EPS), None)
        if home is None:
            slices.append([c])
        else:
            home.append(c)
    return [tuple(s) for s in slices]


def _offsets(gpus: Mapping[str, int], needed: Iterable[str]) -> dict[str, int]:
    """The first GPU index of each type: types in the order given, then any the plan
    needs but ``gpus`` lacks (placing those fails, but the numbering stays defined)."""
    offsets: dict[str, int] = {}
    total = 0
    for name in [*gpus, *(n for n in needed if n not in gpus)]:
        offsets[name] = total
        total += gpus.get(name, 0)
    return offsets


def _no_room(plan: Plan, gpu: str, given: int, fewest: int) -> str:
    """Why the plan's instances of ``gpu`` cannot be laid out on ``given`` GPUs."""
    counts = {p.name: n for (g, p), n in _slice_counts(plan).items() if g == gpu}
    listed = ", ".join(f"{n} × {name}" for name, n in counts.items())
    return (
        f"cannot place plan {plan.name!r} on {gpu}: its MIG instances ({listed}) need at "
        f"least {_gpus(fewest, gpu)} in any layout NVIDIA allows, and {given} "
        f"{'was' if given == 1 else 'were'} given. Give at least {_gpus(fewest, gpu)}, or "
        "plan fewer or smaller instances"
    )


def _gpus(n: int, gpu: str) -> str:
    return f"{n} {gpu} GPU{'' if n == 1 else 's'}"
