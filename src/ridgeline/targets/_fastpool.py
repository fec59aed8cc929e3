"""A lean HTTP/1.1 keep-alive connection pool for the load generator's hot path.

Each request is prepared once as bytes (request line, headers, body) and written to an
idle pooled connection; the answer is parsed by httptools (llhttp, the parser behind
uvicorn). One request per connection at a time, no pipelining, as a client would. This
is several times cheaper per request than a general-purpose client, which matters when
the generator's own cost decides the highest rate it can hold on time. Connect checks,
redirects and proxies stay with aiohttp; this pool only sends prepared requests.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from ridgeline.errors import ConfigError


class ConnectionClosed(ConnectionError):
    """The server closed the connection before the whole answer came."""


class _Connection(asyncio.Protocol):
    def __init__(self, pool: Http1Pool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._parts: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.alive = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionClosed("the server closed the connection"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self._parts.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        body = b"".join(self._parts)
        self._parts.clear()
        if not self._parser.should_keep_alive():
            self.close()
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result((status, body))

    def _fail(self, exc: Exception) -> None:
        self.close()
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_exception(exc)

    def close(self) -> None:
        if self.alive:
            self.alive = False
            self._pool._forget()
        if self.transport is not None:
            self.transport.close()


class Http1Pool:
    """Up to ``max_connections`` keep-alive connections to one ``scheme://host:port``
    (https: verified with ``tls``, or the system's CAs)."""

    def __init__(self, url: str, max_connections: int, tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{url!r} is not an http(s):// URL with a host")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.netloc = parts.netloc
        https = parts.scheme == "https"
        self._ssl = (tls or ssl.create_default_context()) if https else None
        self._max = max(1, max_connections)
        self._idle: list[_Connection] = []
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._open = 0
        self._closed = False

    def prepare(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes = b""
    ) -> bytes:
        """The whole request as bytes, to pass to ``request`` as often as wanted."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.netloc}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "host"]
        if body or method not in ("GET", "HEAD"):
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send a prepared request; return (status, body). Raises ConnectionError on a
        broken connection; a cancelled request closes its connection."""
        conn = await self._acquire()
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        conn.waiter = fut
        conn.transport.write(raw)  # type: ignore[union-attr]  # set on connection_made
        try:
            result = await fut
        except BaseException:
            conn.close()
            raise
        self._release(conn)
        return result

    async def _acquire(self) -> _Connection:
        while True:
            if self._closed:
                raise ConnectionClosed("the connection pool is closed")
            while self._idle:
                conn = self._idle.pop()
                if conn.alive:
                    return conn
            if self._open < self._max:
                self._open += 1
                try:
                    _, proto = await asyncio.get_running_loop().create_connection(
                        lambda: _Connection(self), self.host, self.port, ssl=self._ssl
                    )
                except BaseException:
                    self._forget()
                    raise
                return proto
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()

    def _release(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
        elif conn.alive:
            self._idle.append(conn)
        self._wake()

    def _forget(self) -> None:
        self._open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    async def close(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.cancel()
