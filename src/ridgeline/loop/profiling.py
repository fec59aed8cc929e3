"""Measured profile rows: each variant served by the real runtime on this host's CPU.

For each variant of a spec, core count ``N`` and batch size ``b``, ``measure_cpu`` starts
a one-task ``PlanServer`` on 127.0.0.1 (any free port; one server at a time): the
variant's model (its synthetic latency model, its artifact, or the zoo's), one instance
on ``N`` cores, ``batch_size = b``, no dropping. It sends requests of ``b`` rows each, so
every batch is exactly ``b``, over gRPC (binary tensors: parsing image batches from JSON
would cost the frontend more CPU than the model costs the worker), through the load
engine at a rate far above what one instance serves, with at most two requests
outstanding (one batch running, the next queued: the instance never waits for the
client, and the backlog stays bounded). After a warm-up it reads the server's metrics
for ``seconds``: the latency is the mean batch execution time
(``ridgeline_task_compute_seconds`` sum / count) and the throughput rows executed over
busy time. The execution time is the worker's batch as the frontend sees it, the
hand-off to the worker process included. The load generator and the frontend share this
process; on a host with few cores they compete with the worker for them.

A point takes the server's start (a process spawned, the model loaded and warmed), the
warm-up, ``seconds``, and the last batch's drain.

``model_gpus`` adds roofline rows for GPU types (``roofline``: the constants fitted to
public GPU measurements, ``calibrated`` on the GPU type they were measured on, ``modelled``
on the others). It also compares the measured CPU rows with the CPU roofline, each
measured model's FLOPs those of the model that ran (the zoo's reduced model, not the
full-size one the spec's figure describes): how far this host runs from its roofline, a
factor it reports and no longer carries over to the GPU rows, whose constants come from
GPU measurements.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import ConfigError, PlanError, WorkerError
from ridgeline.loadgen.replayer import ReplayConfig
from ridgeline.loadgen.schedule import from_arrival
from ridgeline.loadgen.step import StepConfig, StepResult, measure_step
from ridgeline.pipeline.plan import Plan, TaskPlan
from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
from ridgeline.pipeline.roofline import (
    Cost,
    Roofline,
    calibrate,
    cpu_modelled_rows,
    modelled_rows,
    variant_gflops,
)
from ridgeline.pipeline.segments import CPU, CpuSegment
from ridgeline.pipeline.spec import PipelineSpec, VariantSpec
from ridgeline.serve.loading import setup_plan
from ridgeline.serve.runtime import PlanServer
from ridgeline.workload.arrivals import parse_arrival
from ridgeline.workload.payloads import RequestShape, fixed_shapes
from ridgeline.zoo.manifest import Manifest, load_manifest

TASK = "model"
"""The task name of a profiling plan (its label in the server's metrics)."""
_OFFERED_RPS = 2000.0
"""Requests per second offered: far above what one instance serves at any batch worth
measuring; the outstanding cap turns the excess into requests never sent."""
_OUTSTANDING = 2
_QUEUE_DELAY_MS = 100.0
_LONG_MS = 600_000.0
"""SLO and budget of a profiling plan: nothing is dropped, nothing is late."""


def variants(spec: PipelineSpec) -> list[tuple[str, VariantSpec]]:
    """``(task, variant)`` for each distinct variant name, first task first."""
    seen: dict[str, tuple[str, VariantSpec]] = {}
    for task, t in spec.tasks.items():
        for v in t.variants:
            seen.setdefault(v.name, (task, v))
    return list(seen.values())


def from_zoo(v: VariantSpec) -> bool:
    """Whether ``v``'s model is the zoo's (it gives no synthetic model nor artifact)."""
    return v.synthetic is None and v.artifact is None


def profile_plan(v: VariantSpec, cores: int, batch: int) -> Plan:
    """The one-task plan that serves ``v`` on ``cores`` cores in batches of ``batch``."""
    task = TaskPlan(
        variant=v.name,
        artifact=v.artifact,
        synthetic=v.synthetic,
        segment=CpuSegment(cores=cores),
        batch_size=batch,
        max_queue_delay_ms=_QUEUE_DELAY_MS,
        instances=1,
        latency_budget_ms=_LONG_MS,
    )
    return Plan(name="profile", slo_ms=_LONG_MS, tasks={TASK: task})


async def measure_cpu(
    spec: PipelineSpec,
    zoo: Path,
    cores: Sequence[int] = (1,),
    batches: Sequence[int] = (1, 2, 4, 8),
    seconds: float = 3.0,
    *,
    spec_dir: Path = Path("."),
    warmup_s: float = 0.5,
    on_row: Callable[[ProfileRow], None] | None = None,
) -> ProfileTable:
    """Measured rows (pool ``cpu``, segment ``cpuN``) of every variant of ``spec`` at every
    core count and batch size; see the module docstring. ``spec_dir`` is where artifact
    paths are read from. Everything is checked before the first server starts."""
    points = list(_points(spec, zoo, cores, batches, seconds, warmup_s, spec_dir))
    rows = []
    for task, v, n, b, plan in points:
        try:
            latency, throughput = await _measure(plan, spec_dir, zoo, b, seconds, warmup_s)
        except (ConfigError, WorkerError) as e:
            where = f"variant {v.name!r} (task {task}) on cpu{n}, batch {b}"
            raise _same_kind(e)(f"{where}: {e}") from e
        row = ProfileRow(v.name, CPU, f"cpu{n}", b, latency, throughput, "measured")
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return ProfileTable(rows)


def _same_kind(e: ConfigError | WorkerError) -> type[ConfigError | WorkerError]:
    """The plainest class of ``e``'s kind: PlanError, ConfigError or WorkerError."""
    if isinstance(e, WorkerError):
        return WorkerError
    return PlanError if isinstance(e, PlanError) else ConfigError


def _points(
    spec: PipelineSpec,
    zoo: Path,
    cores: Sequence[int],
    batches: Sequence[int],
    seconds: float,
    warmup_s: float,
    spec_dir: Path,
) -> Iterator[tuple[str, VariantSpec, int, int, Plan]]:
    if not seconds > 0 or warmup_s < 0:
        raise ConfigError(
            f"seconds {seconds}, warm-up {warmup_s}: seconds must be > 0, warm-up ≥ 0"
        )
    if not batches or any(b < 1 for b in batches):
        raise ConfigError(f"batches {list(batches)}: give one or more batch sizes ≥ 1")
    have = len(os.sched_getaffinity(0))
    if not cores or any(not 1 <= n <= have for n in cores):
        raise ConfigError(
            f"cores {list(cores)}: this process may use {have} cores; give counts in 1..{have}"
        )
    manifest = _manifest(spec, zoo)
    for task, v in variants(spec):
        limit = _batch_limit(v, manifest)
        if max(batches) > limit:
            raise PlanError(
                f"tasks.{task}.variants: {v.name!r} takes batches of {limit} at most, and "
                f"batches go to {max(batches)}; drop the larger batch sizes"
            )
        for n in cores:
            for b in batches:
                plan = profile_plan(v, n, b)
                try:
                    setup_plan(plan, spec_dir, zoo)  # an artifact that is missing, too big
                except PlanError as e:
                    raise PlanError(f"variant {v.name!r} (task {task}): {e}") from e
                yield task, v, n, b, plan


def _manifest(spec: PipelineSpec, zoo: Path) -> Manifest | None:
    """The zoo's manifest, checked to hold every variant taken from it."""
    wanted = [(task, v) for task, v in variants(spec) if from_zoo(v)]
    if not wanted:
        return None
    fix = f"build it (`ridgeline models build --out {zoo}`), or give the variant an artifact"
    if not (zoo / "manifest.json").is_file():
        task, v = wanted[0]
        raise PlanError(f"tasks.{task}.variants: {v.name!r} needs the model zoo at {zoo}; {fix}")
    manifest = load_manifest(zoo)
    have = {z.name for z in manifest.variants}
    for task, v in wanted:
        if v.name not in have:
            raise PlanError(
                f"tasks.{task}.variants: {v.name!r} is not in the zoo at {zoo} (it has "
                f"{', '.join(sorted(have)) or 'none'}); {fix} or a synthetic model"
            )
    return manifest


def _batch_limit(v: VariantSpec, manifest: Manifest | None) -> int:
    if v.synthetic is not None:
        return v.synthetic.max_batch_size
    if manifest is not None and from_zoo(v):
        return manifest.variant(v.name).max_batch_size
    return 4096  # an artifact's own limit is checked by setup_plan


async def _measure(
    plan: Plan, plan_dir: Path, zoo: Path, batch: int, seconds: float, warmup_s: float
) -> tuple[float, float]:
    """``(mean batch latency ms, rows per busy second)`` of one served point."""
    async with PlanServer(plan, plan_dir, http_port=0, grpc_port=0, zoo=zoo, drop=False) as server:
        url = f"grpc://{server.host}:{server.grpc_port}/{TASK}"
        if warmup_s > 0:
            _check(await _drive(url, batch, warmup_s))
        before = _totals(server)
        _check(await _drive(url, batch, seconds))
        after = _totals(server)
    busy_s, batches, rows = (a - b for a, b in zip(after, before, strict=True))
    if batches < 1 or busy_s <= 0:
        raise ConfigError(f"no batch finished in {seconds:g} s; measure for longer")
    return 1000.0 * busy_s / batches, rows / busy_s


async def _drive(url: str, batch: int, seconds: float) -> StepResult:
    """Requests of ``batch`` rows for ``seconds``: offered far above capacity, at most
    ``_OUTSTANDING`` in flight; those in flight at the end are answered."""
    schedule = from_arrival(parse_arrival("poisson", _OFFERED_RPS), seconds)
    shapes = fixed_shapes(len(schedule.times), RequestShape(items=batch))
    schedule = dataclasses.replace(schedule, shapes=shapes)
    cfg = StepConfig(replay=ReplayConfig(max_outstanding=_OUTSTANDING))
    stop = asyncio.Event()
    timer = asyncio.get_running_loop().call_later(seconds, stop.set)
    try:
        return await measure_step(url, schedule, cfg, stop=stop)
    finally:
        timer.cancel()


def _check(step: StepResult) -> None:
    s = step.summary
    failed = s.errors + s.timeouts + s.incomplete
    if failed:
        kinds = "; ".join(f"{k} ({n})" for k, n in s.error_kinds.items()) or "no detail"
        raise WorkerError(
            f"{failed} of {s.sent} requests failed: {kinds}; check that the model runs "
            "(`ridgeline serve` a plan with it)"
        )


def _totals(server: PlanServer) -> tuple[float, float, float]:
    """``(compute seconds, batches, rows)`` the task has executed so far."""
    registry, labels = server.metrics.registry, {"task": TASK}

    def value(name: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    return (
        value("ridgeline_task_compute_seconds_sum"),
        value("ridgeline_task_batch_size_count"),
        value("ridgeline_task_batch_size_sum"),
    )


# --- the zoo and the roofline -----------------------------------------------------------


def ensure_zoo(spec: PipelineSpec, zoo: Path) -> Manifest | None:
    """The zoo at ``zoo`` holding every variant ``spec`` takes from it, the families they
    belong to built first where any is missing; None when no variant needs the zoo."""
    from ridgeline.zoo.build import build_zoo
    from ridgeline.zoo.families import FAMILIES

    wanted = [(task, v.name) for task, v in variants(spec) if from_zoo(v)]
    if not wanted:
        return None
    family = {name: f for f, names in FAMILIES.items() for name in names}
    for task, name in wanted:
        if name not in family:
            raise PlanError(
                f"tasks.{task}.variants: {name!r} is not a zoo variant (the zoo has "
                f"{', '.join(sorted(family))}); give it an artifact (an ONNX file) or a "
                "synthetic latency model"
            )
    try:
        manifest = load_manifest(zoo)
    except ConfigError:
        manifest = Manifest()
    have = {v.name for v in manifest.variants}
    if all(name in have for _, name in wanted):
        return manifest
    return build_zoo(zoo, sorted({family[name] for _, name in wanted}))


@dataclass(frozen=True, slots=True)
class Modelled:
    """Roofline rows for GPU types, and how far this host's CPU runs from its roofline."""

    rows: list[ProfileRow]
    cpu_factor: float
    """Measured / modelled CPU latency (``roofline.calibrate``; 1 when nothing could be
    compared). Reported only: the GPU rows do not carry it."""
    basis: int
    """Measured rows the factor rests on; 0 when none could be modelled."""


def measured_costs(spec: PipelineSpec, manifest: Manifest | None) -> list[Cost]:
    """The cost per item of each variant's model as it was measured: a zoo variant's
    reduced model (the manifest's FLOPs); an artifact, taken to be the model the spec's
    (or the published) figure describes. Synthetic models have none and are left out."""
    costs = []
    for _, v in variants(spec):
        if from_zoo(v) and manifest is not None:
            costs.append(Cost(v.name, manifest.variant(v.name).gflops_per_item))
        elif v.artifact is not None:
            try:
                costs.append(Cost(v.name, variant_gflops(v), v.mbytes))
            except PlanError:
                continue
    return costs


def model_gpus(
    spec: PipelineSpec,
    measured: ProfileTable,
    gpus: Sequence[str],
    batches: Sequence[int],
    manifest: Manifest | None,
    *,
    model: Roofline | None = None,
) -> Modelled:
    """Roofline rows of every variant of ``spec`` on every segment type of each GPU type
    in ``gpus``, by ``model`` (default: the fitted GPU constants); and the factor between
    the measured CPU rows whose models' FLOPs are known and the CPU roofline."""
    costs = measured_costs(spec, manifest)
    cpu = [r for r in measured if r.pool == CPU and r.source == "measured"]
    known = {c.name for c in costs}
    basis = [r for r in cpu if r.variant in known]
    factor = 1.0
    if basis:
        cores = sorted({int(r.segment[3:]) for r in basis})
        sizes = sorted({r.batch for r in basis})
        factor = calibrate(basis, cpu_modelled_rows(costs, cores, sizes))
    names = [v for _, v in variants(spec)]
    rows = [r for g in gpus for r in modelled_rows(names, g, batches, model=model)]
    return Modelled(rows, factor, len(basis))
