"""Segments: what one instance of a model runs on, what its label says, and what it costs.

A segment is a MIG profile of a GPU (``1g.10gb``), an MPS share of one (a fraction of a
``1g`` slice's threads, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: ``1g.10gb@1/2``), a whole
GPU with MIG off (``gpu``: every SM, 108 on an A100 where ``7g`` has 98), or cores of
the host's CPU (``cpu2``, in the pool ``cpu``). Three forms of the one concept live
here:

* a label in a pool (``ProfileRow.segment``): ``parse_segment`` reads a GPU one into a
  ``SegmentType``, ``segment_cost`` says what it costs, ``plan_segment`` turns it into
  the plan's form;
* ``SegmentType``, a GPU segment the planner can choose (``segment_types`` lists them):
  its compute slices, SMs and memory bandwidth;
* ``CpuSegment | MigSegment | MpsSegment | GpuSegment`` (``Segment``), the validated form
  a ``Plan`` binds each instance to.

The planner counts cost in compute slices of a GPU (an MPS share of 1/k costs 1/k of a
slice) or in cores of the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ridgeline._fields import Count
from ridgeline._registry import Registry
from ridgeline.errors import PlanError
from ridgeline.pipeline.gpu import MEMORY_SLICES, NO_MIG, gpu_type

CPU = "cpu"
"""The pool of a host's CPU cores; its segment labels are ``cpuN`` (N cores)."""


def cpu_label(cores: int) -> str:
    """The label of a CPU segment of ``cores`` cores: ``cpu2``."""
    return f"{CPU}{cores}"


@dataclass(frozen=True, slots=True)
class SegmentType:
    """What one instance runs on: a MIG profile, or an MPS share of one."""

    gpu: str
    profile: str
    share: Fraction = Fraction(1)
    """1 for the whole MIG instance; 1/k for one of k MPS clients sharing it."""

    @property
    def label(self) -> str:
        return self.profile if self.share == 1 else f"{self.profile}@{self.share}"

    def slices(self) -> Fraction:
        """Compute slices it costs."""
        return gpu_type(self.gpu).profile(self.profile).compute * self.share

    def sms(self) -> float:
        return gpu_type(self.gpu).profile(self.profile).sms * float(self.share)

    def bandwidth_gbps(self) -> float:
        g = gpu_type(self.gpu)
        p = g.profile(self.profile)
        return g.bandwidth_gbps * p.memory_slices / MEMORY_SLICES * float(self.share)


MPS_SHARES: tuple[Fraction, ...] = (Fraction(1, 2), Fraction(1, 3))
"""MPS shares of a ``1g`` slice the planner may use."""


def segment_types(
    gpu: str, *, spatial: bool = True, mps: Sequence[Fraction] = MPS_SHARES
) -> list[SegmentType]:
    """The segment types of ``gpu``: the whole GPU with MIG off (``gpu``); with spatial
    partitioning also every MIG profile and MPS shares of the smallest."""
    g = gpu_type(gpu)
    if not spatial:
        return [SegmentType(gpu, NO_MIG)]
    out = [SegmentType(gpu, NO_MIG), *(SegmentType(gpu, p.name) for p in g.profiles)]
    smallest = min(g.profiles, key=lambda p: (p.compute, p.memory_slices))
    out += [SegmentType(gpu, smallest.name, s) for s in mps]
    return out


def segment_cost(pool: str, label: str) -> Fraction:
    """What one instance on segment ``label`` of ``pool`` uses: compute slices of a GPU,
    or cores of the CPU."""
    if pool == CPU:
        return Fraction(_cores(label))
    return parse_segment(pool, label).slices()


def parse_segment(pool: str, label: str) -> SegmentType:
    """The GPU segment type a label names (``1g.10gb`` or ``1g.10gb@1/2``)."""
    profile, _, share = label.partition("@")
    gpu_type(pool).profile(profile)  # an unknown profile lists the valid ones
    return SegmentType(pool, profile, _share(label, share) if share else Fraction(1))


def _share(label: str, text: str) -> Fraction:
    """The MPS share after ``@`` in ``label``: a fraction in (0, 1] (``1/2``, ``0.25``);
    a ``PlanError`` naming the label for anything else (``nan``, ``1/0``, ``2``)."""
    try:
        share = Fraction(text)
    except (ValueError, ZeroDivisionError):
        share = None
    if share is None or not 0 < share <= 1:
        raise PlanError(
            f"segment {label!r}: the MPS share after '@' must be a fraction in (0, 1], such "
            f"as 1/2 or 0.25, got {text!r}"
        )
    return share


def _cores(label: str) -> int:
    if not label.startswith(CPU) or not label[3:].isdigit() or int(label[3:]) < 1:
        raise PlanError(f"CPU segment {label!r}: write cpuN, N cores (e.g. cpu1)")
    return int(label[3:])


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CpuSegment(_Frozen):
    """A share of the host's CPU: ``cores`` cores per instance, ``threads`` intra-op
    threads (default: one per core)."""

    kind: Literal["cpu"] = "cpu"
    cores: Count = Field(1, le=1024, description="cores per instance")
    threads: Count | None = Field(None, le=1024, description="intra-op threads")

    @property
    def label(self) -> str:
        return cpu_label(self.cores)


class MigSegment(_Frozen):
    """A MIG GPU instance of ``profile`` (e.g. ``1g.10gb``) on a ``gpu`` type."""

    kind: Literal["mig"] = "mig"
    gpu: str = Field(description="GPU type, e.g. A100-80GB")
    profile: str = Field(description="MIG profile, e.g. 1g.10gb")

    @property
    def label(self) -> str:
        return self.profile


class MpsSegment(_Frozen):
    """An MPS share (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) of a MIG slice."""

    kind: Literal["mps"] = "mps"
    gpu: str = Field(description="GPU type, e.g. A100-80GB")
    profile: str = Field(description="the MIG profile the share is taken from")
    share: float = Field(gt=0, le=1, description="fraction of the slice, e.g. 0.5")

    @property
    def label(self) -> str:
        return f"{self.profile}@{self.share:g}"


class GpuSegment(_Frozen):
    """A whole GPU of a ``gpu`` type with MIG off: one instance has it to itself."""

    kind: Literal["gpu"] = "gpu"
    gpu: str = Field(description="GPU type, e.g. A100-80GB")

    @property
    def label(self) -> str:
        return NO_MIG

    @property
    def profile(self) -> str:
        return NO_MIG


Segment = Annotated[CpuSegment | MigSegment | MpsSegment | GpuSegment, Field(discriminator="kind")]
"""Any segment of a plan; its ``kind`` field selects the class. The one declaration of the
segment kinds: ``SEGMENT_KINDS`` is read from it."""

SEGMENT_KINDS: Registry[type[BaseModel]] = Registry.of_union("segment kind", Segment)
"""Each plan segment class by its kind, from the union above."""


def plan_segment(pool: str, label: str) -> CpuSegment | MigSegment | MpsSegment | GpuSegment:
    """The plan's segment for label ``label`` of ``pool`` (a profile row's segment)."""
    if pool == CPU:
        return CpuSegment(cores=_cores(label))
    seg = parse_segment(pool, label)
    if seg.profile == NO_MIG:
        return GpuSegment(gpu=pool)
    if seg.share == 1:
        return MigSegment(gpu=pool, profile=seg.profile)
    return MpsSegment(gpu=pool, profile=seg.profile, share=float(seg.share))
