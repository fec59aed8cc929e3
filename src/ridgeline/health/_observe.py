"""From a telemetry window (and its scraped server metrics) to the engine's Observation.

Server metrics come keyed ``name`` or ``name{label="v",...}`` (``telemetry.scrape``),
counters as deltas over the window, gauges as values. The queue is the fake server's
``fakeserver_queue_length``, else Triton's ``nv_inference_pending_request_count``,
else vLLM's ``vllm:num_requests_waiting`` (summed over models); the mean batch size is
Δ``nv_inference_count`` (rows) over Δ``nv_inference_exec_count`` (batches), summed over
models, else vLLM's ``vllm:num_requests_running`` (a continuous batch is the requests
running). vLLM's ``vllm:kv_cache_usage_perc`` (its highest series; older vLLM's
``vllm:gpu_cache_usage_perc``) and Δ``vllm:num_preemptions_total`` are the saturation
signals the engine reads (``engine``: they make a window at least Warn).
"""

from __future__ import annotations

from ridgeline._same_named import same_named
from ridgeline.health.metrics import DEFAULT, METRICS
from ridgeline.health.state import Observation
from ridgeline.telemetry.windows import Window

_QUEUE_NAMES = (
    "fakeserver_queue_length",
    "nv_inference_pending_request_count",
    "vllm:num_requests_waiting",
)
_KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def observation_from_window(
    w: Window, *, gpu_utilisation: float | None = None, gpu_problems: tuple[str, ...] = ()
) -> Observation:
    """What the health engine reads from ``w``; GPU readings come from a ``GpuMonitor``."""
    rows = _total(w.server, "nv_inference_count")
    batches = _total(w.server, "nv_inference_exec_count")
    running = _total(w.server, "vllm:num_requests_running")
    kv = [v for k, v in w.server.items() if k.split("{", 1)[0] in _KV_NAMES]
    # every metric of the table a window summarises (``Window.ttft_ms`` ...); e2e is its
    # ``latency_ms``, and a metric a window does not summarise is judged on the step only
    tokens = {
        m: p.model_dump()
        for m in METRICS
        if m != DEFAULT and (p := getattr(w, f"{m}_ms", None)) is not None
    }
    return same_named(
        Observation,
        w,
        latency_ms=w.latency_ms.model_dump(),
        answered=w.ok + w.failed + w.dropped,
        queue_length=next(
            (q for name in _QUEUE_NAMES if (q := _total(w.server, name)) is not None), None
        ),
        mean_batch_size=rows / batches if rows is not None and batches else running,
        gpu_utilisation=gpu_utilisation,
        gpu_problems=gpu_problems,
        token_ms=tokens,
        kv_cache_usage=max(kv, default=None),
        preemptions=_total(w.server, "vllm:num_preemptions"),
    )


def _total(server: dict[str, float], name: str) -> float | None:
    """Sum of every series of metric ``name`` (also spelled ``name_total``); None if absent."""
    found = [v for k, v in server.items() if k.split("{", 1)[0] in (name, f"{name}_total")]
    return sum(found) if found else None
