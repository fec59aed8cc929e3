"""What the server says about itself and its model, as plain dicts shared by the HTTP
routes (as JSON) and the gRPC service (through protobuf's JSON mapping)."""

from __future__ import annotations

from typing import Any

from ridgeline import __version__
from ridgeline.fakeserver.metrics import Stats
from ridgeline.fakeserver.model import LatencyModel, TensorSpec

SERVER_NAME = "ridgeline-fakeserver"
VERSION = "1"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "openai"]


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}


def _tensor_metadata(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


def model_metadata(model: LatencyModel) -> dict[str, Any]:
    return {
        "name": model.name,
        "versions": [VERSION],
        "platform": "ridgeline_fake",
        "inputs": [_tensor_metadata(s) for s in model.inputs],
        "outputs": [_tensor_metadata(s) for s in model.outputs],
    }


def _tensor_config(spec: TensorSpec) -> dict[str, Any]:
    data_type = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
    return {"name": spec.name, "data_type": data_type, "dims": list(spec.shape[1:])}


def model_config(model: LatencyModel) -> dict[str, Any]:
    """Triton-style model configuration (the JSON form of ``model_config.proto``)."""
    b = model.batching
    return {
        "name": model.name,
        "platform": "ridgeline_fake",
        "backend": "ridgeline_fake",
        "max_batch_size": b.max_batch_size,
        "input": [_tensor_config(s) for s in model.inputs],
        "output": [_tensor_config(s) for s in model.outputs],
        "dynamic_batching": {
            "preferred_batch_size": list(b.preferred_batch_sizes),
            "max_queue_delay_microseconds": round(b.max_queue_delay_s * 1e6),
        },
        "instance_group": [
            {"name": f"{model.name}_0", "kind": "KIND_GPU", "count": model.instances}
        ],
    }


def repository_index(model: LatencyModel) -> list[dict[str, Any]]:
    return [{"name": model.name, "version": VERSION, "state": "READY"}]


def model_statistics(model: LatencyModel, stats: Stats) -> dict[str, Any]:
    """Triton's statistics extension for the one model (durations in nanoseconds)."""

    def duration(count: int, us: float) -> dict[str, int]:
        return {"count": count, "ns": round(us * 1000)}

    done = stats.success + stats.outcomes["error"]
    return {
        "model_stats": [
            {
                "name": model.name,
                "version": VERSION,
                "inference_count": stats.inference_count,
                "execution_count": stats.exec_count,
                "inference_stats": {
                    "success": duration(stats.success, stats.ok_us),
                    "fail": duration(stats.failure, stats.failed_us),
                    "queue": duration(done, stats.queue_us),
                    "compute_input": duration(done, 0.0),
                    "compute_infer": duration(done, stats.compute_us),
                    "compute_output": duration(done, 0.0),
                },
            }
        ]
    }
