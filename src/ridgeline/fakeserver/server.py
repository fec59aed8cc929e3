"""The fake inference server: HTTP (v2 + OpenAI + metrics) and gRPC on one engine.

``FakeServer`` runs on the caller's event loop (``async with FakeServer(model) as s``).
Three ways to run one elsewhere: ``serve_forever`` for the command line (until SIGINT or
SIGTERM), ``running_in_thread`` (its own event loop in a background thread, for
synchronous tests) and ``running_in_process`` (a spawned process, for benchmarks where
the server must not share the client's GIL). It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any, TypedDict, Unpack

from ridgeline.aio import AsyncService, new_event_loop, run_coroutine, serve_until_signal
from ridgeline.clock import Clock
from ridgeline.errors import RidgelineError
from ridgeline.fakeserver import openai
from ridgeline.fakeserver._fastpath import FastV2Protocol, InferCore
from ridgeline.fakeserver.engine import BatchingEngine
from ridgeline.fakeserver.llm import LlmRunner
from ridgeline.fakeserver.metrics import METRICS_CONTENT_TYPE, LlmStats, MetricsExporter
from ridgeline.fakeserver.model import SERVER_NAME, FakeModel
from ridgeline.synthetic.model import LatencyModel
from ridgeline.v2.connections import Front, GuardedConnection
from ridgeline.v2.limits import ConnectionLimits, check_port
from ridgeline.v2.security import TlsFiles
from ridgeline.v2.server import (
    DEFAULT_MAX_BODY_BYTES,
    EXTENSIONS,
    RequestLog,
    Served,
    V2Listeners,
    request_log,
)

SHUTDOWN_GRACE_S = 0.25


@dataclasses.dataclass(frozen=True, slots=True)
class ServerUrls:
    """Where a running fake server answers (what ``running_in_process`` yields)."""

    http_port: int
    grpc_port: int | None
    http_url: str
    model_url: str
    grpc_url: str | None
    metrics_url: str
    openai_url: str


class ServerOptions(TypedDict, total=False):
    """Where and how a FakeServer listens (``FakeServer``'s keyword arguments)."""

    host: str
    http_port: int
    grpc_port: int | None
    token: str | None
    max_body_bytes: int
    limits: ConnectionLimits
    tls: TlsFiles | None


class _Url:
    """A ``FakeServer`` attribute read from its ``urls()``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, server: FakeServer, owner: type | None = None) -> str:
        url = getattr(server.urls(), self.name)
        if url is None:
            raise RidgelineError("gRPC is off for this FakeServer; create it with grpc_port=0")
        return str(url)


class FakeServer(AsyncService):
    """A fake Triton/KServe server for one ``LatencyModel``; ``start()`` then ``stop()``.

    Port 0 picks a free port (read it back from ``http_port`` / ``grpc_port``);
    ``grpc_port=None`` serves HTTP only. With ``token``, every HTTP route and gRPC method
    needs ``Authorization: Bearer TOKEN``. Bodies and gRPC messages over
    ``max_body_bytes`` are refused (413 / RESOURCE_EXHAUSTED). ``limits`` time and bound
    the connections; with ``tls`` both serve TLS (https://, grpcs://).
    """

    def __init__(
        self,
        model: LatencyModel,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int | None = 0,
        token: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        limits: ConnectionLimits | None = None,
        tls: TlsFiles | None = None,
        clock: Clock | None = None,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be ≥ 1, not {max_body_bytes}")
        self.model = model
        self.host = host
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.limits = limits or ConnectionLimits()
        self.tls = tls
        check_port(http_port, "HTTP port")
        if grpc_port is not None:
            check_port(grpc_port, "gRPC port")
        self._want_http, self._want_grpc, self._clock = http_port, grpc_port, clock
        self._engine: BatchingEngine | None = None
        self._llm: LlmRunner | None = None
        self._listeners: V2Listeners | None = None
        self._http_port: int | None = None
        self._grpc_port: int | None = None

    async def start(self) -> None:
        """Bind and serve; the model's clock (stalls, warm-up) starts now."""
        if self._engine is not None:
            raise RidgelineError("this FakeServer is already started; stop() it first")
        engine = self._engine = BatchingEngine(self.model, self._clock)
        llm_stats = None if self.model.llm is None else LlmStats()
        llm = None
        if llm_stats is not None:
            llm = self._llm = LlmRunner(self.model, engine.clock, llm_stats)
            llm.start()

        def queued() -> tuple[int, int]:
            """(waiting, waiting or running): the batching engine's and the LLM engine's."""
            waiting, running = (0, 0) if llm is None else (llm.waiting, llm.running)
            return engine.queue_length + waiting, engine.pending + waiting + running

        exporter = MetricsExporter(self.model.name, engine.stats, queued, llm_stats)
        fake = FakeModel(self.model, engine)
        served = Served(
            {fake.name: fake},
            SERVER_NAME,
            self.max_body_bytes,
            extensions=(*EXTENSIONS, "openai"),
            on_refusal=engine.stats.finish,  # counted as fakeserver_requests_total's outcomes
        )
        log = request_log()
        listeners = self._listeners = V2Listeners(
            served, self.host, self.token, self.limits, self.tls, grace_s=SHUTDOWN_GRACE_S, log=log
        )
        app = listeners.app(metrics=lambda: (exporter.render(), METRICS_CONTENT_TYPE))
        openai.add_routes(app, self.model, engine, listeners.guard, llm)
        try:
            front = self._fast_path(InferCore(fake, served), log)
            self._http_port, self._grpc_port = await listeners.start(
                app, self._want_http, self._want_grpc, front
            )
        except BaseException:
            await self.stop()
            raise

    def _fast_path(self, core: InferCore, log: RequestLog) -> Front:
        """Infer requests on the fast path, the rest handed to aiohttp."""
        base = f"/v2/models/{self.model.name}"
        paths = frozenset(p.encode() for p in (f"{base}/infer", f"{base}/versions/1/infer"))

        def front(
            fallback: Callable[[], asyncio.Protocol],
        ) -> Callable[[GuardedConnection], FastV2Protocol]:
            return lambda conn: FastV2Protocol(core, paths, fallback, self.token, conn, log)

        return front

    async def stop(self) -> None:
        """Answer what is queued as rejected, close the listeners; safe to call twice."""
        if self._engine is not None:
            self._engine.close()
            await asyncio.sleep(0)  # let the fast path write the rejections
        if self._llm is not None:
            await self._llm.close()
            self._llm = None
        if self._listeners is not None:
            await self._listeners.stop()
            self._listeners = None
        self._engine = None

    @property
    def engine(self) -> BatchingEngine:
        if self._engine is None:
            raise RidgelineError("the FakeServer is not running; call start() first")
        return self._engine

    @property
    def http_port(self) -> int:
        if self._http_port is None:
            raise RidgelineError("the FakeServer has not started; call start() first")
        return self._http_port

    @property
    def grpc_port(self) -> int:
        if self._want_grpc is None:
            raise RidgelineError("gRPC is off for this FakeServer; create it with grpc_port=0")
        if self._grpc_port is None:
            raise RidgelineError("the FakeServer has not started; call start() first")
        return self._grpc_port

    http_url = _Url()
    model_url = _Url()
    grpc_url = _Url()
    metrics_url = _Url()
    openai_url = _Url()

    def urls(self) -> ServerUrls:
        """Where it answers (gRPC's port and URL None when gRPC is off)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        http = f"{'http' if self.tls is None else 'https'}://{host}:{self.http_port}"
        grpc_port = None if self._want_grpc is None else self.grpc_port
        grpc = f"{'grpc' if self.tls is None else 'grpcs'}://{host}:{grpc_port}/{self.model.name}"
        return ServerUrls(
            http_port=self.http_port,
            grpc_port=grpc_port,
            http_url=http,
            model_url=f"{http}/v2/models/{self.model.name}",
            grpc_url=None if grpc_port is None else grpc,
            metrics_url=f"{http}/metrics",
            openai_url=f"{http}/v1",
        )


def describe_urls(urls: ServerUrls) -> str:
    """A few lines telling a person where the server answers."""
    lines = [f"fake server: v2 HTTP  {urls.model_url}"]
    if urls.grpc_url is not None:
        lines.append(f"             v2 gRPC  {urls.grpc_url}")
    lines.append(f"             OpenAI   {urls.openai_url}")
    lines.append(f"             metrics  {urls.metrics_url}")
    return "\n".join(lines)


def serve_forever(
    model: LatencyModel,
    announce: Callable[[str], None] = print,
    **options: Unpack[ServerOptions],
) -> None:
    """Serve ``model`` until SIGINT or SIGTERM (HTTP on port 8000 and gRPC on 8001 unless
    ``options`` say otherwise); ``announce`` the URLs once bound."""
    where: ServerOptions = {"http_port": 8000, "grpc_port": 8001}
    where.update(options)
    serve_until_signal(
        lambda: FakeServer(model, **where),
        lambda server: announce(describe_urls(server.urls())),
    )


@contextlib.contextmanager
def running_in_thread(
    model: LatencyModel, **options: Unpack[ServerOptions]
) -> Iterator[FakeServer]:
    """Run a FakeServer on its own event loop (uvloop when installed) in a daemon
    thread; yield it started, stop it on exit."""
    loop = new_event_loop()
    thread = threading.Thread(
        target=_run_loop, args=(loop,), name=f"fakeserver-{model.name}", daemon=True
    )
    thread.start()
    server = FakeServer(model, **options)
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result()
        yield server
    finally:
        try:
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()
    loop.run_until_complete(loop.shutdown_asyncgens())


@contextlib.contextmanager
def running_in_process(
    model: LatencyModel, start_timeout_s: float = 60.0, **options: Unpack[ServerOptions]
) -> Iterator[ServerUrls]:
    """Run a FakeServer in a spawned process; yield its URLs, stop it on exit."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(
        target=_child_main,
        args=(model.model_dump(mode="json"), dict(options), theirs),
        name=f"fakeserver-{model.name}",
        daemon=True,
    )
    proc.start()
    theirs.close()
    try:
        if not ours.poll(start_timeout_s):
            raise RidgelineError(f"the fake server process did not start in {start_timeout_s} s")
        try:
            kind, payload = ours.recv()
        except EOFError:
            kind, payload = "error", f"it exited with code {proc.exitcode}"
        if kind != "ok":
            raise RidgelineError(f"the fake server process failed to start: {payload}")
        yield ServerUrls(**payload)
    finally:
        with contextlib.suppress(OSError):
            ours.send("stop")
        proc.join(10.0)
        if proc.is_alive():
            proc.terminate()
            proc.join()
        ours.close()


def _child_main(model_doc: dict[str, Any], options: dict[str, Any], conn: Connection) -> None:
    async def main() -> None:
        server = FakeServer(LatencyModel.model_validate(model_doc), **options)
        try:
            await server.start()
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))
            return
        try:
            conn.send(("ok", dataclasses.asdict(server.urls())))
            with contextlib.suppress(EOFError, OSError):
                await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        finally:
            await server.stop()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C stops us via the pipe
    run_coroutine(main())
