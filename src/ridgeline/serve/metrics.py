"""Prometheus metrics of a served plan, on the server's own registry.

Per task: requests, rows, batches and their sizes, queue time, compute time, drops,
errors; per instance: utilisation (busy fraction since start) and restarts; per
pipeline: requests and end-to-end latency by outcome; per pipeline: the drop decision's slack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True, slots=True)
class InstanceView:
    task: str
    instance: int
    busy_s: Callable[[], float]
    restarts: Callable[[], int]


class _Instances(Collector):
    def __init__(self, uptime_s: Callable[[], float]) -> None:
        self.views: list[InstanceView] = []
        self._uptime = uptime_s

    def collect(self) -> Iterator[Metric]:
        util = GaugeMetricFamily(
            "ridgeline_instance_utilisation",
            "Fraction of time since start the instance spent executing batches",
            labels=["task", "instance"],
        )
        restarts = GaugeMetricFamily(
            "ridgeline_instance_restarts",
            "Times the instance's worker was restarted after a crash",
            labels=["task", "instance"],
        )
        up = max(self._uptime(), 1e-9)
        for v in self.views:
            labels = [v.task, str(v.instance)]
            util.add_metric(labels, min(1.0, v.busy_s() / up))
            restarts.add_metric(labels, float(v.restarts()))
        yield util
        yield restarts


class ServeMetrics:
    """Every metric of one server."""

    def __init__(self, uptime_s: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ridgeline_task_requests", "Requests to a task", ["task"], registry=r
        )
        self.rows = Counter(
            "ridgeline_task_rows", "Rows (inferences) a task executed", ["task"], registry=r
        )
        self.batch_size = Histogram(
            "ridgeline_task_batch_size",
            "Rows per executed batch",
            ["task"],
            buckets=_SIZES,
            registry=r,
        )
        self.queue_s = Histogram(
            "ridgeline_task_queue_seconds",
            "Time from joining a task's queue to its batch's start",
            ["task"],
            buckets=_SECONDS,
            registry=r,
        )
        self.compute_s = Histogram(
            "ridgeline_task_compute_seconds",
            "Execution time of a batch",
            ["task"],
            buckets=_SECONDS,
            registry=r,
        )
        self.drops = Counter(
            "ridgeline_task_dropped",
            "Requests dropped early: they could not meet the SLO",
            ["task"],
            registry=r,
        )
        self.errors = Counter(
            "ridgeline_task_errors", "Requests a task failed", ["task"], registry=r
        )
        self.pipeline_requests = Counter(
            "ridgeline_pipeline_requests",
            "Requests to a pipeline by outcome",
            ["pipeline", "outcome"],
            registry=r,
        )
        self.pipeline_outcomes = Counter(
            "ridgeline_pipeline_slo_outcomes",
            "Requests to a pipeline by whether they could be dropped (arm: droppable, or kept "
            "as the --drop-holdout share and with dropping off) and how they ended against "
            "the SLO, timed from their arrival at the server: on_time, late, dropped, error",
            ["pipeline", "arm", "outcome"],
            registry=r,
        )
        self.pipeline_latency = Histogram(
            "ridgeline_pipeline_latency_seconds",
            "End-to-end latency of answered pipeline requests",
            ["pipeline"],
            buckets=_SECONDS,
            registry=r,
        )
        self.drop_slack = Gauge(
            "ridgeline_drop_slack_ratio",
            "How many times longer than expected answers take (a low quantile, "
            "SLACK_QUANTILE), among answers expected about as long as the latest request; "
            "its drop decision scaled its expectation by it",
            ["model"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "ridgeline_event_loop_lag_seconds",
            "How late the server's event loop runs what is ready (its batching timers, the "
            "requests it reads): recent quantiles of a 5 ms probe timer's lateness",
            ["quantile"],
            registry=r,
        )
        self.bodies = Gauge(
            "ridgeline_request_bodies_decoded",
            "Infer bodies decoded since start, by where: a decoder process (large v2 JSON "
            "bodies) or the event loop (small ones, and all with --decoders 0)",
            ["where"],
            registry=r,
        )
        self.decoder_restarts = Gauge(
            "ridgeline_decoder_restarts",
            "Decoder processes replaced after they died",
            registry=r,
        )
        self.decoders = Gauge(
            "ridgeline_decoders",
            "Decoder processes running now: fewer than started once a replacement could "
            "not start; at 0 the event loop decodes every body",
            registry=r,
        )
        self._instances = _Instances(uptime_s)
        r.register(self._instances)

    def add_instance(self, view: InstanceView) -> None:
        self._instances.views.append(view)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
