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
2. MIG instances (whole ones, and the slices hosting MPS clients) go onto GPUs first-fit
   decreasing by compute slices: each goes on the first GPU where one of its profile's
   starts keeps the GPU's set valid, else on a fresh GPU. Starts are tried from the
   highest down: the top memory slices are reachable only by some profiles (``1g.10gb``
   cannot start at 7, ``4g`` and ``7g`` start only at 0), so filling from the top keeps
   the bottom open; lowest-first would refuse ``3g + 2g + 1g + 1g`` on one A100, a
   layout NVIDIA lists.

First-fit decreasing is a heuristic: it is fast and usually tight, but it can fail, or
use more GPUs, on a set that an exact packer would fit. ``min_gpus`` is a true lower
bound to compare against, and the error when GPUs run out says both.

GPU indices run over the GPUs given, type after type in the order of the ``gpus``
mapping (``{"A100-80GB": 8, "H100-80GB": 4}``: A100s are 0–7, H100s 8–11), each type's
used GPUs first. On a node with one GPU type they are the indices ``nvidia-smi`` shows.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import yaml

from ridgeline.errors import PlanError
from ridgeline.pipeline.gpu import COMPUTE_SLICES, MEMORY_SLICES, MigProfile, Placed, fits, gpu_type
from ridgeline.pipeline.plan import Plan
from ridgeline.pipeline.segments import MigSegment, MpsSegment

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
        -c ridgeline``); GPUs with the same profile counts share one entry.

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
                    {"devices": devices, "mig-enabled": True, "mig-devices": dict(counts)}
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
    """Pack the plan's GPU instances onto ``gpus`` (available GPUs per type); see the
    module docstring. Raises PlanError when the first-fit-decreasing packer runs out of
    GPUs of a type, naming the type, the GPUs given, the lower bound and the instance
    it could not place."""
    for name, count in gpus.items():
        if count < 0:
            raise PlanError(f"gpus: {name} has count {count}; give 0 or more GPUs")
    by_type: dict[str, list[_Unit]] = defaultdict(list)
    for u in _units(plan):
        by_type[u.gpu].append(u)
    bounds = min_gpus(plan)
    offsets = _offsets(gpus, by_type)
    slots: list[Slot] = []
    used: dict[str, int] = {}
    for gpu, units in by_type.items():
        given = gpus.get(gpu, 0)
        layouts, unplaced = _pack(units, given)
        if unplaced is not None:
            raise PlanError(_no_room(plan, gpu, given, bounds[gpu], unplaced))
        used[gpu] = len(layouts)
        for g, layout in enumerate(layouts):
            slots += [
                Slot(offsets[gpu] + g, gpu, u.profile.name, s, u.instances) for u, s in layout
            ]
    return Placement(used, tuple(sorted(slots, key=lambda s: (s.gpu_index, s.start))))


def min_gpus(plan: Plan) -> dict[str, int]:
    """A lower bound on the GPUs each type needs: the compute slices over 7 and the
    memory slices over 8, rounded up, whichever is more. MPS clients count as whole
    slices (a client cannot span two), their shares' sum rounded up per profile. Memory
    binds as often as compute: three ``3g.40gb`` and five ``1g.10gb`` take 14 compute
    slices, two GPUs' worth, but 17 memory slices, which need three."""
    compute: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    for (gpu, profile), count in _slice_counts(plan).items():
        compute[gpu] += profile.compute * count
        memory[gpu] += profile.memory_slices * count
    return {
        gpu: max(math.ceil(compute[gpu] / COMPUTE_SLICES), math.ceil(memory[gpu] / MEMORY_SLICES))
        for gpu in compute
    }


def _slice_counts(plan: Plan) -> Counter[tuple[str, MigProfile]]:
    """Fewest MIG instances per (GPU type, profile) the plan's GPU tasks need."""
    whole: Counter[tuple[str, MigProfile]] = Counter()
    shares: defaultdict[tuple[str, MigProfile], float] = defaultdict(float)
    for tp in plan.tasks.values():
        seg = tp.segment
        if isinstance(seg, MigSegment):
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
        if isinstance(seg, MigSegment):
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


def _pack(units: list[_Unit], given: int) -> tuple[list[list[tuple[_Unit, int]]], _Unit | None]:
    """First-fit decreasing onto at most ``given`` GPUs of one type: per GPU, its units
    and their starts; and the first unit that found no room, or None."""
    layouts: list[list[tuple[_Unit, int]]] = []
    for u in sorted(units, key=_Unit.order):
        for layout in layouts:
            start = _free_start([Placed(v.profile, s) for v, s in layout], u.profile)
            if start is not None:
                layout.append((u, start))
                break
        else:
            if len(layouts) == given:
                return layouts, u
            layouts.append([(u, max(u.profile.starts))])
    return layouts, None


def _free_start(placed: list[Placed], profile: MigProfile) -> int | None:
    """The highest start of ``profile`` that keeps ``placed`` a valid layout, if any."""
    for start in sorted(profile.starts, reverse=True):
        if fits([*placed, Placed(profile, start)]) is None:
            return start
    return None


def _offsets(gpus: Mapping[str, int], needed: Iterable[str]) -> dict[str, int]:
    """The first GPU index of each type: types in the order given, then any the plan
    needs but ``gpus`` lacks (placing those fails, but the numbering stays defined)."""
    offsets: dict[str, int] = {}
    total = 0
    for name in [*gpus, *(n for n in needed if n not in gpus)]:
        offsets[name] = total
        total += gpus.get(name, 0)
    return offsets


def _no_room(plan: Plan, gpu: str, given: int, bound: int, unit: _Unit) -> str:
    """Why ``unit`` found no room: too few GPUs for the plan's slices, or (with enough
    by that bound) the packer's heuristic missing a layout."""
    counts = _slice_counts(plan)
    compute = sum(p.compute * n for (g, p), n in counts.items() if g == gpu)
    memory = sum(p.memory_slices * n for (g, p), n in counts.items() if g == gpu)
    need = (
        f"plan {plan.name!r} needs at least {_gpus(bound, gpu)} ({compute} compute slices "
        f"/ {COMPUTE_SLICES}, {memory} memory slices / {MEMORY_SLICES}, rounded up) and "
        f"{given} {'was' if given == 1 else 'were'} given"
    )
    if bound > given:
        return (
            f"cannot place {unit.label}: {need}; the first-fit-decreasing packer placed "
            f"what fit and ran out here. Give at least {_gpus(bound, gpu)}, or plan fewer or "
            "smaller instances"
        )
    return (
        f"cannot place {unit.label}: {need}, but the first-fit-decreasing packer filled "
        f"them without room for it. The packer is a heuristic and can miss a layout an "
        f"exact packer would find; give {given + 1} or more {gpu} GPUs, or plan fewer or "
        "smaller instances"
    )


def _gpus(n: int, gpu: str) -> str:
    return f"{n} {gpu} GPU{'' if n == 1 else 's'}"
