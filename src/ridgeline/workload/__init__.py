"""What load to send: when (arrival processes, recorded traces) and how big (shapes).

Everything here is decided before a run starts: a seeded schedule of send offsets and
one ``RequestShape`` per request.
"""

from ridgeline.workload.arrivals import (
    ARRIVAL_KINDS,
    ArrivalProcess,
    ArrivalSpec,
    arrival_from_dict,
    parse_arrival,
)
from ridgeline.workload.payloads import (
    DEFAULT_SHAPE,
    FixedSize,
    LognormalSize,
    RequestShape,
    SizeSpec,
    UniformSize,
    fixed_shapes,
    sampled_shapes,
    shapes_from_trace,
)
from ridgeline.workload.stationary import ConstantArrivals, GammaArrivals, PoissonArrivals
from ridgeline.workload.traces import Trace, bundled_trace_path, read_trace
from ridgeline.workload.varying import DiurnalArrivals, RampArrivals, StepArrivals

__all__ = [
    "ARRIVAL_KINDS",
    "DEFAULT_SHAPE",
    "ArrivalProcess",
    "ArrivalSpec",
    "ConstantArrivals",
    "DiurnalArrivals",
    "FixedSize",
    "GammaArrivals",
    "LognormalSize",
    "PoissonArrivals",
    "RampArrivals",
    "RequestShape",
    "SizeSpec",
    "StepArrivals",
    "Trace",
    "UniformSize",
    "arrival_from_dict",
    "bundled_trace_path",
    "fixed_shapes",
    "parse_arrival",
    "read_trace",
    "sampled_shapes",
    "shapes_from_trace",
]
