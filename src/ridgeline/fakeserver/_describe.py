"""What the server says about itself and its model, as plain dicts shared by the HTTP
routes (as JSON) and the gRPC service (through protobuf's JSON mapping)."""

from __future__ import annotations

from typing import Any

from ridgeline._version import __version__
from ridgeline.fakeserver.metrics import Stats
from ridgeline.synthetic.model import LatencyModel
from ridgeline.v2 import describe

SERVER_NAME = "ridgeline-fakeserver"
VERSION = describe.VERSION
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "openai"]


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}


def model_metadata(model: LatencyModel) -> dict[str, Any]:
    return describe.model_metadata(model.name, "ridgeline_fake", model.inputs, model.outputs)


def model_config(model: LatencyModel) -> dict[str, Any]:
    """Triton-style model configuration (the JSON form of ``model_config.proto``)."""
    return describe.model_config(
        model.name,
        "ridgeline_fake",
        model.inputs,
        model.outputs,
        model.batching,
        model.instances,
        "KIND_GPU",
    )


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
