"""A roofline latency model: profile rows for hardware this host does not have.

One batch of ``b`` items of a variant on a segment takes::

    latency(b) = calibration × (overhead + max(b · FLOPs / (peak · efficiency · busy(b)),
                                               (weights + b · activations) / bandwidth))

``peak`` is the segment's share of the GPU's dense FP16 throughput (its SMs over the
GPU's), ``bandwidth`` its memory bandwidth (``SegmentType.bandwidth_gbps``: memory slices,
then the MPS share). Throughput is ``b / latency``. The constants are ``Roofline``'s
fields, each with its reason.

**Occupancy.** ``busy(b)`` is the share of the segment's SMs a batch keeps busy. A
kernel's work is cut into thread blocks the scheduler hands to SMs; a batch of ``b``
items brings about ``b · FLOPs / saturation`` blocks' worth of work, and dealt among
``S`` SMs they leave an SM idle with probability ``(1 − 1/S)^blocks``, so the busy share
is ``1 − exp(−b · FLOPs / (S · saturation))`` (``saturation_gflop_per_sm``: the work per
SM at which 63 % of the SMs are busy). A small batch on a big segment cannot fill it:
on a 7g slice a batch of one runs on a fraction of its 98 SMs, on a 1g slice on most of
its 14, so seven 1g slices serve several times what one 7g does at batch 1, and about as
much at large batches. The busy share only slows compute: the SMs that are busy draw
memory as fast as the segment's bandwidth allows, and with it the model keeps its laws
(latency grows with the batch and throughput does not fall; a segment with no fewer SMs
and no less bandwidth serves no less). CPU segments have no occupancy term.

**Which constants.** GPU rows use the constants fitted to public per-MIG-slice
measurements (``fitted_roofline()``, loaded from ``ridgeline/data/roofline_fit.json``,
made by ``pipeline.fit``; see docs/gpu-model.md): efficiency, overhead and saturation
fitted to MIGProfiler's A100-80GB rows, the bytes per GFLOP kept at their stated
guesses. Rows of a GPU type the constants were fitted on (``Roofline.calibrated_on``:
A100-80GB) are marked ``calibrated``; on any other GPU type ``gpu.py`` knows (A100-40GB,
H100-80GB, ...) the same constants run over that GPU's peak, bandwidth and SMs, and its
rows are marked ``modelled``. CPU rows use the round, stated guesses of ``Roofline()``
(``CPU_ROOFLINE``).

A variant's FLOPs per item: the spec's ``gflops``; else the published figure of the real
model (``zoo.accuracy.PUBLISHED_GFLOPS``, doubled for the classifier and face families,
whose sources print multiply-adds); else, for a zoo variant with none published (GIT, the
TTS family), the FLOPs the zoo's builder counts at full size (``zoo.paper_flops``); else
a ``PlanError`` asks for ``gflops:`` in the spec. Its bytes: the spec's ``mbytes`` (per
item, split into weights and activations in the ratio of the two ``*_mb_per_gflop``
constants), else both derived from the FLOPs by those constants.

``calibrate`` finds the factor that maps the CPU roofline to rows measured on the host's
CPU (a CPU segment has ``cpu_gflops_per_core`` × cores of peak and
``cpu_bandwidth_gbps_per_core`` × cores of bandwidth); ``modelled_rows(...,
calibration=k)`` multiplies GPU latencies by a factor when one is wanted, and rows so
scaled are ``modelled``, never ``calibrated``. Measured GPU rows
(``benchmarks/gpu_profile.py``), where there are any, should replace modelled ones.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from ridgeline.errors import PlanError
from ridgeline.pipeline.gpu import gpu_type
from ridgeline.pipeline.profiles import ProfileRow, Source
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
    """The model's constants. Defaults are round, stated guesses (what CPU rows use); the
    GPU's fitted ones are ``fitted_roofline()``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    efficiency: float = Field(
        0.4,
        gt=0,
        le=1,
        description="fraction of the compute roof a batch reaches with every SM busy: dense "
        "FP16 convolutions and matmuls of these sizes run at roughly a third to a half of "
        "tensor-core peak (the guess; the GPU fit finds what a measured stack reached)",
    )
    overhead_ms: float = Field(
        1.0,
        ge=0,
        description="fixed time per batch: kernel launches, host-device copies and the "
        "serving runtime's hand-off to its worker, about a millisecond",
    )
    saturation_gflop_per_sm: float | None = Field(
        None,
        gt=0,
        description="work per SM (a batch's GFLOPs over the segment's SMs) at which "
        "1 − 1/e of the SMs are busy; None: every SM always busy (no occupancy term)",
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
    calibrated_on: tuple[str, ...] = Field(
        (),
        description="GPU types whose measurements these constants were fitted to: their "
        "rows are marked calibrated, every other GPU type's modelled",
    )


CPU_ROOFLINE = Roofline()
"""The round, stated guesses: what CPU rows use unless given a model."""
FIT_FILE = "roofline_fit.json"
"""The shipped fit, in ``ridgeline/data/`` (written by ``benchmarks/roofline_fit.py``)."""


@functools.cache
def fitted_roofline() -> Roofline:
    """The GPU constants fitted to public measurements (``ridgeline/data/roofline_fit.json``,
    its ``roofline``), what GPU rows use unless given a model."""
    text = resources.files("ridgeline").joinpath("data", FIT_FILE).read_text()
    return Roofline.model_validate(json.loads(text)["roofline"])


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
    """A segment's two roofs, and the SMs its compute is spread over (None: a CPU's)."""

    peak_flops: float
    bandwidth_bps: float
    sms: float | None = None

    @classmethod
    def gpu(cls, segment: SegmentType) -> Roof:
        """The segment's share of its GPU's FP16 peak (SMs / the GPU's SMs), its memory
        bandwidth and its SMs."""
        g = gpu_type(segment.gpu)
        sms = segment.sms()
        return cls(g.fp16_tflops * 1e12 * sms / g.sms, segment.bandwidth_gbps() * 1e9, sms)

    @classmethod
    def cpu(cls, cores: int, model: Roofline) -> Roof:
        return cls(
            cores * model.cpu_gflops_per_core * 1e9, cores * model.cpu_bandwidth_gbps_per_core * 1e9
        )


def busy_share(work: Work, roof: Roof, batch: int, model: Roofline) -> float:
    """The share of the segment's SMs a batch keeps busy: ``1 − exp(−work per SM /
    saturation)``; 1 without an occupancy term or SMs (a CPU segment)."""
    if model.saturation_gflop_per_sm is None or roof.sms is None:
        return 1.0
    per_sm = batch * work.gflops / roof.sms
    return -math.expm1(-per_sm / model.saturation_gflop_per_sm)


def latency_ms(work: Work, roof: Roof, batch: int, model: Roofline) -> float:
    """The unscaled roofline: overhead plus the slower of compute (on the SMs the batch
    keeps busy) and memory."""
    compute_s = 0.0
    if work.gflops > 0:
        reached = roof.peak_flops * model.efficiency * busy_share(work, roof, batch, model)
        compute_s = batch * work.gflops * 1e9 / reached
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
    """Rows of every variant on every segment type of GPU type ``pool``
    (``gpu.segment_types``) at every batch size, the latency times ``calibration``; by
    ``model``, else the fitted GPU constants (``fitted_roofline``). They are
    ``calibrated`` where the model was fitted on ``pool`` and left unscaled, else
    ``modelled``."""
    if pool == CPU:
        raise PlanError("modelled_rows models GPU pools; use cpu_modelled_rows for cpu")
    m = model or fitted_roofline()
    roofs = {s.label: Roof.gpu(s) for s in segment_types(pool, spatial=spatial)}
    source: Source = "calibrated" if pool in m.calibrated_on and calibration == 1 else "modelled"
    return _rows(variants, pool, roofs, batches, calibration, m, source)


def cpu_modelled_rows(
    variants: Sequence[Costed],
    cores: Sequence[int],
    batches: Sequence[int],
    calibration: float = 1.0,
    *,
    model: Roofline | None = None,
) -> list[ProfileRow]:
    """Modelled rows on ``cpuN`` segments: ``N × cpu_gflops_per_core`` of peak and
    ``N × cpu_bandwidth_gbps_per_core`` of bandwidth, by ``model``, else the guessed
    constants (``CPU_ROOFLINE``); what ``calibrate`` compares the measured CPU rows with."""
    m = model or CPU_ROOFLINE
    if any(n < 1 for n in cores):
        raise PlanError(f"cores {list(cores)}: every core count must be ≥ 1")
    roofs = {cpu_label(n): Roof.cpu(n, m) for n in cores}
    return _rows(variants, CPU, roofs, batches, calibration, m, "modelled")


def _rows(
    variants: Sequence[Costed],
    pool: str,
    roofs: dict[str, Roof],
    batches: Sequence[int],
    calibration: float,
    model: Roofline,
    source: Source,
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
                rows.append(ProfileRow(v.name, pool, label, b, ms, b * 1000.0 / ms, source))
    return rows


def calibrate(measured: Iterable[ProfileRow], modelled_on_cpu: Iterable[ProfileRow]) -> float:
    """The median of measured / modelled latency over the rows both have (same variant,
    pool, segment and batch; only ``measured`` rows of ``measured`` count): the factor
    that maps the model onto the measurements, how far this host runs from its roofline."""
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
