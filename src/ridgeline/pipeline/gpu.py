"""GPU geometry: MIG profiles and where they may sit on a GPU.

A MIG-capable GPU has 7 compute slices and 8 memory slices. A profile (``3g.40gb``)
takes some of each; it may start only at certain memory slices, as NVIDIA's
``nvidia-smi mig -lgipp`` prints them (``{0,4}:4``: start at slice 0 or 4, span 4). A
set of instances fits a GPU when their memory spans do not overlap and their compute
slices add up to 7 or fewer (``fits``). The tables below follow NVIDIA's MIG user guide,
"Supported MIG Profiles" (A100-SXM4-40GB, A100-SXM4-80GB, H100-SXM5-80GB, H200-SXM5-141GB),
with SM counts from ``nvidia-smi mig -lgip`` (H200 has H100's, on the same 132-SM die) and
memory bandwidth a fraction of the GPU's by memory slices. The ``+me`` (media extension)
profiles are left out: they take the same slices as their plain ones.

``layouts`` lists, per GPU type, every set of instances one GPU can hold that no further
instance can join (NVIDIA's "valid combinations", with one placement of each): the
planner chooses among them, so every plan it returns can be laid out.

What an instance runs on (a MIG profile, an MPS share of one, CPU cores) is a segment:
``pipeline.segments``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

from ridgeline.errors import ConfigError, UnknownKindError

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
NO_MIG = "gpu"
"""The segment label of a whole GPU with MIG off (``GpuType.no_mig``)."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG GPU-instance profile on one GPU type."""

    name: str
    """As nvidia-smi names it, e.g. ``3g.40gb``."""
    compute: int
    """Compute slices (of 7)."""
    memory_slices: int
    """Memory slices (of 8) its placement spans."""
    memory_gb: float
    sms: int
    starts: tuple[int, ...]
    """Memory slices where it may start (``nvidia-smi mig -lgipp``)."""
    profile_id: int
    """The GPU-instance profile ID ``nvidia-smi mig -cgi`` takes."""


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_gb: float
    sms: int
    """SMs of the whole GPU without MIG."""
    fp16_tflops: float
    """Dense FP16 tensor throughput of the whole GPU (the roofline's compute roof)."""
    bandwidth_gbps: float
    """Memory bandwidth of the whole GPU, GB/s (the roofline's memory roof)."""
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile:
        """The MIG profile ``name``, or (``NO_MIG``, ``gpu``) the whole GPU without MIG."""
        if name == NO_MIG:
            return self.no_mig
        for p in self.profiles:
            if p.name == name:
                return p
        raise UnknownKindError(
            f"{self.name} MIG profile", name, [*(p.name for p in self.profiles), NO_MIG]
        )

    @property
    def no_mig(self) -> MigProfile:
        """The whole GPU with MIG off, as a profile: all 7 compute and 8 memory slices and
        every SM (108 on an A100, where the MIG ``7g`` profile has 98). A GPU runs MIG or
        not, so such an instance has a GPU to itself; it is no MIG instance (id −1)."""
        return MigProfile(NO_MIG, COMPUTE_SLICES, MEMORY_SLICES, self.memory_gb, self.sms, (0,), -1)

    @property
    def whole(self) -> MigProfile:
        """The profile that is the whole GPU (7 compute slices)."""
        return max(self.profiles, key=lambda p: (p.compute, p.memory_slices))


_GEOMETRY = (
    (1, 1, (0, 1, 2, 3, 4, 5, 6), 19),
    (1, 2, (0, 2, 4, 6), 15),
    (2, 2, (0, 2, 4), 14),
    (3, 4, (0, 4), 9),
    (4, 4, (0,), 5),
    (7, 8, (0,), 0),
)
"""Every MIG profile's compute slices, memory slices, starts and profile ID: the same on
each GPU type; what differs is the memory in its name and its SMs."""


def _profiles(gb: tuple[int, int, int, int], sms: tuple[int, ...]) -> tuple[MigProfile, ...]:
    """A GPU type's profiles over ``_GEOMETRY``. ``gb``: the memory in the names of the 1-,
    2-, 4- and 8-memory-slice profiles; ``sms``: each profile's SMs, in the table's order."""
    named = dict(zip((1, 2, 4, 8), gb, strict=True))
    return tuple(
        MigProfile(f"{c}g.{named[m]}gb", c, m, named[m], s, starts, pid)
        for (c, m, starts, pid), s in zip(_GEOMETRY, sms, strict=True)
    )


def _a100(memory_gb: int, bandwidth: float) -> GpuType:
    m = memory_gb // 8  # memory per memory slice, as the profile names round it
    profiles = _profiles((m, 2 * m, 4 * m, 8 * m), (14, 14, 28, 42, 56, 98))
    return GpuType(f"A100-{memory_gb}GB", memory_gb, 108, 312.0, bandwidth, profiles)


def _hopper(name: str, memory_gb: int, bandwidth: float, gb: tuple[int, int, int, int]) -> GpuType:
    """H100 and H200: one die (132 SMs, 989 dense FP16 TFLOPS), different memory. ``gb``:
    the memory in the names of the 1-, 2-, 4- and 8-memory-slice profiles."""
    return GpuType(name, memory_gb, 132, 989.0, bandwidth, _profiles(gb, (16, 26, 32, 60, 64, 132)))


GPU_TYPES: Mapping[str, GpuType] = MappingProxyType(
    {
        g.name: g
        for g in (
            _a100(40, 1555.0),
            _a100(80, 2039.0),
            _hopper("H100-80GB", 80, 3350.0, (10, 20, 40, 80)),
            _hopper("H200-141GB", 141, 4800.0, (18, 35, 71, 141)),
        )
    }
)
"""Every GPU type the planner knows, by name."""


def gpu_type(name: str) -> GpuType:
    """The GPU type called ``name``; an unknown one lists the known."""
    found = GPU_TYPES.get(name)
    if found is None:
        raise UnknownKindError("GPU type", name, GPU_TYPES)
    return found


@dataclass(frozen=True, slots=True)
class Placed:
    """A MIG instance at a start memory slice of one GPU."""

    profile: MigProfile
    start: int

    @property
    def span(self) -> range:
        return range(self.start, self.start + self.profile.memory_slices)


def fits(placed: Iterable[Placed]) -> str | None:
    """None when these instances can share one GPU; else why not: a start that the
    profile does not allow, memory spans that overlap, or more than 7 compute slices."""
    used: dict[int, str] = {}
    compute = 0
    for p in placed:
        if p.start not in p.profile.starts:
            return (
                f"{p.profile.name} cannot start at memory slice {p.start} (valid starts: "
                f"{', '.join(map(str, p.profile.starts))})"
            )
        for s in p.span:
            if s in used:
                return f"{p.profile.name} at {p.start} overlaps {used[s]} at memory slice {s}"
            used[s] = f"{p.profile.name}@{p.start}"
        compute += p.profile.compute
    if compute > COMPUTE_SLICES:
        return f"{compute} compute slices, over the {COMPUTE_SLICES} a GPU has"
    return None


_COUNT = re.compile(r"[0-9]{1,6}")
"""A count as written on the command line: ASCII digits (``'²'.isdigit()`` is true, and
``int('²')`` fails), and not so many that ``int`` refuses them."""


def parse_gpus(text: str) -> dict[str, int]:
    """``8xA100-80GB`` or ``2xA100-80GB,4xH100-80GB`` → {type: count}."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        count, sep, name = part.partition("x")
        if not sep or not _COUNT.fullmatch(count) or int(count) < 1:
            raise ConfigError(
                f"GPUs {part!r}: write COUNTxTYPE, e.g. 8xA100-80GB (types: {', '.join(GPU_TYPES)})"
            )
        gpu_type(name)
        out[name] = out.get(name, 0) + int(count)
    return out


def compute_slices(gpus: str) -> dict[str, float]:
    """``8xA100-80GB`` → {A100-80GB: 56.0}: the compute slices a GPU set holds, per type
    (what the planner spends)."""
    return {name: float(COMPUTE_SLICES * n) for name, n in parse_gpus(gpus).items()}


@dataclass(frozen=True, slots=True)
class Layout:
    """A set of MIG instances one GPU can hold, with one valid placement of them."""

    placed: tuple[Placed, ...]

    @property
    def counts(self) -> dict[str, int]:
        """Instances per profile name."""
        out: dict[str, int] = {}
        for p in self.placed:
            out[p.profile.name] = out.get(p.profile.name, 0) + 1
        return out

    @property
    def label(self) -> str:
        return " + ".join(f"{n}×{name}" for name, n in self.counts.items())


def layouts(gpu: str) -> tuple[Layout, ...]:
    """Every maximal layout of ``gpu``: each set of instances (by profile counts) one GPU
    can hold that no other instance can join, with one placement of it. Any smaller set
    that fits is a subset of one of these, so "the instances of each profile are at most
    what the chosen layouts hold" is exactly "they can be laid out"."""
    return _layouts(gpu_type(gpu).name)


@cache
def _layouts(name: str) -> tuple[Layout, ...]:
    g = gpu_type(name)
    options = [Placed(p, s) for p in g.profiles for s in p.starts]
    found: dict[tuple[int, ...], tuple[Placed, ...]] = {}

    def grow(placed: tuple[Placed, ...], after: int) -> None:
        key = tuple(sum(q.profile is p for q in placed) for p in g.profiles)
        found.setdefault(key, placed)
        for i in range(after, len(options)):
            if fits([*placed, options[i]]) is None:
                grow((*placed, options[i]), i + 1)

    grow((), 0)
    maximal = [
        k
        for k in found
        if not any(o != k and all(a >= b for a, b in zip(o, k, strict=True)) for o in found)
    ]
    return tuple(Layout(found[k]) for k in sorted(maximal, reverse=True))
