"""``PlanServer``: a plan served over the Open Inference Protocol v2, HTTP and gRPC.

The pipeline is one model under the plan's name (its inputs: the source task's; its
outputs: every sink task's, named ``TASK.OUTPUT``); each task is also a model of its own
name, batched by the same queue, with its latency budget as the deadline. Each instance
of a task is a worker process bound to its segment. ``/metrics`` serves Prometheus
metrics. It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ridgeline.aio import AsyncService, LoopLag
from ridgeline.clock import Clock, MonotonicClock
from ridgeline.errors import ConfigError, PlanError, RidgelineError
from ridgeline.pipeline.plan import Plan, TaskPlan
from ridgeline.policies.batching import BatchingConfig
from ridgeline.policies.dropping import (
    DROP_MARGIN,
    SLACK_QUANTILE,
    After,
    ExecModel,
    Holdout,
    Slack,
    Trail,
    learn,
)
from ridgeline.policies.queue import DropReason, refuses_request
from ridgeline.serve.backend import Signature
from ridgeline.serve.batcher import TaskQueue
from ridgeline.serve.decoders import DecoderPool, default_decoders
from ridgeline.serve.graph import GraphRunner
from ridgeline.serve.loading import setup_plan
from ridgeline.serve.metrics import InstanceView, ServeMetrics
from ridgeline.serve.mps import MpsDaemons
from ridgeline.serve.workers import Worker
from ridgeline.v2 import describe
from ridgeline.v2.describe import VERSION
from ridgeline.v2.limits import ConnectionLimits, check_port
from ridgeline.v2.security import TlsFiles
from ridgeline.v2.server import DEFAULT_MAX_BODY_BYTES, Served, V2Listeners
from ridgeline.v2.spec import TensorSpec
from ridgeline.v2.tensors import NUMPY_DTYPES, Array

SERVER_NAME = "ridgeline-serve"

HOLDOUT_SEED = 0
"""Seeds the draw of which requests the ``drop_holdout`` keeps from dropping
(``dropping.Holdout``)."""


class _Model:
    """A task or the pipeline, as the v2 server sees it."""

    def __init__(
        self,
        name: str,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        max_batch_size: int,
        batching: BatchingConfig,
        instances: int,
        platform: str,
        clock: Clock,
    ) -> None:
        self.name, self.inputs, self.outputs = name, inputs, outputs
        self.clock = clock
        self.max_batch_size = max_batch_size
        self._batching, self._instances, self._platform = batching, instances, platform
        self.success = self.failure = 0
        self.success_ns = self.failure_ns = 0

    def metadata(self) -> dict[str, Any]:
        return describe.model_metadata(self.name, self._platform, self.inputs, self.outputs)

    def config(self) -> dict[str, Any]:
        b = self._batching.model_copy(update={"max_batch_size": self.max_batch_size})
        return describe.model_config(
            self.name, self._platform, self.inputs, self.outputs, b, self._instances, "KIND_CPU"
        )

    def statistics(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": VERSION,
            "inference_stats": {
                "success": {"count": self.success, "ns": self.success_ns},
                "fail": {"count": self.failure, "ns": self.failure_ns},
            },
        }

    def _count(self, ok: bool, began: float) -> None:
        ns = round((self.clock.now() - began) * 1e9)
        if ok:
            self.success, self.success_ns = self.success + 1, self.success_ns + ns
        else:
            self.failure, self.failure_ns = self.failure + 1, self.failure_ns + ns


class _TaskModel(_Model):
    def __init__(
        self,
        queue: TaskQueue,
        budget_s: float,
        margin: float,
        clock: Clock,
        frontend_s: Callable[[], float],
        **kw: Any,
    ) -> None:
        super().__init__(clock=clock, **kw)
        self.queue, self.budget_s, self.margin = queue, budget_s, margin
        self.frontend_s = frontend_s
        self.slack = Slack()
        """The model's check at arrival, as a pipeline's (``GraphRunner.slack``): it
        borrows where its queue's own checks have no answers yet."""

    async def infer(self, rows: int, arrays: list[Array]) -> list[Array]:
        began = arrival = self.clock.now()
        deadline = arrival + (1 - self.margin) * self.budget_s - self.frontend_s()
        expected, idle = self.queue.expected_s(), self.queue.idle()
        trail: Trail = [(self.slack, arrival, expected)]
        try:
            factor = self.slack.judge(expected)
            if self.queue.core.drop and refuses_request(arrival, deadline, factor * expected, idle):
                await self.queue.refuse(DropReason.LATE)
            out = await self.queue.submit(rows, arrays, deadline, keep=idle, trail=trail)
        except BaseException:
            self._count(False, began)
            raise
        learn(trail, self.clock.now())
        self._count(True, began)
        return out


class _PipelineModel(_Model):
    def __init__(
        self,
        runner: GraphRunner,
        metrics: ServeMetrics,
        drop: bool,
        holdout: float = 0.0,
        **kw: Any,
    ) -> None:
        super().__init__(clock=runner.clock, **kw)
        self.runner, self.metrics, self.drop, self.holdout = runner, metrics, drop, holdout
        self._holdout = Holdout(holdout, HOLDOUT_SEED)
        self.arrivals: deque[float] = deque(maxlen=1 << 16)
        """When recent requests arrived (the reconfiguration controller's demand)."""

    async def infer(self, rows: int, arrays: list[Array]) -> list[Array]:
        began = self.clock.now()
        self.arrivals.append(began)
        m = self.metrics
        droppable = self.drop and not self._holdout.keeps()
        try:
            out = await self.runner.infer(rows, arrays, drop=droppable)
        except RidgelineError as e:
            kind = getattr(e, "kind", "internal")
            outcome = "dropped" if kind == "dropped" else "error"
            m.pipeline_requests.labels(self.name, outcome).inc()
            self._outcome(droppable, outcome)
            self._count(False, began)
            raise
        took = self.clock.now() - began
        m.pipeline_requests.labels(self.name, "ok").inc()
        m.pipeline_latency.labels(self.name).observe(took)
        m.drop_slack.labels(self.name).set(self.runner.slack.last)
        late = took > self.runner.plan.slo_ms / 1000.0
        self._outcome(droppable, "late" if late else "on_time")
        self._count(True, began)
        return out

    def _outcome(self, droppable: bool, outcome: str) -> None:
        arm = "droppable" if droppable else "kept"
        self.metrics.pipeline_outcomes.labels(self.name, arm, outcome).inc()


def _instance_view(task: str, index: int, worker: Worker) -> InstanceView:
    return InstanceView(task, index, lambda: worker.busy_s, lambda: worker.restarts)


def _signature(tensors: Sequence[TensorSpec]) -> list[tuple[str, str]]:
    return [(t.name, t.datatype) for t in tensors]


class PlanServer(AsyncService):
    """Serve ``plan``: ``await start()``, then ``stop()`` (or ``async with``)."""

    def __init__(
        self,
        plan: Plan,
        plan_dir: Path | str = ".",
        *,
        host: str = "127.0.0.1",
        http_port: int = 8000,
        grpc_port: int | None = 8001,
        token: str | None = None,
        zoo: Path | None = None,
        drop: bool = True,
        drop_margin: float = DROP_MARGIN,
        drop_holdout: float = 0.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        limits: ConnectionLimits | None = None,
        tls: TlsFiles | None = None,
        clock: Clock | None = None,
        decoders: int | None = None,
    ) -> None:
        self.plan, self.plan_dir, self.host = plan, Path(plan_dir), host
        if decoders is not None and decoders < 0:
            raise ConfigError(
                f"decoders is {decoders}; give 0 (decode request bodies on the event loop) "
                "or the number of decoder processes"
            )
        self.decoders = DecoderPool(default_decoders() if decoders is None else decoders)
        """Processes decoding large v2 JSON bodies beside the event loop (``decoders``)."""
        self.limits, self.tls = limits or ConnectionLimits(), tls
        self.token, self.zoo, self.drop, self.max_body = token, zoo, drop, max_body_bytes
        self.drop_margin = drop_margin
        if not 0.0 <= drop_holdout < 1.0:
            raise ConfigError(
                f"drop holdout is {drop_holdout:g}; give the share of requests to keep from "
                "dropping, at least 0 and below 1 (0: none; to drop none, serve with --no-drop)"
            )
        self.drop_holdout = drop_holdout
        """The share of requests, drawn at random in blocks of neighbours
        (``dropping.Holdout``), never dropped: an A/B holdout whose
        outcomes (``ridgeline_pipeline_slo_outcomes``, arm ``kept``) say what the
        dropped requests would have done, on this host and this traffic."""
        check_port(http_port, "HTTP port")
        if grpc_port is not None:
            check_port(grpc_port, "gRPC port")
        self._want_http, self._want_grpc = http_port, grpc_port
        self.clock = clock or MonotonicClock()
        self._started_at = self.clock.now()
        self.metrics = ServeMetrics(lambda: self.clock.now() - self._started_at)
        self.workers: dict[str, list[Worker]] = {}
        self.queues: dict[str, TaskQueue] = {}
        self.models: dict[str, _TaskModel | _PipelineModel] = {}
        self._listeners: V2Listeners | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._generation = 0
        """How many times a task was replaced live (``replace``): names its workers."""
        self._mps = MpsDaemons({}, None)
        """The MPS control daemons of the plan's MPS segments (none without them)."""
        self.loop_lag = LoopLag()
        """The event loop's lateness: a low quantile of it kept back from every drop
        deadline, twice (a request waits for the loop on its way in and on its way out;
        ``_frontend_s``)."""
        for q in (0.5, 0.99):
            self.metrics.loop_lag.labels(f"{q:g}").set_function(partial(self.loop_lag.quantile, q))
        pool = self.decoders
        self.metrics.bodies.labels("decoder").set_function(lambda: pool.decoded_off_loop)
        self.metrics.bodies.labels("loop").set_function(lambda: pool.decoded_inline)
        self.metrics.decoder_restarts.set_function(lambda: pool.restarts)
        self.metrics.decoders.set_function(lambda: pool.alive)

    def _frontend_s(self) -> float:
        """Kept back from every drop deadline: the loop's lateness at its low quantile
        (``SLACK_QUANTILE``), twice (in and out). A drop must be nearly sure, and a
        request that waits less for the loop than that is rare; its p99 kept back
        dropped what would have made it: the example plan at a tight SLO (36 ms) had
        30 ms left after 6 ms of loop lateness, and the requests its drop rule would
        have dropped came in at a median 31.6 ms, 7 % of them past the SLO."""
        return 2 * self.loop_lag.quantile(SLACK_QUANTILE)

    async def start(self) -> None:
        """Start every worker (models loaded), then the front ends."""
        setups = setup_plan(self.plan, self.plan_dir, self.zoo)
        self.loop_lag.start()
        try:
            self._mps, placed = MpsDaemons.start({n: s.placements for n, s in setups.items()})
            for name, setup in setups.items():
                self.workers[name] = [
                    Worker(setup.backend, p, name=f"{name}#{i}") for i, p in enumerate(placed[name])
                ]
            await asyncio.gather(
                self.decoders.start(),
                *(w.start() for ws in self.workers.values() for w in ws),
            )
            self._build()
            await asyncio.gather(*(self._warm(name) for name in self.plan.tasks))
            await self._listen()
        except BaseException:
            await self.stop()
            raise

    def _build(self) -> None:
        plan, clock = self.plan, self.clock
        for name, task in plan.tasks.items():
            ws = self.workers[name]
            sig = ws[0].signature
            assert sig is not None
            after = [e.target for e in plan.children(name)]

            def remaining(
                ahead_rows: float = 0.0, elapsed_s: float = 0.0, /, after: list[str] = after
            ) -> float:
                paths = (self.queues[t].expected_s(ahead_rows, elapsed_s) for t in after)
                return max(paths, default=0.0)

            self.queues[name] = self._queue(name, task, sig, ws, remaining)
            batching = self.queues[name].cfg
            for i, w in enumerate(ws):
                self.metrics.add_instance(_instance_view(name, i, w))
            self.models[name] = _TaskModel(
                self.queues[name],
                task.latency_budget_ms / 1000.0,
                self.drop_margin,
                clock,
                self._frontend_s,
                name=name,
                inputs=sig.inputs,
                outputs=sig.outputs,
                max_batch_size=task.batch_size,
                batching=batching,
                instances=task.instances,
                platform="onnxruntime_onnx" if sig else "ridgeline",
            )
        runner = GraphRunner(plan, self.queues, clock, self.drop_margin, self._frontend_s)
        sources = [self.queues[s] for s in runner.sources]
        first = sources[0]
        for q in sources[1:]:
            if [(t.name, t.datatype) for t in q.inputs] != [
                (t.name, t.datatype) for t in first.inputs
            ]:
                raise PlanError(
                    f"source tasks {first.name!r} and {q.name!r} take different inputs; a "
                    "pipeline's sources must share one input signature"
                )
        outputs = tuple(
            TensorSpec(f"{s}.{t.name}", t.datatype, (-1, *t.shape[1:]))
            for s in runner.sinks
            for t in self.queues[s].outputs
        )
        self.models[plan.name] = _PipelineModel(
            runner,
            self.metrics,
            self.drop,
            self.drop_holdout,
            name=plan.name,
            inputs=tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in first.inputs),
            outputs=outputs,
            max_batch_size=max(q.cfg.max_batch_size for q in sources) * 16,
            batching=first.cfg,
            instances=1,
            platform="ridgeline_pipeline",
        )

    async def _warm(self, name: str) -> None:
        """Batches of zeros through each instance of ``name`` before serving."""
        for worker in self.workers[name]:
            await self._warm_one(self.queues[name], worker)

    async def _warm_one(self, queue: TaskQueue, worker: Worker) -> None:
        """The first run of a model is slow (allocation, kernels), and the warm times of
        one row and of a full batch are the drop policy's first execution model."""
        full = queue.cfg.max_batch_size
        await worker.run(self._zeros(queue, full))  # cold
        times = {}
        for rows in (1, full):
            began = self.clock.now()
            await worker.run(self._zeros(queue, rows))
            times[rows] = self.clock.now() - began
        model = ExecModel.from_warmup(times[1], full, times[full])
        if model.time(full) > queue.core.exec.time(full):
            queue.core.exec = model

    @property
    def arrivals(self) -> deque[float]:
        """When the pipeline's recent requests arrived (clock time)."""
        model = self.models[self.plan.name]
        assert isinstance(model, _PipelineModel)
        return model.arrivals

    def set_queue_delay(self, name: str, delay_ms: float) -> None:
        """Task ``name`` batches with this queue delay from now on."""
        queue = self.queues[name]
        queue.core.cfg = queue.cfg.model_copy(update={"max_queue_delay_s": delay_ms / 1000.0})
        task = self.plan.tasks[name].model_copy(update={"max_queue_delay_ms": delay_ms})
        self.plan = self.plan.model_copy(update={"tasks": {**self.plan.tasks, name: task}})

    async def scale(self, name: str, instances: int) -> None:
        """Run ``instances`` instances of task ``name``, live: new workers start and warm
        up before they take batches; retired ones finish their batch in flight, then
        stop. What is queued is served by the others; no request is lost."""
        if instances < 1:
            raise PlanError(f"task {name!r}: {instances} instances; a task needs at least 1")
        queue, workers = self.queues[name], self.workers[name]
        active = [i for i in range(len(workers)) if i not in queue.retired]
        task = self.plan.tasks[name]
        if instances > len(active):
            grown = task.model_copy(update={"instances": len(workers) + instances - len(active)})
            plan = self.plan.model_copy(update={"tasks": {**self.plan.tasks, name: grown}})
            setup = setup_plan(plan, self.plan_dir, self.zoo)[name]
            new = [
                Worker(setup.backend, p, name=f"{name}#{i}")
                for i, p in enumerate(setup.placements)
                if i >= len(workers)
            ]
            await asyncio.gather(*(w.start() for w in new))
            for w in new:
                await self._warm_one(queue, w)
            for w in new:
                workers.append(w)
                queue.add_instance(w)
                self.metrics.add_instance(_instance_view(name, len(workers) - 1, w))
        for slot in reversed(active[instances:]):
            await queue.retire(slot)
            await workers[slot].stop()
        update = {"instances": instances}
        self.plan = self.plan.model_copy(
            update={"tasks": {**self.plan.tasks, name: task.model_copy(update=update)}}
        )

    async def replace(self, name: str, task: TaskPlan) -> None:
        """Run task ``name`` as ``task`` (another variant, segment or batching), live: its
        workers start and warm up beside the running ones; then new requests to the task
        go to its queue, the old queue serves what it holds, and its workers stop. No
        request is lost. The task's outputs must keep their names and types (its
        answers are the pipeline's, or its children's inputs are made from them)."""
        old_queue, old_workers = self.queues[name], self.workers[name]
        plan = self.plan.model_copy(update={"tasks": {**self.plan.tasks, name: task}})
        setup = setup_plan(plan, self.plan_dir, self.zoo)[name]
        self._generation += 1
        workers = [
            Worker(setup.backend, p, name=f"{name}#{i}.{self._generation}")
            for i, p in enumerate(setup.placements)
        ]
        try:
            await asyncio.gather(*(w.start() for w in workers))
            sig = workers[0].signature
            assert sig is not None
            if [(t.name, t.datatype) for t in sig.outputs] != [
                (t.name, t.datatype) for t in old_queue.outputs
            ]:
                raise PlanError(
                    f"task {name!r}: the new configuration's outputs differ from the running "
                    "one's; a live server cannot change what a task answers, serve it afresh"
                )
            queue = self._queue(name, task, sig, workers, old_queue.remaining_after)
            for w in workers:
                await self._warm_one(queue, w)
        except BaseException:
            await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
            raise
        self.queues[name], self.workers[name], self.plan = queue, workers, plan
        model = self.models[name]
        if isinstance(model, _TaskModel):
            model.queue = queue
        for i, w in enumerate(workers):
            self.metrics.add_instance(_instance_view(name, i, w))
        await old_queue.drain()
        await asyncio.gather(*(w.stop() for w in old_workers), return_exceptions=True)

    def _queue(
        self,
        name: str,
        task: TaskPlan,
        sig: Signature,
        workers: Sequence[Worker],
        remaining: After,
    ) -> TaskQueue:
        """Task ``name``'s queue over ``workers``, batching as ``task`` says."""
        batching = BatchingConfig(
            max_batch_size=task.batch_size,
            max_queue_delay_s=task.max_queue_delay_ms / 1000.0,
            preferred_batch_sizes=task.preferred_batch_sizes,
        )
        return TaskQueue(
            name,
            sig.inputs,
            sig.outputs,
            batching,
            workers,
            self.clock,
            self.metrics,
            remaining,
            self.drop,
        )

    @staticmethod
    def _zeros(queue: TaskQueue, rows: int) -> dict[str, Array]:
        return {
            t.name: np.zeros((rows, *(max(d, 1) for d in t.shape[1:])), NUMPY_DTYPES[t.datatype])
            for t in queue.inputs
        }

    async def _listen(self) -> None:
        served = Served(self.models, SERVER_NAME, self.max_body)
        listeners = self._listeners = V2Listeners(
            served, self.host, self.token, self.limits, self.tls
        )
        app = listeners.app(metrics=self.metrics.render, decode=self.decoders)
        self.http_port, self.grpc_port = await listeners.start(
            app, self._want_http, self._want_grpc
        )

    async def stop(self) -> None:
        """Take no new request, answer those in flight (``DRAIN_S`` at most: SIGTERM
        under load closed 1-17 requests without an answer), then refuse what is still
        queued, finish running batches, stop workers; safe to call twice."""
        if self._listeners is not None:
            await self._listeners.drain(DRAIN_S)
        for q in self.queues.values():
            await q.close()
        if self._listeners is not None:
            await self._listeners.stop()
            self._listeners = None
        await asyncio.gather(
            self.decoders.stop(),
            *(w.stop() for ws in self.workers.values() for w in ws),
            return_exceptions=True,
        )
        self._mps.stop()  # after its clients
        await self.loop_lag.stop()

    @property
    def http_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'http' if self.tls is None else 'https'}://{host}:{self.http_port}"

    def model_url(self, model: str | None = None) -> str:
        return f"{self.http_url}/v2/models/{model or self.plan.name}"


DRAIN_S = 10.0
"""How long a stopping server waits for the requests in flight to be answered before it
closes their connections (Kubernetes waits 30 s after SIGTERM by default)."""


def serve_plan_forever(
    plan_path: Path | str, *, announce: Callable[[str], None] = print, **options: Any
) -> None:
    """Serve the plan at ``plan_path`` until SIGINT or SIGTERM; ``announce`` the URLs.
    ``options`` are ``PlanServer``'s (host, ports, token, zoo, drop, ...)."""
    from ridgeline.aio import serve_until_signal
    from ridgeline.pipeline.plan import load_plan

    plan = load_plan(plan_path)

    def ready(server: PlanServer) -> None:
        tls = "" if server.tls is None else ", TLS"
        grpc = f"{server.host}:{server.grpc_port} (model {plan.name!r}{tls})"
        lines = [
            f"serving plan {plan.name!r}: v2 HTTP {server.model_url()}",
            *([f"  v2 gRPC  {grpc}"] if server.grpc_port is not None else []),
            f"  tasks    {', '.join(plan.tasks)} (each also a model)",
            f"  metrics  {server.http_url}/metrics",
        ]
        announce("\n".join(lines))

    serve_until_signal(lambda: PlanServer(plan, Path(plan_path).parent, **options), ready)
