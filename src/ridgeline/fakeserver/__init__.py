"""A fake Triton/KServe inference server with a configurable latency model.

Serves the Open Inference Protocol v2 over HTTP and gRPC (real ``tritonclient`` peers
work against it), OpenAI-compatible completions with streaming, and Prometheus metrics
under Triton's names. Requests are queued and dynamically batched by the same policy
as the serving runtime (``ridgeline.policies.batching.decide``), and "executed" by the
shared latency model (``ridgeline.synthetic.model.LatencyModel``): ``base_ms +
per_item_ms·rows`` on ``instances`` parallel executors, with optional warm-up, noise,
stalls, injected errors and a bounded queue.

    async with FakeServer(load_preset("default")) as server:
        ...  # send requests to server.model_url / server.grpc_url

    with running_in_thread(load_preset("batching")) as server:
        ...  # synchronous clients
"""

from ridgeline.fakeserver.engine import BatchingEngine, Outcome, Status
from ridgeline.fakeserver.loading import load_config, load_preset, preset_names
from ridgeline.fakeserver.server import (
    FakeServer,
    ServerUrls,
    running_in_process,
    running_in_thread,
    serve_forever,
)

__all__ = [
    "BatchingEngine",
    "FakeServer",
    "Outcome",
    "ServerUrls",
    "Status",
    "load_config",
    "load_preset",
    "preset_names",
    "running_in_process",
    "running_in_thread",
    "serve_forever",
]
