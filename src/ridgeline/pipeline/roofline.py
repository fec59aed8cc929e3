"""A roofline latency model: profile rows for hardware this host does not have.

One batch of ``b`` items of a variant on a segment takes::

    latency(b) = calibration × (overhead + max(b · FLOPs / (peak · efficiency),
                                               (weights + b · activations) / bandwidth))

``peak`` is the segment's share of the GPU's dense FP16 throughput (its SMs over the
GPU's), ``bandwidth`` its memory bandwidth (``SegmentType.bandwidth_gbps``: memory slices,
then the MPS share). Throughput is ``b / latency``. The constants are ``Roofline``'s
fields, each with its reason.

A variant's FLOPs per item: the spec's ``gflops``; else the published figure of the real
model (``zoo.accuracy.PUBLISHED_GFLOPS``, doubled for the classifier and face families,
whose sources print multiply-adds); else, for a zoo variant with none published (GIT, the
TTS family), the FLOPs the zoo's builder counts at full size (``zoo.paper_flops``); else
a ``PlanError`` asks for ``gflops:`` in the spec. Its bytes: the spec's ``mbytes`` (per
item, split into weights and activations in the ratio of the two ``*_mb_per_gflop``
constants), else both derived from the FLOPs by those constants.

Calibration is an assumption, stated plainly. ``calibrate`` finds the factor that maps
this model to rows measured on the host's CPU (a CPU segment has ``cpu_gflops_per_core``
× cores of peak and ``cpu_bandwidth_gbps_per_core`` × cores of bandwidth), and
``modelled_rows(..., calibration=k)`` applies it to GPU segments: it carries the fraction
of peak the CPU reached over to the GPU, overhead included. Nothing here was measured on
a GPU; measured GPU rows, where there are any, should replace modelled ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from ridgeline.errors import PlanError
from ridgeline.pipeline.gpu import gpu_type
from ridgeline.pipeline.profiles import ProfileRow
from ridgeline.pipeline.segments import CPU, SegmentType, cpu_label, segment_types
from ridgeline.zoo.accuracy import PUBLISHED_GFLOPS


class Costed(Protocol):
    """What the roofline needs of a variant (``spec.VariantSpec`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def gflops(self) -> float | None: ...
    @property
    def mbytes(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Cost:
    """A variant's cost per item, when it is not a spec's variant (a zoo model as built)."""

    name: str
    gflops: float | None
    mbytes: float | None = None


class Roofline(BaseModel):
    """The model's constants. Defaults are round, stated guesses, not fits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    efficiency: float = Field(
        0.4,
        gt=0,
        le=1,
        description="fraction of the compute roof a batch reaches: dense FP16 convolutions "
        "and matmuls of these sizes run at roughly a third to a half of tensor-core peak",
    )
    overhead_ms: float = Field(
        1.0,
        ge=0,
        description="fixed time per batch: kernel launches, host-device copies and the "
        "serving runtime's hand-off to its worker, about a millisecond",
    )
    weight_mb_per_gflop: float = Field(
        1.0,
        ge=0,
        description="FP16 weights per GFLOP of a batch-1 item when mbytes is not given "
        "(YOLOv5: 7.2 M parameters for 16.5 GFLOPs, 0.9 MB/GFLOP)",
    )
    activation_mb_per_gflop: float = Field(
        10.0,
        ge=0,
        description="activation traffic per GFLOP of an item when mbytes is not given: an "
        "arithmetic intensity of 100 FLOP/byte, usual for FP16 convolutions",
    )
    cpu_gflops_per_core: float = Field(
        100.0,
        gt=0,
        description="FP32 peak of one CPU core: two AVX2 FMA units, 2 × 8 × 2 FLOP per "
        "cycle at about 3 GHz (the zoo's models are FP32)",
    )
    cpu_bandwidth_gbps_per_core: float = Field(
        10.0,
        gt=0,
        description="memory bandwidth one CPU core can draw, GB/s",
    )


DEFAULT_ROOFLINE = Roofline()
_MULTIPLY_ADDS = ("classifier", "face")
"""Zoo families whose published figure counts multiply-adds (half the FLOPs)."""


def variant_gflops(v: Costed) -> float:
    """GFLOPs per item of ``v``: its own figure, the published one, the zoo's count."""
    if v.gflops is not None:
        return v.gflops
    from ridgeline.zoo.families import FAMILIES

    family = next((f for f, names in FAMILIES.items() if v.name in names), None)
    if v.name in PUBLISHED_GFLOPS:
        return PUBLISHED_GFLOPS[v.name] * (2.0 if family in _MULTIPLY_ADDS else 1.0)
    if family is not None:
        from ridgeline.zoo.families import paper_flops

        return paper_flops(family, v.name)[0] / 1e9
    raise PlanError(
        f"variant {v.name!r} has no GFLOPs per item for the roofline: it is not a zoo "
        "variant with a published figure; give `gflops:` (FLOPs per item, 2 × multiply-adds, "
        "in billions) in the spec's entry for it"
    )


@dataclass(frozen=True, slots=True)
class Work:
    """One item's work: FLOPs, and bytes moved (the weights once per batch, the
    activations once per item)."""

    gflops: float
    weights_bytes: float
    activation_bytes: float

    @classmethod
    def of(cls, v: Costed, model: Roofline) -> Work:
        """``v``'s FLOPs (``variant_gflops``); its ``mbytes`` split into weights and
        activations in the ratio of the model's two ``*_mb_per_gflop`` constants, or,
        without ``mbytes``, both derived from the FLOPs by those constants."""
        gflops = variant_gflops(v)
        w, a = model.weight_mb_per_gflop, model.activation_mb_per_gflop
        if v.mbytes is None:
            return cls(gflops, w * gflops * 1e6, a * gflops * 1e6)
        share = w / (w + a) if w + a > 0 else 0.0
        return cls(gflops, share * v.mbytes * 1e6, (1 - share) * v.mbytes * 1e6)


@dataclass(frozen=True, slots=True)
class Roof:
    """A segment's two roofs."""

    peak_flops: float
    bandwidth_bps: float

    @classmethod
    def gpu(cls, segment: SegmentType) -> Roof:
        """The segment's share of its GPU's FP16 peak (SMs / the GPU's SMs) and its
        memory bandwidth."""
        g = gpu_type(segment.gpu)
        return cls(g.fp16_tflops * 1e12 * segment.sms() / g.sms, segment.bandwidth_gbps() * 1e9)

    @classmethod
    def cpu(cls, cores: int, model: Roofline) -> Roof:
        return cls(
            cores * model.cpu_gflops_per_core * 1e9, cores * model.cpu_bandwidth_gbps_per_core * 1e9
        )


def latency_ms(work: Work, roof: Roof, batch: int, model: Roofline) -> float:
    """The uncalibrated roofline: overhead plus the slower of compute and memory."""
    compute_s = batch * work.gflops * 1e9 / (roof.peak_flops * model.efficiency)
    memory_s = (work.weights_bytes + batch * work.activation_bytes) / roof.bandwidth_bps
    return model.overhead_ms + 1000.0 * max(compute_s, memory_s)


def modelled_rows(
    variants: Sequence[Costed],
    pool: str,
    batches: Sequence[int],
    calibration: float = 1.0,
    *,
    model: Roofline | None = None,
    spatial: bool = True,
) -> list[ProfileRow]:
    """Modelled rows of every variant on every segment type of GPU type ``pool``
    (``gpu.segment_types``) at every batch size, the latency times ``calibration``."""
    if pool == CPU:
        raise PlanError("modelled_rows models GPU pools; use cpu_modelled_rows for cpu")
    roofs = {s.label: Roof.gpu(s) for s in segment_types(pool, spatial=spatial)}
    return _rows(variants, pool, roofs, batches, calibration, model or DEFAULT_ROOFLINE)


def cpu_modelled_rows(
    variants: Sequence[Costed],
    cores: Sequence[int],
    batches: Sequence[int],
    calibration: float = 1.0,
    *,
    model: Roofline | None = None,
) -> list[ProfileRow]:
    """Modelled rows on ``cpuN`` segments: ``N × cpu_gflops_per_core`` of peak and
    ``N × cpu_bandwidth_gbps_per_core`` of bandwidth; what ``calibrate`` compares the
    measured CPU rows with."""
    m = model or DEFAULT_ROOFLINE
    if any(n < 1 for n in cores):
        raise PlanError(f"cores {list(cores)}: every core count must be ≥ 1")
    roofs = {cpu_label(n): Roof.cpu(n, m) for n in cores}
    return _rows(variants, CPU, roofs, batches, calibration, m)


def _rows(
    variants: Sequence[Costed],
    pool: str,
    roofs: dict[str, Roof],
    batches: Sequence[int],
    calibration: float,
    model: Roofline,
) -> list[ProfileRow]:
    if not batches or any(b < 1 for b in batches):
        raise PlanError(f"batches {list(batches)}: give one or more batch sizes ≥ 1")
    if not calibration > 0:
        raise PlanError(f"calibration {calibration}: it must be > 0 (1 is the bare model)")
    rows = []
    for v in variants:
        work = Work.of(v, model)
        for label, roof in roofs.items():
            for b in batches:
                ms = calibration * latency_ms(work, roof, b, model)
                rows.append(ProfileRow(v.name, pool, label, b, ms, b * 1000.0 / ms, "modelled"))
    return rows


def calibrate(measured: Iterable[ProfileRow], modelled_on_cpu: Iterable[ProfileRow]) -> float:
    """The median of measured / modelled latency over the rows both have (same variant,
    pool, segment and batch; only ``measured`` rows of ``measured`` count): the factor
    that maps the model onto the measurements. Applied to GPU rows it assumes the GPU
    reaches the same fraction of its roofline as the CPU did, an assumption."""
    model = {(r.variant, r.pool, r.segment, r.batch): r for r in modelled_on_cpu}
    ratios = [
        r.latency_ms / model[key].latency_ms
        for r in measured
        if r.source == "measured" and (key := (r.variant, r.pool, r.segment, r.batch)) in model
    ]
    if not ratios:
        raise PlanError(
            "no measured row has a modelled counterpart (same variant, segment and batch) to "
            "calibrate the roofline with; measure the variants on CPU first (`ridgeline profile`)"
        )
    return statistics.median(ratios)
