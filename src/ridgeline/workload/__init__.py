"""What load to send: when (arrival processes, recorded traces) and how big (shapes).

Everything here is decided before a run starts: a seeded schedule of send offsets and
one ``RequestShape`` per request; for generative endpoints, ``LlmWorkload`` gives each
its prompt (exact in tokens under an offline tokenizer, or from a dataset) and output
length.
"""

from ridgeline.workload.arrivals import (
    ARRIVAL_KINDS,
    ArrivalProcess,
    ArrivalSpec,
    arrival_from_dict,
    parse_arrival,
)
from ridgeline.workload.datasets import read_dataset
from ridgeline.workload.llm import LlmWorkload
from ridgeline.workload.payloads import (
    DEFAULT_SHAPE,
    FixedSize,
    LognormalSize,
    RequestShape,
    SizeSpec,
    UniformSize,
    fixed_shapes,
    parse_size,
    sampled_shapes,
    shapes_from_trace,
)
from ridgeline.workload.prompts import make_prompts
from ridgeline.workload.stationary import ConstantArrivals, GammaArrivals, PoissonArrivals
from ridgeline.workload.tokenizer import load_tokenizer
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
    "LlmWorkload",
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
    "load_tokenizer",
    "make_prompts",
    "parse_arrival",
    "parse_size",
    "read_dataset",
    "read_trace",
    "sampled_shapes",
    "shapes_from_trace",
]
