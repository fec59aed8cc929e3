"""What a v2 server says about a model, as plain dicts shared by every front end: the
v2 metadata and Triton's model configuration (the JSON form of ``model_config.proto``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ridgeline.policies.batching import BatchingConfig
from ridgeline.v2.spec import TensorSpec, triton_type

VERSION = "1"


def tensor_metadata(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


def tensor_config(spec: TensorSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "data_type": triton_type(spec.datatype),
        "dims": list(spec.shape[1:]),
    }


def model_metadata(
    name: str, platform: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> dict[str, Any]:
    return {
        "name": name,
        "versions": [VERSION],
        "platform": platform,
        "inputs": [tensor_metadata(s) for s in inputs],
        "outputs": [tensor_metadata(s) for s in outputs],
    }


def model_config(
    name: str,
    platform: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    batching: BatchingConfig,
    instances: int,
    kind: str,
) -> dict[str, Any]:
    """Triton-style model configuration; ``kind`` is KIND_GPU or KIND_CPU."""
    return {
        "name": name,
        "platform": platform,
        "backend": platform,
        "max_batch_size": batching.max_batch_size,
        "input": [tensor_config(s) for s in inputs],
        "output": [tensor_config(s) for s in outputs],
        "dynamic_batching": {
            "preferred_batch_size": list(batching.preferred_batch_sizes),
            "max_queue_delay_microseconds": round(batching.max_queue_delay_s * 1e6),
        },
        "instance_group": [{"name": f"{name}_0", "kind": kind, "count": instances}],
    }
