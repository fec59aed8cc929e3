"""What the fake server counts, and its Prometheus exposition.

The engine and the protocol handlers bump plain counters on a ``Stats`` (no locks, no
label lookups on the hot path); ``MetricsExporter`` turns them into metrics at scrape
time through a per-server ``CollectorRegistry``. Two families come out:

* ``fakeserver_*``: requests by outcome, queue length, batch size, queue and compute time;
* Triton's own names, so scrapers written for Triton work unchanged:
  ``nv_inference_request_success``, ``nv_inference_request_failure``,
  ``nv_inference_count`` (rows inferred), ``nv_inference_exec_count`` (batches run),
  ``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
  ``nv_inference_compute_infer_duration_us`` (counters, labels ``model`` and
  ``version``) and the gauge ``nv_inference_pending_request_count``;
* with an LLM engine, vLLM's names (label ``model_name``), so dashboards and tools
  written for vLLM read it: the gauges ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0 to 1), the counters
  ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total`` and the histograms
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
  ``vllm:e2e_request_latency_seconds`` (vLLM's buckets).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

OUTCOMES = ("ok", "error", "rejected", "invalid", "not_found", "unauthorized", "too_large")
"""Labels of ``fakeserver_requests_total``: answered, injected error, queue full, bad
request, unknown model, missing token, body over the bound."""

_FAILURES = frozenset({"error", "rejected", "invalid"})
_TIME_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


_TRITON_METRICS = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests"),
    ("nv_inference_count", "counter", "Number of inferences performed (rows)"),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (batches)"),
    ("nv_inference_request_duration_us", "counter", "Cumulative request duration in us"),
    ("nv_inference_queue_duration_us", "counter", "Cumulative queuing duration in us"),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute duration in us"),
    ("nv_inference_pending_request_count", "gauge", "Requests queued or executing"),
)


class Histogram:
    """Bucket counts with Prometheus ``le`` semantics, observed without locks."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
        return out


def _families(
    kind: Callable[..., Metric], label: str, value: str, *rows: tuple[str, str, float | Histogram]
) -> Iterator[Metric]:
    """A family of ``kind`` per (name, help, sample or histogram) row, labelled
    ``label=value``."""
    for name, doc, v in rows:
        fam: Any = kind(name, doc, labels=[label])
        if isinstance(v, Histogram):
            fam.add_metric([value], v.cumulative(), v.total)
        else:
            fam.add_metric([value], v)
        yield fam


class Stats:
    """Plain counters of one server; the engine and the handlers bump them."""

    def __init__(self, max_batch_size: int) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.inference_count = 0
        self.exec_count = 0
        self.ok_us = 0.0
        self.failed_us = 0.0
        self.queue_us = 0.0
        self.compute_us = 0.0
        bounds, b = [], 1
        while b < max_batch_size:
            bounds.append(float(b))
            b *= 2
        bounds.append(float(max_batch_size))
        self.batch_rows = Histogram(bounds)
        self.queue_s = Histogram(_TIME_BUCKETS_S)
        self.compute_s = Histogram(_TIME_BUCKETS_S)

    def finish(self, outcome: str, duration_s: float = 0.0) -> None:
        """Count one answered request (``outcome`` is one of ``OUTCOMES``)."""
        self.outcomes[outcome] += 1
        if outcome == "ok":
            self.ok_us += duration_s * 1e6
        elif outcome in _FAILURES:
            self.failed_us += duration_s * 1e6

    @property
    def request_us(self) -> float:
        """Cumulative duration of requests that reached the model, successful or not."""
        return self.ok_us + self.failed_us

    @property
    def success(self) -> int:
        return self.outcomes["ok"]

    @property
    def failure(self) -> int:
        return sum(self.outcomes[o] for o in _FAILURES)


# vLLM's bucket bounds, seconds
_TTFT_BUCKETS_S = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0),
    *(2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
_ITL_BUCKETS_S = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
    *(5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
_E2E_BUCKETS_S = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0),
    *(60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)


def _no_engine() -> tuple[int, int, float, int]:
    return 0, 0, 0.0, 0


class LlmStats:
    """What an LLM engine counts; its runner bumps the counters and sets ``gauges``."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(_TTFT_BUCKETS_S)
        self.itl = Histogram(_ITL_BUCKETS_S)
        self.e2e = Histogram(_E2E_BUCKETS_S)
        self.gauges: Callable[[], tuple[int, int, float, int]] = _no_engine
        """(running, waiting, KV cache usage 0-1, preemptions so far), read at scrape."""

    def families(self, model: str) -> Iterator[Metric]:
        """The vLLM-named metrics, labelled ``model_name``."""
        running, waiting, usage, preemptions = self.gauges()
        yield from _families(
            GaugeMetricFamily,
            "model_name",
            model,
            ("vllm:num_requests_running", "Requests in model execution batches", running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent usage", usage),
        )
        yield from _families(
            CounterMetricFamily,
            "model_name",
            model,
            ("vllm:num_preemptions", "Cumulative number of preemptions", preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed", self.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens", self.generation_tokens),
        )
        yield from _families(
            HistogramMetricFamily,
            "model_name",
            model,
            ("vllm:time_to_first_token_seconds", "Time to first token in seconds", self.ttft),
            ("vllm:inter_token_latency_seconds", "Inter-token latency in seconds", self.itl),
            ("vllm:e2e_request_latency_seconds", "End-to-end request latency", self.e2e),
        )


class MetricsExporter(Collector):
    """The Prometheus view of one server's ``Stats``, on its own registry."""

    def __init__(
        self,
        model_name: str,
        stats: Stats,
        gauges: Callable[[], tuple[int, int]],
        llm: LlmStats | None = None,
    ) -> None:
        """``gauges()`` returns (requests queued, requests queued or executing); ``llm``:
        the LLM engine's counters, exported under vLLM's names."""
        self._model = model_name
        self._stats = stats
        self._gauges = gauges
        self._llm = llm
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        requests = CounterMetricFamily(
            "fakeserver_requests", "Requests answered, by outcome", labels=["model", "outcome"]
        )
        for outcome, n in s.outcomes.items():
            requests.add_metric([self._model, outcome], n)
        yield requests
        queued, _ = self._gauges()
        queue = ("fakeserver_queue_length", "Requests waiting", queued)
        yield from _families(GaugeMetricFamily, "model", self._model, queue)
        yield from _families(
            HistogramMetricFamily,
            "model",
            self._model,
            ("fakeserver_batch_size", "Rows per executed batch", s.batch_rows),
            ("fakeserver_queue_seconds", "Time a request waited for its batch", s.queue_s),
            ("fakeserver_compute_seconds", "Execution time of a request's batch", s.compute_s),
        )
        if self._llm is not None:
            yield from self._llm.families(self._model)

    def _triton_lines(self) -> str:
        s, (_, pending) = self._stats, self._gauges()
        values = (
            s.success,
            s.failure,
            s.inference_count,
            s.exec_count,
            round(s.request_us),
            round(s.queue_us),
            round(s.compute_us),
            pending,
        )
        lab = f'{{model="{self._model}",version="1"}}'
        return "".join(
            f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name}{lab} {value}\n"
            for (name, kind, doc), value in zip(_TRITON_METRICS, values, strict=True)
        )

    def render(self) -> bytes:
        """The text exposition: this server's registry, then the Triton-named block."""
        return generate_latest(self.registry) + self._triton_lines().encode()
