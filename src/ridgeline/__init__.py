"""ridgeline: what is the least GPU that serves demand D within my SLO, and does it really?

The public API, in a few lines::

    from ridgeline import StepConfig, from_arrival, parse_arrival, run_coroutine, measure_step

    schedule = from_arrival(parse_arrival("poisson", 200.0), duration_s=10.0, seed=1)
    result = run_coroutine(measure_step("http://127.0.0.1:8000/v2/models/m", schedule,
                                        StepConfig()))
    print(result.summary.latency_ms.p99, result.summary.valid)
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from ridgeline._version import __version__ as __version__

if TYPE_CHECKING:  # what mypy and editors see; at run time each name loads on first use
    from ridgeline.aio import run_coroutine
    from ridgeline.errors import (
        BackendConfigError,
        ConfigError,
        DatasetError,
        GpuUnavailableError,
        HostTooSmall,
        InfeasiblePlan,
        InferFailed,
        InvalidRequest,
        ModelNotFoundError,
        PlacementError,
        PlanCheckFailed,
        PlanError,
        RidgelineError,
        RunInterrupted,
        StoreError,
        TargetError,
        TargetUnreachableError,
        TokenizerError,
        TraceFormatError,
        UnknownKindError,
        WorkerCrashed,
        WorkerError,
        WorkerStartError,
    )
    from ridgeline.fakeserver import FakeServer, load_preset
    from ridgeline.health import HealthState, SLOPolicy, parse_slo
    from ridgeline.loadgen.replayer import Progress, ReplayConfig, replay
    from ridgeline.loadgen.schedule import Schedule, from_arrival, from_trace
    from ridgeline.loadgen.step import StepConfig, StepResult, measure_step, run_step
    from ridgeline.loadgen.validity import ValidityConfig, assess_validity
    from ridgeline.pipeline.placement import place
    from ridgeline.pipeline.plan import Plan, load_plan
    from ridgeline.pipeline.planned import to_plan
    from ridgeline.pipeline.planner import Features, plan_pipeline
    from ridgeline.pipeline.profiles import ProfileTable, load_profiles
    from ridgeline.pipeline.spec import PipelineSpec, load_spec
    from ridgeline.policies.batching import BatchingConfig
    from ridgeline.probe.api import make_driver, run_probe
    from ridgeline.probe.drivers import NetworkDriver, SimDriver
    from ridgeline.probe.orchestrator import ProbeConfig, ProbeResult, probe
    from ridgeline.search import CapacityEstimate, parse_strategy
    from ridgeline.serve.runtime import PlanServer
    from ridgeline.sizing import allocate
    from ridgeline.synthetic.model import LatencyModel, capacity_rps
    from ridgeline.targets import Reply, Target, make_target
    from ridgeline.telemetry.records import Outcome, Records
    from ridgeline.telemetry.store import RunStore
    from ridgeline.telemetry.summary import StepSummary
    from ridgeline.telemetry.windows import Window
    from ridgeline.workload import RequestShape, Trace, parse_arrival, read_trace

_HOMES = {
    "BackendConfigError": "ridgeline.errors",
    "BatchingConfig": "ridgeline.policies.batching",
    "CapacityEstimate": "ridgeline.search",
    "ConfigError": "ridgeline.errors",
    "DatasetError": "ridgeline.errors",
    "FakeServer": "ridgeline.fakeserver",
    "Features": "ridgeline.pipeline.planner",
    "GpuUnavailableError": "ridgeline.errors",
    "HealthState": "ridgeline.health",
    "HostTooSmall": "ridgeline.errors",
    "InfeasiblePlan": "ridgeline.errors",
    "InferFailed": "ridgeline.errors",
    "InvalidRequest": "ridgeline.errors",
    "LatencyModel": "ridgeline.synthetic.model",
    "ModelNotFoundError": "ridgeline.errors",
    "PlanCheckFailed": "ridgeline.errors",
    "NetworkDriver": "ridgeline.probe.drivers",
    "Outcome": "ridgeline.telemetry.records",
    "PipelineSpec": "ridgeline.pipeline.spec",
    "PlacementError": "ridgeline.errors",
    "Plan": "ridgeline.pipeline.plan",
    "PlanError": "ridgeline.errors",
    "PlanServer": "ridgeline.serve.runtime",
    "ProbeConfig": "ridgeline.probe.orchestrator",
    "ProbeResult": "ridgeline.probe.orchestrator",
    "ProfileTable": "ridgeline.pipeline.profiles",
    "Progress": "ridgeline.loadgen.replayer",
    "Records": "ridgeline.telemetry.records",
    "ReplayConfig": "ridgeline.loadgen.replayer",
    "Reply": "ridgeline.targets",
    "RequestShape": "ridgeline.workload",
    "RidgelineError": "ridgeline.errors",
    "RunInterrupted": "ridgeline.errors",
    "RunStore": "ridgeline.telemetry.store",
    "SLOPolicy": "ridgeline.health",
    "Schedule": "ridgeline.loadgen.schedule",
    "SimDriver": "ridgeline.probe.drivers",
    "StepConfig": "ridgeline.loadgen.step",
    "StepResult": "ridgeline.loadgen.step",
    "StepSummary": "ridgeline.telemetry.summary",
    "StoreError": "ridgeline.errors",
    "Target": "ridgeline.targets",
    "TargetError": "ridgeline.errors",
    "TargetUnreachableError": "ridgeline.errors",
    "TokenizerError": "ridgeline.errors",
    "Trace": "ridgeline.workload",
    "TraceFormatError": "ridgeline.errors",
    "UnknownKindError": "ridgeline.errors",
    "ValidityConfig": "ridgeline.loadgen.validity",
    "Window": "ridgeline.telemetry.windows",
    "WorkerCrashed": "ridgeline.errors",
    "WorkerError": "ridgeline.errors",
    "WorkerStartError": "ridgeline.errors",
    "allocate": "ridgeline.sizing",
    "assess_validity": "ridgeline.loadgen.validity",
    "capacity_rps": "ridgeline.synthetic.model",
    "from_arrival": "ridgeline.loadgen.schedule",
    "from_trace": "ridgeline.loadgen.schedule",
    "load_plan": "ridgeline.pipeline.plan",
    "load_preset": "ridgeline.fakeserver",
    "load_profiles": "ridgeline.pipeline.profiles",
    "load_spec": "ridgeline.pipeline.spec",
    "make_driver": "ridgeline.probe.api",
    "make_target": "ridgeline.targets",
    "measure_step": "ridgeline.loadgen.step",
    "parse_arrival": "ridgeline.workload",
    "parse_slo": "ridgeline.health",
    "parse_strategy": "ridgeline.search",
    "place": "ridgeline.pipeline.placement",
    "plan_pipeline": "ridgeline.pipeline.planner",
    "probe": "ridgeline.probe.orchestrator",
    "read_trace": "ridgeline.workload",
    "replay": "ridgeline.loadgen.replayer",
    "run_coroutine": "ridgeline.aio",
    "run_probe": "ridgeline.probe.api",
    "run_step": "ridgeline.loadgen.step",
    "to_plan": "ridgeline.pipeline.planned",
}
"""Each public name and the module that defines it: ``import ridgeline`` loads none of
them (no grpc, aiohttp, HiGHS or onnxruntime) until a name is used (PEP 562)."""

__all__ = [
    "BackendConfigError",
    "BatchingConfig",
    "CapacityEstimate",
    "ConfigError",
    "DatasetError",
    "FakeServer",
    "Features",
    "GpuUnavailableError",
    "HealthState",
    "HostTooSmall",
    "InfeasiblePlan",
    "InferFailed",
    "InvalidRequest",
    "LatencyModel",
    "ModelNotFoundError",
    "NetworkDriver",
    "Outcome",
    "PipelineSpec",
    "PlacementError",
    "Plan",
    "PlanCheckFailed",
    "PlanError",
    "PlanServer",
    "ProbeConfig",
    "ProbeResult",
    "ProfileTable",
    "Progress",
    "Records",
    "ReplayConfig",
    "Reply",
    "RequestShape",
    "RidgelineError",
    "RunInterrupted",
    "RunStore",
    "SLOPolicy",
    "Schedule",
    "SimDriver",
    "StepConfig",
    "StepResult",
    "StepSummary",
    "StoreError",
    "Target",
    "TargetError",
    "TargetUnreachableError",
    "TokenizerError",
    "Trace",
    "TraceFormatError",
    "UnknownKindError",
    "ValidityConfig",
    "Window",
    "WorkerCrashed",
    "WorkerError",
    "WorkerStartError",
    "allocate",
    "assess_validity",
    "capacity_rps",
    "from_arrival",
    "from_trace",
    "load_plan",
    "load_preset",
    "load_profiles",
    "load_spec",
    "make_driver",
    "make_target",
    "measure_step",
    "parse_arrival",
    "parse_slo",
    "parse_strategy",
    "place",
    "plan_pipeline",
    "probe",
    "read_trace",
    "replay",
    "run_coroutine",
    "run_probe",
    "run_step",
    "to_plan",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ridgeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """``ridgeline.probe`` is the function, also once the subpackage of that name loads
    (importing a submodule binds it on its parent; for a public name, the name wins)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _HOMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
