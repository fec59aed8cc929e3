"""The served-plan simulator: a Plan run in virtual time as the serving runtime runs it
(its task queues, batching by ``policies.batching``, early drops by ``policies.dropping``,
fan-out along the edges), under an arrival process or a recorded trace.

    result = simulate_plan(load_plan("plan.yaml"), arrival_schedule(rate=50, duration_s=60))
"""

from ridgeline.plansim.api import SimConfig, arrival_schedule, simulate_plan
from ridgeline.plansim.result import PlanSimResult, TaskStats
from ridgeline.plansim.service import ServiceTime, service_times

__all__ = [
    "PlanSimResult",
    "ServiceTime",
    "SimConfig",
    "TaskStats",
    "arrival_schedule",
    "service_times",
    "simulate_plan",
]
