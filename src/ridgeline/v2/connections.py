"""Every HTTP connection a v2 server holds, timed and bounded (``ConnectionLimits``).

``HttpListener`` serves an aiohttp app on a socket whose connections each pass through a
``GuardedConnection`` in front of the protocol that serves them (aiohttp's, or the fake
server's fast path). A connection is in one of four states, each with its own deadline:

- ``IDLE``: no request in progress (a new connection too); closed after the idle timeout;
- ``HEADERS``: a request's first bytes came; its headers must follow within the header
  timeout, else 408 and close (a slow-loris);
- ``BODY``: the headers came; the body must follow within the body timeout, else 408;
- ``BUSY``: the request is whole and being served: no deadline (the server's own work).

The serving protocol says when a request moves on: the fast path itself; aiohttp
through ``guard_middleware`` (its handler started: ``BODY``; it returned: ``IDLE``) and
``read_body`` (the body is in: ``BUSY``). One sweep per server closes what is overdue.
At the bound, a new connection closes the longest-idle one (else the one longest in its
headers), or, none being either, is answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
from aiohttp import web

from ridgeline.errors import ConfigError
from ridgeline.v2.http_codec import Answer, error_answer
from ridgeline.v2.limits import ConnectionLimits
from ridgeline.v2.security import TlsFiles


class State(enum.Enum):
    IDLE = "idle"
    HEADERS = "headers"
    BODY = "body"
    BUSY = "busy"


def _raw_answer(status: int, reason: str, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedConnection(asyncio.Protocol):
    """One client connection: its state and since when (in sweeps of its guard), in front
    of the protocol serving it (made by ``inner(self)``; ``replace`` hands it on). A
    state change is two attribute writes: the hot path pays no clock, no timer."""

    __slots__ = ("_fresh", "_guard", "_make", "inner", "since", "stalled", "state", "transport")

    def __init__(
        self, guard: ConnectionGuard, inner: Callable[[GuardedConnection], asyncio.Protocol]
    ) -> None:
        self._guard = guard
        self._make = inner
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.state = State.IDLE
        self.since = guard.sweeps
        self._fresh = False
        """Bytes came while a request was served: the next one may have begun."""
        self.stalled: int | None = None
        """The sweep since which the client has not read what it was sent (its transport
        paused writing: a stream nobody reads), or None."""

    @property
    def guard(self) -> ConnectionGuard:
        return self._guard

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if not self._guard.admit(self):
            return
        self.inner = self._make(self)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.state is State.IDLE:
            self.state, self.since = State.HEADERS, self._guard.sweeps
        elif self.state is not State.HEADERS:
            self._fresh = True
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.inner is None else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.stalled = self._guard.sweeps
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.stalled = None
        if self.inner is not None:
            self.inner.resume_writing()

    # what the serving protocol tells
    def headers_in(self) -> None:
        """The request's headers came; its body is due."""
        self.state, self.since = State.BODY, self._guard.sweeps

    def body_in(self) -> None:
        """The request is whole; it is being served."""
        self.state = State.BUSY

    def heading(self) -> None:
        """A request has begun; its headers are not all in."""
        self._fresh = False
        self.state, self.since = State.HEADERS, self._guard.sweeps
        if self._guard.draining:
            self._guard.drained_one(self)

    def idle(self) -> None:
        """Nothing is left to answer, and no next request has begun."""
        self._fresh = False
        self.state, self.since = State.IDLE, self._guard.sweeps
        if self._guard.draining:
            self._guard.drained_one(self)

    def answered(self) -> None:
        """Nothing is left to answer; bytes that came meanwhile began the next request."""
        if self._fresh:
            self.heading()
        else:
            self.idle()

    def replace(self, protocol: asyncio.Protocol, replay: bytes) -> None:
        """Hand the connection to ``protocol``, replaying ``replay`` into it."""
        self.inner = protocol
        protocol.connection_made(cast(asyncio.BaseTransport, self.transport))
        protocol.data_received(replay)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def refuse(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` with ``message`` and close."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_raw_answer(status, reason, message))
            self.transport.close()


class ConnectionGuard:
    """The connections of one HTTP server: admitted up to the bound, swept for deadlines.

    The sweep runs every ``tick_s`` (a quarter of the shortest timeout, 10 ms to 1 s) and
    counts ``sweeps``; a connection in a state since sweep k is closed at the first sweep
    m with (m - k - 1)·tick ≥ the state's timeout: after at least the timeout, and
    within one tick (and the loop's lateness) of it."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.bound = limits.connection_bound()
        timeouts = {
            State.IDLE: limits.idle_timeout_s,
            State.HEADERS: limits.header_timeout_s,
            State.BODY: limits.body_timeout_s,
        }
        self.tick_s = min(max(min(timeouts.values()) / 4, 0.01), 1.0)
        self._sweeps_allowed = {s: math.ceil(t / self.tick_s) + 1 for s, t in timeouts.items()}
        self.sweeps = 0
        self._conns: dict[GuardedConnection, None] = {}
        self._by_transport: dict[object, GuardedConnection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.body_bytes = 0
        """Bytes of request bodies held now (``hold``, ``let_go``)."""
        self.draining = False
        """``drain`` has begun: answers go out with ``Connection: close``."""
        self._quiet: asyncio.Event | None = None

    async def drain(self, timeout_s: float) -> int:
        """Close every connection with no request in progress now, and each other one as
        its request is answered, for up to ``timeout_s``: how many were still serving
        then (``close`` ends them). The listening socket is closed by the caller first."""
        self.draining = True
        self._quiet = asyncio.Event()
        for conn in list(self._conns):
            if conn.state in (State.IDLE, State.HEADERS):
                conn.close()
        if not self._serving():
            return 0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._quiet.wait(), timeout_s)
        return len(self._serving())

    def drained_one(self, conn: GuardedConnection) -> None:
        """``conn`` answered its request while draining (its protocol closes it once the
        answer is out: no keep-alive while draining)."""
        if self._quiet is not None and not self._serving():
            self._quiet.set()

    def _serving(self) -> list[GuardedConnection]:
        return [c for c in self._conns if c.state in (State.BODY, State.BUSY)]

    def hold(self, n: int) -> bool:
        """Count ``n`` more bytes of bodies held, unless that passes the bound (then
        False: the request is refused 503). A body alone larger than the bound still
        comes when nothing else is held (``max_body`` bounds it on its own)."""
        if self.body_bytes and self.body_bytes + n > self.limits.max_body_bytes_in_flight:
            return False
        self.body_bytes += n
        return True

    def let_go(self, n: int) -> None:
        """``n`` bytes ``hold`` counted are no longer held."""
        self.body_bytes = max(0, self.body_bytes - n)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def protocol(
        self, inner: Callable[[GuardedConnection], asyncio.Protocol]
    ) -> Callable[[], GuardedConnection]:
        """The protocol factory for ``create_server``: each connection guarded."""
        return lambda: GuardedConnection(self, inner)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sweeper = self._loop.call_later(self.tick_s, self._sweep)

    def close(self) -> None:
        """Stop sweeping and close every connection."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._conns):
            conn.close()

    def connection_of(self, transport: object) -> GuardedConnection | None:
        return self._by_transport.get(transport)

    # the connections' life
    def admit(self, conn: GuardedConnection) -> bool:
        if len(self._conns) >= self.bound:
            victim = self._victim()
            if victim is None:
                conn.refuse(
                    503,
                    "Service Unavailable",
                    f"the server holds its bound of {self.bound} connections, none idle; "
                    "retry shortly (or raise the server's --max-connections)",
                )
                return False
            self._evict(victim)
            self.forget(victim)
        self._conns[conn] = None
        self._by_transport[conn.transport] = conn
        return True

    def _victim(self) -> GuardedConnection | None:
        """The connection idle longest, else the one longest in its headers, else the
        one longest in its body (a body dribbled), else the one longest not reading its
        answer (a stream it does not read): a scan, only at the bound (the hot path keeps
        no order). Only a connection being served and read from is never taken: before,
        slow bodies and unread streams locked new clients out for their timeouts."""
        for state in (State.IDLE, State.HEADERS, State.BODY):
            waiting = [c for c in self._conns if c.state is state]
            if waiting:
                return min(waiting, key=lambda c: c.since)
        unread = [c for c in self._conns if c.stalled is not None]
        return min(unread, key=lambda c: c.stalled or 0) if unread else None

    def forget(self, conn: GuardedConnection) -> None:
        self._conns.pop(conn, None)
        self._by_transport.pop(conn.transport, None)
        if self.draining:  # a client gone mid-request: nothing left to wait for there
            self.drained_one(conn)

    # deadlines
    def _sweep(self) -> None:
        assert self._loop is not None
        self.sweeps = now = self.sweeps + 1
        allowed = self._sweeps_allowed
        for conn in list(self._conns):
            if conn.state is not State.BUSY and now - conn.since >= allowed[conn.state]:
                self._expire(conn)
        self._sweeper = self._loop.call_later(self.tick_s, self._sweep)

    def _evict(self, conn: GuardedConnection) -> None:
        """``conn`` closed to make room at the bound: a request mid-body is told why."""
        if conn.state is State.BODY:
            seconds = (self.sweeps - conn.since) * self.tick_s
            conn.refuse(
                503,
                "Service Unavailable",
                f"the server is at its bound of {self.bound} connections and this one's "
                f"body was the slowest (still coming after {seconds:.1f} s): send bodies at "
                "once (or raise the server's --max-connections)",
            )
        elif conn.state is State.BUSY:
            conn.close()  # its client was not reading its answer
        else:
            self._expire(conn)

    def _expire(self, conn: GuardedConnection) -> None:
        limits = self.limits
        if conn.state is State.HEADERS:
            conn.refuse(
                408,
                "Request Timeout",
                f"the request's headers did not all come within {limits.header_timeout_s:g} s "
                "of its first byte; send them at once (or raise the server's --header-timeout)",
            )
        elif conn.state is State.BODY:
            conn.refuse(
                408,
                "Request Timeout",
                f"the request's body did not all come within {limits.body_timeout_s:g} s of "
                "its headers; send it at once (or raise the server's --body-timeout)",
            )
        else:
            conn.close()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard_middleware(guard: ConnectionGuard) -> Any:
    """aiohttp middleware (put it first): a handler's start and end move its connection on."""

    @web.middleware
    async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = guard.connection_of(request.transport)
        if conn is None:
            return await handler(request)
        conn.headers_in()
        try:
            response = await handler(request)
            if guard.draining:
                response.force_close()  # the server is stopping: no next request here
            return response
        finally:
            guard.let_go(request.get(HELD, 0))
            conn.answered()

    return track


def body_in(request: web.Request, guard: ConnectionGuard | None) -> None:
    """Tell ``guard`` that ``request``'s body is in (its connection is being served)."""
    conn = None if guard is None else guard.connection_of(request.transport)
    if conn is not None:
        conn.body_in()


async def read_body(
    request: web.Request, max_body: int, guard: ConnectionGuard | None
) -> bytes | Answer:
    """The request's body, or the answer refusing it: 413 over ``max_body`` bytes, 408
    when the guard closed the connection for a body too slow."""
    too_large = error_answer(f"request body over the server's bound of {max_body} bytes", 413)
    length = request.content_length
    if length is not None and length > max_body:
        return too_large
    if (refused := held_for(request, guard, max_body)) is not None:
        return refused
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return too_large
    except ConnectionError:  # closed by the body timeout: nobody is left to answer
        return error_answer("the request's body came too slowly", 408)
    body_in(request, guard)
    return body


HELD = web.RequestKey("ridgeline.body_bytes_held", int)
"""The request's key for the body bytes its guard holds for it (``guard_middleware``
lets them go when the handler returns)."""


def held_for(request: web.Request, guard: ConnectionGuard | None, max_body: int) -> Answer | None:
    """Hold ``request``'s body bytes (its Content-Length, else ``max_body``) on
    ``guard``'s budget: None, or the 503 answer when the bodies in flight leave no room."""
    conn = None if guard is None else guard.connection_of(request.transport)
    if guard is None or conn is None:
        return None
    length = request.content_length
    n = max_body if length is None else length
    if not guard.hold(n):
        bound = guard.limits.max_body_bytes_in_flight
        return error_answer(
            f"the server holds {guard.body_bytes:,} bytes of request bodies in flight, and "
            f"this one's {n:,} would pass its bound of {bound:,} "
            "(--max-body-bytes-in-flight); retry, or send smaller requests",
            503,
        )
    request[HELD] = n
    return None


Front = Callable[[Callable[[], asyncio.Protocol]], Callable[[GuardedConnection], asyncio.Protocol]]
"""Given aiohttp's protocol factory, the protocol serving each guarded connection."""


class HttpListener:
    """An aiohttp app served on ``host:port`` behind a ``ConnectionGuard`` (``guard``: give
    it to the app's middleware), TLS with ``tls``, aiohttp logging to ``log``: ``start``
    then ``stop``."""

    def __init__(
        self,
        host: str,
        limits: ConnectionLimits,
        tls: TlsFiles | None,
        shutdown_s: float,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.host, self.limits, self.tls, self.shutdown_s = host, limits, tls, shutdown_s
        self.log = log
        self.guard = ConnectionGuard(limits)
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None

    async def start(self, app: web.Application, port: int, front: Front | None = None) -> int:
        """Serve ``app`` (through ``front`` when given); the bound port. A taken port is a
        ConfigError."""
        runner = self._runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=self.shutdown_s, logger=self.log
        )
        await runner.setup()
        assert runner.server is not None
        aiohttp_protocol = runner.server
        inner = front(aiohttp_protocol) if front else (lambda conn: aiohttp_protocol())
        extra: dict[str, Any] = {}
        if self.tls is not None:
            extra = {
                "ssl": self.tls.server_context(),
                "ssl_handshake_timeout": self.limits.header_timeout_s,
            }
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                self.guard.protocol(inner), self.host, port, backlog=1024, **extra
            )
        except OSError as e:
            raise ConfigError(
                f"cannot bind HTTP to {self.host}:{port}: {e.strerror}; pick another port "
                "(--port), or 0 for any free one"
            ) from e
        self.guard.start()
        return int(self._server.sockets[0].getsockname()[1])

    async def drain(self, timeout_s: float) -> int:
        """Stop accepting, then close each connection once its request is answered, for
        up to ``timeout_s``: the requests still unanswered then (``stop`` closes them)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        return await self.guard.drain(timeout_s)

    async def stop(self) -> None:
        """Close the socket and every connection; safe to call twice. After ``drain``,
        aiohttp finishes writing the answers its handlers returned before the
        connections close."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.guard.draining and self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.guard.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
