"""From a Plan to what runs it: each task's backend and each instance's placement.

A task's model comes from, in order: its ``synthetic`` latency model; its ``artifact``
(an ONNX file, relative to the plan file); or its ``variant`` in the model zoo
(``ridgeline models build``). Instances are placed on their segment: a CPU segment gets
``cores`` cores of the host's (handed out in turn, wrapping round when the plan asks for
more than the host has: ``Plan.core_assignment``, which the simulator shares) and
``threads`` intra-op threads; a MIG segment gets a MIG device of its profile
(``CUDA_VISIBLE_DEVICES`` = its UUID, from ``nvidia-smi -L``); an MPS segment also gets
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = its share; a whole-GPU segment (MIG off) gets a
GPU with no MIG devices (its UUID).

Every problem is a ``PlanError`` naming the task's field and the fix: a missing
artifact, a variant the zoo does not have, a batch size over the model's limit, a GPU
segment on a host without MIG devices of that profile.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import PlanError
from ridgeline.pipeline.gpu import NO_MIG
from ridgeline.pipeline.plan import Plan, TaskPlan
from ridgeline.pipeline.segments import CpuSegment
from ridgeline.serve.affinity import Placement
from ridgeline.serve.backends import (
    BackendConfig,
    OnnxBackendConfig,
    PythonBackendConfig,
    SyntheticBackendConfig,
)
from ridgeline.synthetic.model import BatchCost


@dataclass(frozen=True, slots=True)
class TaskSetup:
    backend: BackendConfig
    placements: tuple[Placement, ...]


def zoo_dir() -> Path:
    """Where ``ridgeline models build`` puts the zoo: ``$RIDGELINE_ZOO`` or the cache."""
    return Path(os.environ.get("RIDGELINE_ZOO", Path.home() / ".cache" / "ridgeline" / "zoo"))


def setup_plan(plan: Plan, plan_dir: Path, zoo: Path | None = None) -> dict[str, TaskSetup]:
    """Backend and placements of every task; raises PlanError naming what is wrong."""
    if plan.name in plan.tasks:
        raise PlanError(
            f"task {plan.name!r} has the plan's own name; the pipeline is served under "
            "the plan's name, so rename the task or the plan"
        )
    host = sorted(os.sched_getaffinity(0))
    check_cores(plan, host)
    cores = plan.core_assignment(host)
    gpus = _MigDealer()
    out = {}
    for name, task in plan.tasks.items():
        backend = task_backend(name, task, plan_dir, zoo or zoo_dir())
        placements = []
        for k in range(task.instances):
            seg = task.segment
            if isinstance(seg, CpuSegment):
                placements.append(Placement(cores=cores[name][k], threads=seg.threads or seg.cores))
            else:
                share = getattr(seg, "share", None)
                on = task.gpus[k] if task.gpus is not None and k < len(task.gpus) else None
                placements.append(
                    Placement(
                        cuda_visible_devices=gpus.take(name, seg.profile, on, share or 1.0),
                        mps_thread_percentage=None if share is None else max(1, round(share * 100)),
                    )
                )
        out[name] = TaskSetup(backend, tuple(placements))
    return out


SHARED_CORE_LIMIT = 4
"""Instances that may share one core when a plan asks for more cores than the host has
(a 3-core plan on a 2-core host serves, slower); past this the workers would start
without end and never all be ready, so the plan is refused at start-up."""


def check_cores(plan: Plan, host: list[int]) -> None:
    """Refuse, before any worker starts, a plan whose CPU tasks ask for more cores than
    the host can give: an instance wider than the host, or in all more than
    ``SHARED_CORE_LIMIT`` instances to a core."""
    asked = 0
    for name, task in plan.tasks.items():
        seg = task.segment
        if not isinstance(seg, CpuSegment):
            continue
        if seg.cores > len(host):
            raise PlanError(
                f"tasks.{name}.segment.cores: {seg.cores} cores per instance, but this process "
                f"may use {len(host)} (cores {host}); give at most {len(host)}, or serve on a "
                "larger host"
            )
        asked += seg.cores * task.instances
    if asked > SHARED_CORE_LIMIT * len(host):
        raise PlanError(
            f"plan {plan.name!r} asks for {asked} CPU cores (instances × cores over its CPU "
            f"tasks), but this process may use {len(host)} (cores {host}) and at most "
            f"{SHARED_CORE_LIMIT} instances share a core; plan for this host "
            f"(`ridgeline plan --gpus {len(host)}cpu`), or serve on a larger one"
        )


def task_backend(name: str, task: TaskPlan, plan_dir: Path, zoo: Path) -> BackendConfig:
    """What runs ``task``: its synthetic model, Python class, ONNX artifact (relative to
    ``plan_dir``) or zoo variant; the exporters resolve a plan's models by it too."""
    device = "cpu" if isinstance(task.segment, CpuSegment) else "cuda"
    if task.synthetic is not None:
        shared = task.synthetic.model_dump(include=set(BatchCost.model_fields))
        return SyntheticBackendConfig(**shared)
    if task.python is not None:
        return PythonBackendConfig(target=task.python.target, options=task.python.options)
    if task.artifact is not None:
        path = (plan_dir / task.artifact).resolve()
        if not path.is_file():
            raise PlanError(
                f"tasks.{name}.artifact: {path} does not exist; give the path of an ONNX file "
                "(relative to the plan file), or drop artifact to take the zoo's"
            )
        _check_batch(name, task, _onnx_batch_limit(name, path), str(path))
        return OnnxBackendConfig(path=path, device=device)
    path, limit = _zoo_variant(name, task.variant, zoo)
    _check_batch(name, task, limit, f"zoo variant {task.variant!r}")
    return OnnxBackendConfig(path=path, device=device)


def _zoo_variant(task: str, variant: str, zoo: Path) -> tuple[Path, int]:
    from ridgeline.zoo import load_manifest

    if not (zoo / "manifest.json").is_file():
        raise PlanError(
            f"tasks.{task}.variant: {variant!r} needs the model zoo, and {zoo} has none; "
            f"build it with `ridgeline models build --out {zoo}`, or give an artifact"
        )
    manifest = load_manifest(zoo)
    known = {v.name: v for v in manifest.variants}
    if variant not in known:
        raise PlanError(
            f"tasks.{task}.variant: unknown variant {variant!r}; the zoo at {zoo} has "
            f"{', '.join(sorted(known))}. Pick one, or give an artifact or a synthetic model"
        )
    v = known[variant]
    return (zoo / v.path).resolve(), v.max_batch_size


def _onnx_batch_limit(task: str, path: Path) -> int | None:
    """The model's fixed batch dimension, if it has one (None: dynamic); a file that is not
    an ONNX model is a ``PlanError`` naming the task's artifact."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, OSError, ValueError) as e:
        raise PlanError(
            f"tasks.{task}.artifact: {path} is not an ONNX model ({' '.join(str(e).split())}); "
            "give the path of an .onnx file, or drop artifact to take the zoo's"
        ) from None
    limits = [
        i.type.tensor_type.shape.dim[0].dim_value
        for i in model.graph.input
        if i.type.tensor_type.shape.dim and i.type.tensor_type.shape.dim[0].HasField("dim_value")
    ]
    return min(limits) if limits else None


def _check_batch(name: str, task: TaskPlan, limit: int | None, what: str) -> None:
    if limit is not None and task.batch_size > limit:
        raise PlanError(
            f"tasks.{name}.batch_size: {task.batch_size} is over {what}'s limit of {limit}; "
            f"set batch_size ≤ {limit}"
        )


class _MigDealer:
    """MIG devices by profile, from ``nvidia-smi -L``, handed out in turn."""

    _LINE = re.compile(r"MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)")
    _GPU = re.compile(r"GPU (\d+): .*\(UUID: (GPU-[^)]+)\)")

    def __init__(self) -> None:
        self._devices: dict[str, list[str]] | None = None
        self._on: dict[tuple[int, str], list[str]] = {}
        """Devices per (GPU index, profile), ``NO_MIG`` for a GPU with MIG off."""
        self._next: dict[str, int] = defaultdict(int)
        self._used: dict[str, float] = defaultdict(float)
        """Share of each device dealt by the layout (1 for a whole instance)."""

    def take(self, task: str, profile: str, gpu: int | None = None, share: float = 1.0) -> str:
        """A device of ``profile``: on GPU ``gpu`` when the plan's layout names it, the
        first of its devices there (``nvidia-smi -L`` order) with room for ``share``
        (MPS clients of one slice share its device, as the layout packed them); else the
        next in turn over every GPU."""
        if self._devices is None:
            self._devices = self._discover()
        if gpu is not None:
            mine = [
                d for d in self._on.get((gpu, profile), []) if self._used[d] + share <= 1 + 1e-9
            ]
            if not mine:
                raise PlanError(
                    f"tasks.{task}.gpus: the layout puts an instance on GPU {gpu}, which has "
                    f"no unused device of profile {profile!r} (nvidia-smi -L); apply the "
                    "plan's mig-parted config (`ridgeline plan --mig-parted`), or drop gpus "
                    "from the plan to take any device of the profile"
                )
            self._used[mine[0]] += share
            return mine[0]
        devices = self._devices.get(profile, [])
        if not devices:
            have = ", ".join(sorted(self._devices)) or "none"
            raise PlanError(
                f"tasks.{task}.segment: no MIG device of profile {profile!r} on this host "
                f"(MIG devices: {have}); create them (nvidia-smi mig -cgi ... -C, or the plan's "
                "mig-parted config), or serve this task on a CPU segment"
            )
        k = self._next[profile]
        self._next[profile] += 1
        return devices[k % len(devices)]

    def _discover(self) -> dict[str, list[str]]:
        if shutil.which("nvidia-smi") is None:
            return {}
        try:
            text = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
        found: dict[str, list[str]] = defaultdict(list)
        for profile, uuid in self._LINE.findall(text):
            found[profile].append(uuid)
        # a GPU with no MIG device under it runs with MIG off: a whole-GPU segment
        gpus: list[tuple[int, str, bool]] = []  # (index, UUID, has MIG devices)
        for line in text.splitlines():
            if (m := self._GPU.match(line)) is not None:
                gpus.append((int(m.group(1)), m.group(2), False))
            elif gpus and (mig := self._LINE.search(line)) is not None:
                index, uuid, _ = gpus[-1]
                gpus[-1] = (index, uuid, True)
                self._on.setdefault((index, mig.group(1)), []).append(mig.group(2))
        for index, uuid, mig_on in gpus:
            if not mig_on:
                self._on[index, NO_MIG] = [uuid]
        found[NO_MIG] += [uuid for _, uuid, mig in gpus if not mig]
        if not found[NO_MIG]:
            del found[NO_MIG]
        return dict(found)
