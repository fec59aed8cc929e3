"""A multi-model Open Inference Protocol v2 server: HTTP (aiohttp) and gRPC (grpc.aio,
Triton's ``GRPCInferenceService`` as tritonclient ships it), over any ``V2Model``.

HTTP routes: ``/v2/health/{live,ready}``, ``/v2`` (server metadata), ``POST
/v2/repository/index``, and per model ``/v2/models/NAME`` (metadata), ``.../ready``,
``.../config`` (Triton model config), ``.../stats``, ``POST .../infer`` (each also under
``/versions/1``), plus ``GET /metrics`` when given. gRPC: ServerLive, ServerReady,
ModelReady, ServerMetadata, ModelMetadata, ModelConfig, ModelStatistics,
RepositoryIndex, ModelInfer. So tritonclient and perf_analyzer drive it unchanged.

It is the one v2 server side: the serving runtime and the fake server both serve their
models through these handlers, each model a ``V2Model``; ``Served`` says what a server
serves (and counts what it refuses), ``V2Listeners`` starts its HTTP and gRPC listeners.

Failures: a bad request (a field of the wrong type, an element its datatype cannot hold,
a declared shape that would decode past the body bound, a gRPC message protobuf cannot
parse) is 400 / INVALID_ARGUMENT, an unknown model 404 / NOT_FOUND, a
body over the bound 413 / RESOURCE_EXHAUSTED, a request the server drops because it can
no longer meet its SLO 503 / UNAVAILABLE with a message starting "dropped", other
refusals 503 / UNAVAILABLE, a failed execution 500 / INTERNAL, a bad token 401 /
UNAUTHENTICATED. Every endpoint needs ``Authorization: Bearer TOKEN`` when a token is set.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from ridgeline._version import __version__
from ridgeline.errors import ConfigError, InferFailed, InvalidRequest
from ridgeline.v2.connections import (
    ConnectionGuard,
    Front,
    HttpListener,
    guard_middleware,
    read_body,
)
from ridgeline.v2.describe import VERSION
from ridgeline.v2.grpc_codec import decode_request, encode_response
from ridgeline.v2.http_codec import (
    HEADER_LENGTH,
    Answer,
    BodyDecoder,
    decode_inline,
    error_answer,
    infer_answer,
)
from ridgeline.v2.limits import ConnectionLimits
from ridgeline.v2.security import TlsFiles, check_token
from ridgeline.v2.spec import ModelSpec
from ridgeline.v2.tensors import Array

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request body (HTTP) or message (gRPC) a v2 server takes by default."""


class V2Model(ModelSpec, Protocol):
    """What the server needs of a model."""

    def metadata(self) -> dict[str, Any]: ...

    def config(self) -> dict[str, Any]: ...

    def statistics(self) -> dict[str, Any]: ...

    async def infer(self, rows: int, arrays: list[Array]) -> list[Array]:
        """The outputs, in the order of ``outputs``; raises ``InferFailed``."""
        ...


EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")
"""The v2 extensions a server names in its metadata."""

Refused = Callable[[str], None]
"""Told of each request refused before a model saw it: ``"unauthorized"``,
``"not_found"``, ``"invalid"`` or ``"too_large"`` (what the fake server counts)."""


@dataclass(frozen=True, slots=True)
class Served:
    """What a v2 server serves, as its HTTP routes and its gRPC service both see it."""

    models: Mapping[str, V2Model]
    name: str
    """The server's name in its metadata."""
    max_bytes: int = DEFAULT_MAX_BODY_BYTES
    """The largest request body (HTTP) or message (gRPC) taken."""
    extensions: tuple[str, ...] = EXTENSIONS
    on_refusal: Refused | None = None

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "version": __version__, "extensions": list(self.extensions)}

    def index(self) -> list[dict[str, Any]]:
        return [{"name": n, "version": VERSION, "state": "READY"} for n in self.models]

    def model(self, name: str, version: str) -> V2Model | str:
        """The model of that name and version, or why there is none (counted)."""
        model = self.models.get(name)
        if model is not None and version == VERSION:
            return model
        self.refused("not_found")
        return (
            f"unknown model {name!r} version {version}; this server serves "
            f"{sorted(self.models)} version {VERSION}"
        )

    def refused(self, why: str) -> None:
        if self.on_refusal is not None:
            self.on_refusal(why)


_HTTP_STATUS = {"dropped": 503, "unavailable": 503, "internal": 500}
_GRPC_CODE = {
    "dropped": grpc.StatusCode.UNAVAILABLE,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "internal": grpc.StatusCode.INTERNAL,
}


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def _web(answer: Answer) -> web.Response:
    resp = web.Response(body=answer.body, status=answer.status, content_type=answer.content_type)
    if answer.header_length is not None:
        resp.headers[HEADER_LENGTH] = str(answer.header_length)
    return resp


def failure_answer(error: InferFailed) -> Answer:
    """The HTTP answer to a request its model could not answer: 503 dropped or
    unavailable, 500 internal."""
    return error_answer(str(error), _HTTP_STATUS[error.kind])


class RequestLog(logging.LoggerAdapter[logging.Logger]):
    """An HTTP server's log (aiohttp's ``logger``, and the fake server's fast path): a
    malformed request is one line at debug, for a client can send them by the thousand;
    a fault of the server's own keeps its traceback the first time each exception type is
    seen, and is one line after that."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})
        self._seen: set[type[BaseException]] = set()

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kw: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else None
        if exc is None or isinstance(exc, HttpProcessingError):
            self.debug(f"{msg}: %s", *args, _one_line(exc), **kw)
        elif type(exc) in self._seen:
            self.error(f"{msg}: %s: %s", *args, type(exc).__name__, _one_line(exc), **kw)
        else:
            self._seen.add(type(exc))
            self.error(msg, *args, exc_info=exc, **kw)


def _one_line(exc: BaseException | None) -> str:
    return " ".join(str(exc).split())[:200] if exc is not None else "no detail"


def request_log() -> RequestLog:
    """A fresh ``RequestLog`` over the ``ridgeline.v2.http`` logger, for one server."""
    return RequestLog(logging.getLogger("ridgeline.v2.http"))


class _Routes:
    def __init__(
        self, served: Served, guard: ConnectionGuard | None, decode: BodyDecoder = decode_inline
    ) -> None:
        self.served, self.models, self.guard, self.decode = served, served.models, guard, decode

    def _model(self, request: web.Request) -> V2Model:
        name = request.match_info["name"]
        model = self.served.model(name, request.match_info.get("version", VERSION))
        if isinstance(model, str):
            raise web.HTTPNotFound(
                text=orjson.dumps({"error": model}).decode(), content_type="application/json"
            )
        return model

    async def live(self, request: web.Request) -> web.Response:
        return _json({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        return _json({"ready": True})

    async def server(self, request: web.Request) -> web.Response:
        return _json(self.served.metadata())

    async def index(self, request: web.Request) -> web.Response:
        return _json(self.served.index())

    async def metadata(self, request: web.Request) -> web.Response:
        return _json(self._model(request).metadata())

    async def model_ready(self, request: web.Request) -> web.Response:
        return _json({"name": self._model(request).name, "ready": True})

    async def config(self, request: web.Request) -> web.Response:
        return _json(self._model(request).config())

    async def stats(self, request: web.Request) -> web.Response:
        if "name" in request.match_info:
            return _json({"model_stats": [self._model(request).statistics()]})
        return _json({"model_stats": [m.statistics() for m in self.models.values()]})

    async def infer(self, request: web.Request) -> web.Response:
        model = self._model(request)
        max_bytes = self.served.max_bytes
        body = await read_body(request, max_bytes, self.guard)
        if isinstance(body, Answer):
            if body.status == 413:
                self.served.refused("too_large")
            return _web(body)
        try:
            decoded = await self.decode(model, body, request.headers.get(HEADER_LENGTH), max_bytes)
        except InvalidRequest as e:
            self.served.refused("invalid")
            return _web(error_answer(str(e), 400))
        except InferFailed as e:  # the decoder could not (its process died)
            return _web(failure_answer(e))
        try:
            outputs = await model.infer(decoded.rows, decoded.arrays)
        except InferFailed as e:
            return _web(failure_answer(e))
        return _web(infer_answer(model, decoded.request, outputs, VERSION))


class RouteHandlers(Protocol):
    """The handlers of the v2 HTTP routes (``add_routes`` maps paths to them)."""

    async def live(self, request: web.Request) -> web.Response: ...
    async def ready(self, request: web.Request) -> web.Response: ...
    async def server(self, request: web.Request) -> web.Response: ...
    async def index(self, request: web.Request) -> web.Response: ...
    async def metadata(self, request: web.Request) -> web.Response: ...
    async def model_ready(self, request: web.Request) -> web.Response: ...
    async def config(self, request: web.Request) -> web.Response: ...
    async def stats(self, request: web.Request) -> web.Response: ...
    async def infer(self, request: web.Request) -> web.Response: ...


def add_routes(router: web.UrlDispatcher, r: RouteHandlers) -> None:
    """The v2 HTTP route table: health, server metadata, repository index, and per model
    (also under ``/versions/{version}``) metadata, ready, config, stats and infer. The
    router tries resources in order, so the hot route comes first."""
    router.add_post("/v2/models/{name}/infer", r.infer)
    router.add_get("/v2/health/live", r.live)
    router.add_get("/v2/health/ready", r.ready)
    router.add_get("/v2", r.server)
    router.add_post("/v2/repository/index", r.index)
    router.add_get("/v2/models/stats", r.stats)
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        router.add_get(base, r.metadata)
        router.add_get(base + "/ready", r.model_ready)
        router.add_get(base + "/config", r.config)
        router.add_get(base + "/stats", r.stats)
        if "version" in base:
            router.add_post(base + "/infer", r.infer)


def auth_middleware(token: str, on_deny: Callable[[str], None] | None = None) -> Any:
    """aiohttp middleware: every request needs ``Authorization: Bearer TOKEN`` (401
    otherwise; ``on_deny("unauthorized")`` counts it)."""
    expected = f"Bearer {check_token(token)}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.getall("Authorization", [])
        if len(given) != 1 or not hmac.compare_digest(given[0].encode(), expected):
            if on_deny is not None:
                on_deny("unauthorized")
            why = (
                "two Authorization headers; send one"
                if len(given) > 1
                else "missing or wrong bearer token; send Authorization: Bearer"
            )
            resp = _json({"error": why}, 401)
            resp.headers["WWW-Authenticate"] = "Bearer"
            return resp
        return await handler(request)

    return auth


def build_http_app(
    served: Served,
    *,
    token: str | None,
    metrics: Callable[[], tuple[bytes, str]] | None = None,
    guard: ConnectionGuard | None = None,
    decode: BodyDecoder = decode_inline,
) -> web.Application:
    """The aiohttp app serving ``served``; ``metrics`` renders (body, content type);
    ``guard`` times its connections (``v2.connections``); ``decode`` turns infer bodies
    into arrays (on the loop unless given a pool, ``serve.decoders``)."""
    middlewares = [] if guard is None else [guard_middleware(guard)]
    if token is not None:
        middlewares.append(auth_middleware(token, served.on_refusal))
    app = web.Application(client_max_size=served.max_bytes, middlewares=middlewares)
    add_routes(app.router, _Routes(served, guard, decode))
    add = app.router
    if metrics is not None:
        render = metrics

        async def serve_metrics(request: web.Request) -> web.Response:
            body, content_type = render()
            resp = web.Response(body=body)
            resp.headers["Content-Type"] = content_type
            return resp

        add.add_get("/metrics", serve_metrics)
    return app


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, served: Served) -> None:
        self.served, self.models = served, served.models

    async def _model(self, name: str, version: str, context: Any) -> V2Model:
        model = self.served.model(name, version or VERSION)
        if isinstance(model, str):
            await context.abort(grpc.StatusCode.NOT_FOUND, model)
        assert not isinstance(model, str)
        return model

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready = request.name in self.models and request.version in ("", VERSION)
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(self.served.metadata(), service_pb2.ServerMetadataResponse())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        model = await self._model(request.name, request.version, context)
        return json_format.ParseDict(model.metadata(), service_pb2.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        model = await self._model(request.name, request.version, context)
        config = json_format.ParseDict(model.config(), model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        if request.name:
            docs = [(await self._model(request.name, request.version, context)).statistics()]
        else:
            docs = [m.statistics() for m in self.models.values()]
        return json_format.ParseDict({"model_stats": docs}, service_pb2.ModelStatisticsResponse())

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        doc = {"models": self.served.index()}
        return json_format.ParseDict(doc, service_pb2.RepositoryIndexResponse())

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        model = await self._model(request.model_name, request.model_version, context)
        try:
            rows, arrays, wanted = decode_request(model, request, self.served.max_bytes)
        except InvalidRequest as e:
            self.served.refused("invalid")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:
            outputs = await model.infer(rows, arrays)
        except InferFailed as e:
            await context.abort(_GRPC_CODE[e.kind], str(e))
        return encode_response(model, request, outputs, wanted, VERSION)


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """gRPC: every method needs metadata ``authorization: Bearer TOKEN`` (UNAUTHENTICATED
    otherwise; ``on_deny("unauthorized")`` counts it)."""

    def __init__(self, token: str, on_deny: Callable[[str], None] | None = None) -> None:
        self._expected = f"Bearer {check_token(token)}".encode()
        self._on_deny = on_deny

        async def deny(request: Any, context: Any) -> None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong bearer token; send metadata authorization: Bearer <token>",
            )

        async def deny_stream(requests: Any, context: Any) -> None:
            await deny(None, context)

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny_stream)

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        given = [v for k, v in details.invocation_metadata or () if k == "authorization"]
        if len(given) == 1 and hmac.compare_digest(str(given[0]).encode(), self._expected):
            return await continuation(details)  # two are refused: one, and only one
        if self._on_deny is not None:
            self._on_deny("unauthorized")
        return self._deny_stream if details.method.endswith("StreamInfer") else self._deny


class _Undecodable:
    """A message protobuf could not parse, handed to the call so it answers for it."""

    def __init__(self, error: DecodeError) -> None:
        self.error = " ".join(str(error).split())


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """gRPC: a request that is not a valid protobuf message of its method is answered
    INVALID_ARGUMENT, as any other bad request (grpc itself would answer UNKNOWN)."""

    def __init__(self) -> None:
        self._guarded: dict[str, Any] = {}

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        method = details.method
        if method in self._guarded:
            return self._guarded[method]
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        parse, behave = handler.request_deserializer, handler.unary_unary

        def deserialize(raw: bytes) -> Any:
            try:
                return parse(raw)
            except DecodeError as e:
                return _Undecodable(e)

        async def guarded(request: Any, context: Any) -> Any:
            if isinstance(request, _Undecodable):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the {method} request is not a valid protobuf message ({request.error}); "
                    "send the message the service defines",
                )
            return await behave(request, context)

        self._guarded[method] = grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=deserialize,
            response_serializer=handler.response_serializer,
        )
        return self._guarded[method]


async def serve_grpc(
    served: Served,
    *,
    host: str,
    port: int,
    token: str | None,
    limits: ConnectionLimits,
    tls: TlsFiles | None = None,
) -> tuple[Any, int]:
    """A started grpc.aio server, Triton's GRPCInferenceService over ``served``, on
    ``host:port`` (0: any free port), refusing messages over ``served.max_bytes`` and,
    with a ``token``, calls without it (``served.on_refusal`` counts them); (server,
    bound port). Within
    ``limits``: the handshake (HTTP/2, and TLS with ``tls``) within the header timeout,
    connections idle for the idle timeout closed, no more than the bound at once (more
    are closed at accept). A taken port is a ConfigError. A message that is not valid
    protobuf is INVALID_ARGUMENT."""
    credentials = None if tls is None else tls.grpc_credentials()
    server = grpc.aio.server(
        interceptors=[
            *([] if token is None else [TokenInterceptor(token, served.on_refusal)]),
            DecodeGuard(),
        ],
        options=[
            ("grpc.max_receive_message_length", served.max_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
            ("grpc.max_allowed_incoming_connections", limits.connection_bound()),
            ("grpc.server_handshake_timeout_ms", round(limits.header_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", round(limits.idle_timeout_s * 1000)),
        ],
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(served), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise ConfigError(f"cannot bind gRPC to {address}; is the port taken? Pick another or 0")
    await server.start()
    return server, int(bound)


class V2Listeners:
    """A v2 server's two listeners over one ``Served``: HTTP (an ``HttpListener`` serving
    the app ``app`` builds) and gRPC (``serve_grpc``), on one host with one token,
    connection limits and TLS; ``start`` then ``stop``. The fake server and the runtime
    both listen through it."""

    def __init__(
        self,
        served: Served,
        host: str,
        token: str | None,
        limits: ConnectionLimits,
        tls: TlsFiles | None,
        *,
        grace_s: float = 0.25,
        log: RequestLog | None = None,
    ) -> None:
        self.served, self.host, self.token, self.limits, self.tls = served, host, token, limits, tls
        self.grace_s = grace_s
        self.http = HttpListener(host, limits, tls, grace_s, log or request_log())
        self._grpc: Any = None

    @property
    def guard(self) -> ConnectionGuard:
        """What times the HTTP connections (for routes added to the app)."""
        return self.http.guard

    def app(
        self,
        metrics: Callable[[], tuple[bytes, str]] | None = None,
        decode: BodyDecoder = decode_inline,
    ) -> web.Application:
        """The HTTP app (``build_http_app``); more routes may be added before ``start``."""
        guard = self.http.guard
        return build_http_app(
            self.served, token=self.token, metrics=metrics, guard=guard, decode=decode
        )

    async def start(
        self,
        app: web.Application,
        http_port: int,
        grpc_port: int | None,
        front: Front | None = None,
    ) -> tuple[int, int | None]:
        """Serve ``app`` on ``http_port`` (through ``front`` when given) and, unless
        ``grpc_port`` is None, gRPC; the bound ports (0: any free one). A taken port is a
        ConfigError."""
        bound_http = await self.http.start(app, http_port, front)
        if grpc_port is None:
            return bound_http, None
        self._grpc, bound_grpc = await serve_grpc(
            self.served,
            host=self.host,
            port=grpc_port,
            token=self.token,
            limits=self.limits,
            tls=self.tls,
        )
        return bound_http, bound_grpc

    async def drain(self, timeout_s: float) -> int:
        """Take no new request on either; answer those in flight, for up to
        ``timeout_s``: the HTTP requests still unanswered then (``stop`` ends them).
        gRPC's own stop has the same grace: its calls in flight finish, new ones are
        refused."""
        grpc, self._grpc = self._grpc, None
        if grpc is None:
            return await self.http.drain(timeout_s)
        left, _ = await asyncio.gather(self.http.drain(timeout_s), grpc.stop(timeout_s))
        return left

    async def stop(self) -> None:
        """Close both (gRPC first, within the grace); safe to call twice."""
        if self._grpc is not None:
            await self._grpc.stop(self.grace_s)
            self._grpc = None
        await self.http.stop()
