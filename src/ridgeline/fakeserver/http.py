"""Open Inference Protocol v2 over HTTP (KServe v2 / Triton), as an aiohttp app.

Routes: ``/v2/health/{live,ready}``, ``/v2`` (server metadata), ``/v2/models/NAME``
(metadata), ``.../ready``, ``.../config`` (Triton model config), ``.../stats`` (Triton
statistics), ``.../infer`` (each also under ``/versions/1``), ``POST
/v2/repository/index``, ``GET /metrics``, and the OpenAI routes of ``openai.py``.

Infer takes JSON tensors or Triton's binary tensor extension: the body is the JSON
header (``Inference-Header-Content-Length`` bytes) then each input with a
``binary_data_size`` parameter, in order. Outputs come back binary when asked
(``binary_data_output`` for all, ``binary_data`` per output), with the same header.
Errors are ``{"error": "..."}``: 400 bad request, 401 bad token, 404 unknown model,
413 body too large, 500 injected error, 503 queue full.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from ridgeline.errors import InvalidRequest
from ridgeline.fakeserver import _describe, openai
from ridgeline.fakeserver.engine import BatchingEngine, Outcome, Status
from ridgeline.fakeserver.llm import LlmRunner
from ridgeline.fakeserver.metrics import METRICS_CONTENT_TYPE, MetricsExporter
from ridgeline.synthetic.model import LatencyModel
from ridgeline.synthetic.outputs import compute_outputs
from ridgeline.v2.connections import ConnectionGuard, guard_middleware, read_body
from ridgeline.v2.http_codec import (
    HEADER_LENGTH,
    Answer,
    InferRequest,
    decode_body,
    error_answer,
    infer_answer,
)
from ridgeline.v2.server import add_routes, auth_middleware

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def error_response(message: str, status: int) -> web.Response:
    return json_response({"error": message}, status)


class _V2Routes:
    def __init__(
        self,
        model: LatencyModel,
        engine: BatchingEngine,
        exporter: MetricsExporter,
        max_body: int,
        guard: ConnectionGuard | None,
    ) -> None:
        self.model, self.engine, self.exporter, self.max_body = model, engine, exporter, max_body
        self.guard = guard
        self._stats = engine.stats
        self.core = InferCore(model, engine, max_body)

    def _unknown(self, request: web.Request) -> web.Response | None:
        name = request.match_info["name"]
        version = request.match_info.get("version", _describe.VERSION)
        if name == self.model.name and version == _describe.VERSION:
            return None
        self._stats.finish("not_found")
        return error_response(
            f"unknown model {name!r} version {version}; this server serves "
            f"{self.model.name!r} version {_describe.VERSION}",
            404,
        )

    async def live(self, request: web.Request) -> web.Response:
        return json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        return json_response({"ready": True})

    async def server(self, request: web.Request) -> web.Response:
        return json_response(_describe.server_metadata())

    async def metadata(self, request: web.Request) -> web.Response:
        return self._unknown(request) or json_response(_describe.model_metadata(self.model))

    async def model_ready(self, request: web.Request) -> web.Response:
        return self._unknown(request) or json_response({"name": self.model.name, "ready": True})

    async def config(self, request: web.Request) -> web.Response:
        return self._unknown(request) or json_response(_describe.model_config(self.model))

    async def stats(self, request: web.Request) -> web.Response:
        if "name" in request.match_info and (missing := self._unknown(request)):
            return missing
        return json_response(_describe.model_statistics(self.model, self._stats))

    async def index(self, request: web.Request) -> web.Response:
        return json_response(_describe.repository_index(self.model))

    async def metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.exporter.render())
        resp.headers["Content-Type"] = METRICS_CONTENT_TYPE
        return resp

    async def infer(self, request: web.Request) -> web.Response:
        began = time.perf_counter()
        if missing := self._unknown(request):
            return missing
        body = await read_body(request, self.max_body, self.guard)
        if isinstance(body, Answer):
            return _web(self.core.too_large() if body.status == 413 else body)
        step = self.core.begin(body, request.headers.get(HEADER_LENGTH), began)
        if isinstance(step, Answer):
            return _web(step)
        outcome = step.waiting if isinstance(step.waiting, Outcome) else await step.waiting
        return _web(self.core.finish(step, outcome))


@dataclass(frozen=True, slots=True)
class InFlight:
    """An infer request handed to the engine, waiting for its batch."""

    req: InferRequest
    rows: int
    arrays: list[Any]
    began: float
    waiting: Outcome | asyncio.Future[Outcome]


class InferCore:
    """The v2 infer route without a server library: parse and validate a body, submit it
    to the engine, and turn the outcome into an ``Answer``. Shared by the aiohttp route
    and the fast path of ``_fastpath.py``."""

    def __init__(self, model: LatencyModel, engine: BatchingEngine, max_body: int) -> None:
        self.model, self.engine, self.max_body = model, engine, max_body
        self.stats = engine.stats

    def too_large(self) -> Answer:
        self.stats.finish("too_large")
        return error_answer(f"request body over the server's bound of {self.max_body} bytes", 413)

    def begin(self, body: bytes, header_length: str | None, began: float) -> Answer | InFlight:
        """An answer at once (a bad request), or the request in flight."""
        try:
            d = decode_body(self.model, body, header_length, self.max_body)
        except InvalidRequest as e:
            self.stats.finish("invalid")
            return error_answer(str(e), 400)
        return InFlight(d.request, d.rows, d.arrays, began, self.engine.submit_nowait(d.rows))

    def finish(self, flight: InFlight, outcome: Outcome) -> Answer:
        """The answer once the engine has decided ``outcome``."""
        if outcome.status is not Status.OK:
            self.stats.finish(outcome.status.value, time.perf_counter() - flight.began)
            return error_answer(outcome.detail, 503 if outcome.status is Status.REJECTED else 500)
        outputs = compute_outputs(self.model, flight.rows, flight.arrays)
        answer = infer_answer(self.model, flight.req, outputs, _describe.VERSION)
        self.stats.finish("ok", time.perf_counter() - flight.began)
        return answer


def _web(answer: Answer) -> web.Response:
    resp = web.Response(body=answer.body, status=answer.status, content_type=answer.content_type)
    if answer.header_length is not None:
        resp.headers[HEADER_LENGTH] = str(answer.header_length)
    return resp


def build_app(
    model: LatencyModel,
    engine: BatchingEngine,
    exporter: MetricsExporter,
    *,
    token: str | None,
    max_body_bytes: int,
    guard: ConnectionGuard | None = None,
    llm: LlmRunner | None = None,
) -> web.Application:
    """The aiohttp app serving v2, metrics and OpenAI routes for one model; ``guard``
    times its connections (``v2.connections``); ``llm`` answers the OpenAI routes when
    the model has an LLM engine."""
    middlewares = [] if guard is None else [guard_middleware(guard)]
    if token is not None:
        middlewares.append(auth_middleware(token, engine.stats.finish))
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    r = _V2Routes(model, engine, exporter, max_body_bytes, guard)
    add_routes(app.router, r)
    app.router.add_get("/metrics", r.metrics)
    openai.add_routes(app, model, engine, guard, llm)
    return app
