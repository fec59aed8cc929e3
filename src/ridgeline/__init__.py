"""ridgeline: what is the least GPU that serves demand D within my SLO, and does it really?

The public API, in a few lines::

    from ridgeline import StepConfig, from_arrival, parse_arrival, run_coroutine, measure_step

    schedule = from_arrival(parse_arrival("poisson", 200.0), duration_s=10.0, seed=1)
    result = run_coroutine(measure_step("http://127.0.0.1:8000/v2/models/m", schedule,
                                        StepConfig()))
    print(result.summary.latency_ms.p99, result.summary.valid)
"""

__version__ = "0.1.0"  # before the imports: submodules read it

from ridgeline.aio import run_coroutine
from ridgeline.capacity import allocate
from ridgeline.errors import (
    ConfigError,
    PlanError,
    RidgelineError,
    RunInterrupted,
    StoreError,
    TargetError,
    TargetUnreachableError,
    TraceFormatError,
    UnknownKindError,
)
from ridgeline.fakeserver import FakeServer, load_preset
from ridgeline.health import HealthState, SLOPolicy, parse_slo
from ridgeline.loadgen.records import Outcome, Records
from ridgeline.loadgen.replayer import Progress, ReplayConfig, replay
from ridgeline.loadgen.schedule import Schedule, from_arrival, from_trace
from ridgeline.loadgen.step import StepConfig, StepResult, measure_step, run_step
from ridgeline.loadgen.validity import ValidityConfig, assess_validity
from ridgeline.pipeline.placement import place
from ridgeline.pipeline.plan import Plan, load_plan
from ridgeline.pipeline.planned import to_plan
from ridgeline.pipeline.planner import Features, InfeasiblePlan, plan_pipeline
from ridgeline.pipeline.profiles import ProfileTable, load_profiles
from ridgeline.pipeline.spec import PipelineSpec, load_spec
from ridgeline.policies.batching import BatchingConfig
from ridgeline.probe.api import make_driver, run_probe
from ridgeline.probe.drivers import NetworkDriver, SimDriver
from ridgeline.probe.orchestrator import ProbeConfig, ProbeResult, probe
from ridgeline.search import CapacityEstimate, parse_strategy
from ridgeline.serve.runtime import PlanServer
from ridgeline.synthetic.model import LatencyModel, capacity_rps
from ridgeline.targets import Reply, Target, make_target
from ridgeline.telemetry.store import RunStore
from ridgeline.telemetry.summary import StepSummary
from ridgeline.telemetry.windows import Window
from ridgeline.workload import RequestShape, Trace, parse_arrival, read_trace

__all__ = [
    "BatchingConfig",
    "CapacityEstimate",
    "ConfigError",
    "FakeServer",
    "Features",
    "HealthState",
    "InfeasiblePlan",
    "LatencyModel",
    "NetworkDriver",
    "Outcome",
    "PipelineSpec",
    "Plan",
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
    "Trace",
    "TraceFormatError",
    "UnknownKindError",
    "ValidityConfig",
    "Window",
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
